//! The CUDA backend: the plan's ops as NVRTC-compiled kernels, decode steps replayed as CUDA
//! graphs.
//!
//! Plan: [`gpu::Gpu`] wraps one device context and stream (cudarc, loaded at run time, so the
//! binary starts without CUDA and callers fall back to the CPU). Kernels live in
//! `kernels/*.cu`, compiled for the running GPU with `-D` specialisations and cached on disk
//! ([`compile`]). Weights are uploaded once, still quantized. The backend lowers the plan to a
//! list of launches over device buffers; per-token state (token ids, positions, slots) lives on
//! the device, so one decode step is a static graph that chain decode replays.

pub mod backend;
pub mod chip;
pub mod compile;
pub mod flash;
pub mod gemm;
pub mod gpu;
pub mod layers;
pub mod matmul;
pub mod sample;

pub use chip::ChipConfig;
pub use gpu::{Arg, DeviceBuffer, Gpu, Kernel};

use cudarc::driver::DriverError;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("the CUDA driver (libcuda) is not installed or cannot be loaded")]
    NoDriver,
    #[error(
        "NVRTC (libnvrtc) cannot be loaded: install the CUDA toolkit, or `pip install \
         nvidia-cuda-nvrtc` and add its nvidia/cu13/lib folder to LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    #[error("{what}: {source}")]
    Driver { what: String, source: DriverError },
    #[error("out of GPU memory allocating {bytes} bytes: {source}")]
    OutOfMemory { bytes: usize, source: DriverError },
    #[error("compiling {file}: {log}")]
    Compile { file: String, log: String },
    #[error("{0}")]
    Bounds(String),
    #[error("{0}")]
    Unsupported(String),
}

impl CudaError {
    pub fn driver(what: &str, source: DriverError) -> CudaError {
        CudaError::Driver {
            what: what.into(),
            source,
        }
    }
}

/// Every kernel module (source file and `-D` defines) the backend can compile, for the test
/// that compiles them all with NVRTC.
pub fn all_modules() -> Vec<compile::ModuleSpec> {
    let mut all = matmul::modules();
    all.extend(gemm::modules());
    all.extend(layers::modules());
    all.extend(sample::modules());
    all.extend(flash::modules());
    all
}

/// Checks that libcuda and libnvrtc can be loaded; cudarc panics on first use otherwise.
pub fn check_libraries() -> Result<(), CudaError> {
    // SAFETY: both calls only try to open the shared libraries.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::NoDriver);
    }
    if !compile::nvrtc_present() {
        return Err(CudaError::NoNvrtc);
    }
    Ok(())
}

/// The number of CUDA devices, or why there are none to use.
pub fn device_count() -> Result<usize, CudaError> {
    check_libraries()?;
    cudarc::driver::result::init().map_err(|e| CudaError::driver("initialising CUDA", e))?;
    let n = cudarc::driver::CudaContext::device_count()
        .map_err(|e| CudaError::driver("counting GPUs", e))?;
    Ok(n.max(0) as usize)
}
