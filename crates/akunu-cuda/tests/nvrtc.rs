//! Every kernel module the backend can ask for compiles with NVRTC for Hopper (`sm_90a`) and
//! for an older architecture (`sm_80`), several at once as a backend's first start compiles
//! them, and ptxas serialises no warpgroup MMA (it says so in the log when, say, a wait leaves
//! the branch that issued its group; the kernel then runs, several times slower). Needs only
//! libnvrtc, no GPU: CI installs the `nvidia-cuda-nvrtc` wheel and sets
//! `AKUNU_REQUIRE_NVRTC=1`, so the test cannot pass by skipping there.
//!
//! `AKUNU_NVRTC_KEEP=DIR` (a new or empty directory) compiles into DIR and keeps the cubins,
//! with `modules.txt` naming each one's source, architecture and defines, for
//! `scripts/gpu/sass.sh` to read their registers, spills and SASS without a GPU.

use akunu_cuda::compile::{self, ModuleKey};

#[test]
fn every_kernel_module_compiles() {
    if !compile::nvrtc_present() {
        assert!(
            std::env::var("AKUNU_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "AKUNU_REQUIRE_NVRTC=1 but libnvrtc cannot be loaded"
        );
        eprintln!("skipped: libnvrtc cannot be loaded");
        return;
    }
    let keep = std::env::var_os("AKUNU_NVRTC_KEEP").map(std::path::PathBuf::from);
    let dir = match &keep {
        Some(d) => {
            std::fs::create_dir_all(d).unwrap();
            let used = std::fs::read_dir(d).unwrap().next().is_some();
            assert!(!used, "AKUNU_NVRTC_KEEP={}: not empty", d.display());
            d.clone()
        }
        None => tempfile_dir(),
    };
    std::env::set_var("AKUNU_KERNEL_CACHE", &dir);
    let modules = akunu_cuda::all_modules();
    assert!(modules.len() >= 10, "only {} modules listed", modules.len());
    // AKUNU_NVRTC_ONLY=flash.cu compiles one source's modules while working on it.
    let only = std::env::var("AKUNU_NVRTC_ONLY").ok();
    let mut keys = Vec::new();
    for arch in ["sm_90a", "sm_80"] {
        for (file, defines) in &modules {
            if only.as_deref().is_none_or(|o| o == *file) {
                keys.push(ModuleKey::new(file, arch, defines));
            }
        }
    }
    // Together, as a backend compiles them: several NVRTC programs at once.
    let mut failures = Vec::new();
    for (key, result) in keys.iter().zip(compile::compile_many(&keys)) {
        let what = format!("{} {} {:?}", key.arch, key.file, key.defines);
        match result {
            Ok(c) => {
                assert!(!c.image.is_empty() && !c.cached, "{what}");
                if c.log
                    .contains("wgmma.mma_async instructions are serialized")
                {
                    failures.push(format!("{what}: {}", c.log));
                }
            }
            Err(e) => failures.push(format!("{what}: {e}")),
        }
    }
    // A module that failed is not cached either: say why first.
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // A second pass finds every module in the cache.
    for key in &keys {
        assert!(
            compile::is_cached(key),
            "{} {} not cached",
            key.arch,
            key.file
        );
    }
    if keep.is_some() {
        let manifest: String = keys
            .iter()
            .map(|k| {
                let path = compile::cache_path(k)
                    .unwrap()
                    .expect("a cache directory is set");
                let defines: Vec<String> =
                    k.defines.iter().map(|(n, v)| format!("{n}={v}")).collect();
                let name = path.file_name().unwrap().to_string_lossy();
                format!("{name}\t{}\t{}\n", k.arch, defines.join(" "))
            })
            .collect();
        std::fs::write(dir.join("modules.txt"), manifest).unwrap();
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("akunu-nvrtc-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
