//! Kernel sources, NVRTC compilation and the on-disk cache of compiled modules.
//!
//! Plan: every `kernels/*.cu` file is embedded in the binary. A source's `#include "x.cuh"`
//! lines are replaced by the header's text (headers are embedded too), so one string, hashed
//! with the architecture and the `-D` defines, names the compiled module. NVRTC turns it into a
//! cubin for the running GPU (`sm_90a` on Hopper); the cubin is kept under the cache directory
//! (`$AKUNU_KERNEL_CACHE`, else `$XDG_CACHE_HOME/akunu/kernels`, else `~/.cache/akunu/kernels`)
//! so a second start loads it in microseconds. A cache that cannot be written only costs the
//! compile time again. `$AKUNU_KERNEL_DIR` replaces the embedded sources with a directory's
//! files, for kernel work without a rebuild. A backend knows every module it will ask for
//! before it asks ([`ModuleSpec`] lists), so a first start compiles them together, one NVRTC
//! program per thread ([`compile_many`]; NVRTC allows concurrent calls on distinct programs;
//! `$AKUNU_COMPILE_THREADS` bounds the threads, each of which may take ~300 MB).

use std::borrow::Cow;
use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::CudaError;

/// Kernel sources and the headers they include, by file name.
pub const SOURCES: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../kernels/common.cuh")),
    ("quant.cuh", include_str!("../kernels/quant.cuh")),
    ("mma.cuh", include_str!("../kernels/mma.cuh")),
    ("actq.cuh", include_str!("../kernels/actq.cuh")),
    ("chain.cuh", include_str!("../kernels/chain.cuh")),
    ("rope.cuh", include_str!("../kernels/rope.cuh")),
    ("wgmma.cuh", include_str!("../kernels/wgmma.cuh")),
    ("embed.cu", include_str!("../kernels/embed.cu")),
    ("gemv.cu", include_str!("../kernels/gemv.cu")),
    ("gemm.cu", include_str!("../kernels/gemm.cu")),
    ("norm.cu", include_str!("../kernels/norm.cu")),
    ("rope.cu", include_str!("../kernels/rope.cu")),
    ("attention.cu", include_str!("../kernels/attention.cu")),
    ("elementwise.cu", include_str!("../kernels/elementwise.cu")),
    ("sample.cu", include_str!("../kernels/sample.cu")),
    ("flash.cu", include_str!("../kernels/flash.cu")),
];

/// A kernel source by file name: embedded, or read from `$AKUNU_KERNEL_DIR` when that is set,
/// so kernels can be edited and timed without rebuilding the binary (the module cache is keyed
/// by the source text, so an edited kernel never meets a stale cubin).
fn source(name: &str) -> Result<Cow<'static, str>, CudaError> {
    match std::env::var_os("AKUNU_KERNEL_DIR") {
        Some(dir) => source_in(Path::new(&dir), name).map(Cow::Owned),
        None => SOURCES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| Cow::Borrowed(*s))
            .ok_or_else(|| CudaError::Compile {
                file: name.into(),
                log: "no such kernel source".into(),
            }),
    }
}

fn source_in(dir: &Path, name: &str) -> Result<String, CudaError> {
    let path = dir.join(name);
    std::fs::read_to_string(&path).map_err(|e| CudaError::Compile {
        file: name.into(),
        log: format!("AKUNU_KERNEL_DIR: cannot read {}: {e}", path.display()),
    })
}

/// The source with its `#include "..."` lines replaced by the headers, each header once.
pub fn expand(name: &str) -> Result<String, CudaError> {
    let mut out = String::new();
    let mut seen = Vec::new();
    expand_into(name, &mut out, &mut seen)?;
    Ok(out)
}

fn expand_into(name: &str, out: &mut String, seen: &mut Vec<String>) -> Result<(), CudaError> {
    if seen.iter().any(|s| s == name) {
        return Ok(());
    }
    seen.push(name.to_string());
    let text = source(name)?;
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("#include \"") {
            let header = rest.split('"').next().unwrap_or_default();
            expand_into(header, out, seen)?;
        } else if t == "#pragma once" {
            continue;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    Ok(())
}

/// A kernel module before the architecture is known: its source file and `-D` defines.
pub type ModuleSpec = (&'static str, Vec<(&'static str, String)>);

