//! Every kernel module the backend can ask for compiles with NVRTC for Hopper (`sm_90a`) and
//! for an older architecture (`sm_80`), and ptxas serialises no warpgroup MMA (it says so in
//! the log when, say, a wait leaves the branch that issued its group; the kernel then runs,
//! several times slower). Needs only libnvrtc, no GPU: CI installs the `nvidia-cuda-nvrtc`
//! wheel and sets `AKUNU_REQUIRE_NVRTC=1`, so the test cannot pass by skipping there.

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
    let dir = tempfile_dir();
    std::env::set_var("AKUNU_KERNEL_CACHE", &dir);
    let modules = akunu_cuda::all_modules();
    assert!(modules.len() >= 10, "only {} modules listed", modules.len());
    // AKUNU_NVRTC_ONLY=flash.cu compiles one source's modules while working on it.
    let only = std::env::var("AKUNU_NVRTC_ONLY").ok();
    let mut failures = Vec::new();
    for arch in ["sm_90a", "sm_80"] {
        for (file, defines) in &modules {
            if only.as_deref().is_some_and(|o| o != *file) {
                continue;
            }
            let key = ModuleKey::new(file, arch, defines);
            match compile::compile(&key) {
                Ok(c) => {
                    assert!(!c.image.is_empty());
                    if c.log
                        .contains("wgmma.mma_async instructions are serialized")
                    {
                        failures.push(format!("{arch} {file} {defines:?}: {}", c.log));
                    }
                }
                Err(e) => failures.push(format!("{arch} {file} {defines:?}: {e}")),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("akunu-nvrtc-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