/// What one compiled module is specialised for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModuleKey {
    pub file: String,
    /// `sm_90a`, `sm_89`, ...
    pub arch: String,
    /// `-D` defines, sorted so the key does not depend on their order.
    pub defines: Vec<(String, String)>,
}

impl ModuleKey {
    pub fn new(file: &str, arch: &str, defines: &[(&str, String)]) -> ModuleKey {
        let mut defines: Vec<(String, String)> = defines
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        defines.sort();
        ModuleKey {
            file: file.into(),
            arch: arch.into(),
            defines,
        }
    }

    fn options(&self) -> Vec<String> {
        let mut o = vec![
            format!("--gpu-architecture={}", self.arch),
            "--std=c++17".into(),
            "--use_fast_math".into(),
            "--fmad=true".into(),
            "-default-device".into(),
        ];
        if std::env::var("AKUNU_KERNEL_LINEINFO").is_ok() {
            o.push("--generate-line-info".into());
        }
        for (k, v) in &self.defines {
            o.push(format!("-D{k}={v}"));
        }
        o
    }

    fn digest(&self, src: &str, options: &[String]) -> String {
        let mut h = Sha256::new();
        h.update(src.as_bytes());
        for o in options {
            h.update([0u8]);
            h.update(o.as_bytes());
        }
        h.update(nvrtc_version().as_bytes());
        let d = h.finalize();
        d.iter().take(16).map(|b| format!("{b:02x}")).collect()
    }
}

/// The NVRTC version, `"13.0"`, or `"?"` when it cannot be asked.
pub fn nvrtc_version() -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: callers have checked that libnvrtc loads; the out-pointers are valid.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        format!("{major}.{minor}")
    } else {
        "?".into()
    }
}

/// Whether libnvrtc can be loaded (without which nothing compiles).
pub fn nvrtc_present() -> bool {
    // SAFETY: only probes for the shared library; loads nothing else.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The directory compiled modules are kept in, if any.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("AKUNU_KERNEL_CACHE") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("akunu").join("kernels"))
}

/// A compiled module: a cubin for a real architecture.
pub struct Compiled {
    pub image: Vec<u8>,
    /// Whether it came from the disk cache.
    pub cached: bool,
    /// NVRTC's log of a successful compile: ptxas notes such as wgmma serialisation (empty
    /// when cached).
    pub log: String,
}

/// Where `key`'s cubin is kept (None without a cache directory), with the expanded source and
/// the options that name it.
fn cache_entry(key: &ModuleKey) -> Result<(Option<PathBuf>, String, Vec<String>), CudaError> {
    let src = expand(&key.file)?;
    let options = key.options();
    let digest = key.digest(&src, &options);
    let stem = key.file.trim_end_matches(".cu");
    let path = cache_dir().map(|d| d.join(format!("{stem}-{}-{digest}.cubin", key.arch)));
    Ok((path, src, options))
}

/// The file that keeps `key`'s cubin in the disk cache (None without a cache directory).
pub fn cache_path(key: &ModuleKey) -> Result<Option<PathBuf>, CudaError> {
    cache_entry(key).map(|(path, _, _)| path)
}

/// Whether `key`'s module is in the disk cache, so [`compile`] would only read it.
pub fn is_cached(key: &ModuleKey) -> bool {
    nvrtc_present()
        && matches!(cache_entry(key), Ok((Some(p), _, _)) if p.metadata().is_ok_and(|m| m.len() > 0))
}

/// Compiles (or loads from the cache) the module for `key`.
pub fn compile(key: &ModuleKey) -> Result<Compiled, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::NoNvrtc);
    }
    let (path, src, options) = cache_entry(key)?;
    if let Some(p) = &path {
        if let Ok(image) = std::fs::read(p) {
            if !image.is_empty() {
                return Ok(Compiled {
                    image,
                    cached: true,
                    log: String::new(),
                });
            }
        }
    }
    let (image, log) = nvrtc_cubin(&key.file, &src, &options)?;
    if let Some(p) = &path {
        store(p, &image);
    }
    Ok(Compiled {
        image,
        cached: false,
        log,
    })
}

/// Writes a cubin into the cache through a file of its own name, renamed into place, so
/// readers (other threads or processes compiling the same module) never see half of one. A
/// cache that cannot be written only costs the compile again next time.
fn store(path: &Path, image: &[u8]) {
    static WRITES: AtomicUsize = AtomicUsize::new(0);
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let n = WRITES.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    if std::fs::write(&tmp, image).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Most NVRTC programs compiled at once by default: each takes up to ~300 MB of memory.
const MAX_COMPILE_THREADS: usize = 8;

/// How many modules [`compile_many`] compiles at once: `$AKUNU_COMPILE_THREADS` when set to a
/// positive number, else a thread per core up to `MAX_COMPILE_THREADS`.
fn compile_threads() -> usize {
    std::env::var("AKUNU_COMPILE_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(MAX_COMPILE_THREADS)
        })
}

/// [`compile`] for every key, several at once (`$AKUNU_COMPILE_THREADS`, else a thread per core
/// up to eight), the largest sources first so the longest compiles start at once. The results
/// are in the order of `keys`.
pub fn compile_many(keys: &[ModuleKey]) -> Vec<Result<Compiled, CudaError>> {
    let threads = compile_threads().min(keys.len());
    let mut order: Vec<(usize, usize)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (expand(&k.file).map_or(0, |s| s.len()), i))
        .collect();
    order.sort_by(|a, b| b.cmp(a));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Compiled, CudaError>>>> =
        Mutex::new(keys.iter().map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while let Some(&(_, i)) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let r = compile(&keys[i]);
                    results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.expect("every key is taken by a thread"))
        .collect()
}

/// The cubin and the compile's log.
fn nvrtc_cubin(file: &str, src: &str, options: &[String]) -> Result<(Vec<u8>, String), CudaError> {
    use cudarc::nvrtc::sys;
    let err = |log: String| CudaError::Compile {
        file: file.into(),
        log,
    };
    let c_src = CString::new(src).map_err(|_| err("source contains a NUL byte".into()))?;
    let c_name = CString::new(file).map_err(|_| err("bad file name".into()))?;
    let c_opts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<Result<_, _>>()
        .map_err(|_| err("option contains a NUL byte".into()))?;
    let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    let ok = sys::nvrtcResult::NVRTC_SUCCESS;
    // SAFETY: every pointer is a live NUL-terminated string for the duration of the calls,
    // and the program is destroyed on every path below.
    unsafe {
        let r = sys::nvrtcCreateProgram(
            &mut prog,
            c_src.as_ptr(),
            c_name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        if r != ok {
            return Err(err(format!("nvrtcCreateProgram: {r:?}")));
        }
        let r = sys::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr());
        let mut n = 0usize;
        sys::nvrtcGetProgramLogSize(prog, &mut n);
        let mut log = vec![0 as c_char; n.max(1)];
        sys::nvrtcGetProgramLog(prog, log.as_mut_ptr());
        let log = CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned();
        let result = if r != ok {
            Err(err(format!("{r:?} with {}\n{log}", options.join(" "))))
        } else {
            let mut n = 0usize;
            let r = sys::nvrtcGetCUBINSize(prog, &mut n);
            if r != ok || n == 0 {
                Err(err(format!("nvrtcGetCUBINSize: {r:?}")))
            } else {
                let mut image = vec![0u8; n];
                let r = sys::nvrtcGetCUBIN(prog, image.as_mut_ptr() as *mut c_char);
                if r != ok {
                    Err(err(format!("nvrtcGetCUBIN: {r:?}")))
                } else {
                    Ok((image, log))
                }
            }
        };
        sys::nvrtcDestroyProgram(&mut prog);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn includes_are_expanded_once() {
        let s = expand("norm.cu").unwrap();
        assert!(!s.contains("#include \""));
        assert!(!s.contains("#pragma once"));
    }

    #[test]
    fn keys_ignore_define_order() {
        let a = ModuleKey::new("gemv.cu", "sm_90a", &[("A", "1".into()), ("B", "2".into())]);
        let b = ModuleKey::new("gemv.cu", "sm_90a", &[("B", "2".into()), ("A", "1".into())]);
        assert_eq!(a, b);
    }

    #[test]
    fn sources_read_from_a_directory() {
        let dir = std::env::temp_dir().join(format!("akunu-kernel-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("x.cu"), "// edited\n").unwrap();
        assert_eq!(source_in(&dir, "x.cu").unwrap(), "// edited\n");
        let missing = source_in(&dir, "y.cu").unwrap_err().to_string();
        assert!(missing.contains("y.cu"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
