//! Where the engine runs: the CUDA backend when a GPU can be used, else the CPU backend.
//!
//! `--device auto` (the default) tries CUDA and falls back to the CPU with a one-line note
//! saying why (no driver, no NVRTC, no device); `--device cuda` makes that an error;
//! `--device cpu` or `-ngl 0` never touches CUDA. A first run on a GPU compiles its kernels
//! (seconds to a minute), and says so before it starts.

use std::sync::Arc;

use akunu_core::sampling::SamplerParams;
use akunu_core::{Backend, Batch, Draw, EngineError, Model};
use akunu_cpu::{CpuBackend, CpuOptions};
use akunu_cuda::backend::{CudaBackend, CudaOptions};
use anyhow::{bail, Result};
use clap::ValueEnum;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// The GPU when one can be used, else the CPU.
    Auto,
    Cpu,
    Cuda,
}

/// The backend a session runs on.
pub enum AnyBackend {
    Cpu(Box<CpuBackend>),
    Cuda(Box<CudaBackend>),
}

/// Sizes shared by both backends.
pub struct Sizes {
    pub n_ctx: usize,
    pub n_slots: usize,
    pub max_batch: usize,
    pub threads: usize,
}

/// Builds the backend `device` asks for.
pub fn open(model: &Arc<Model>, device: Device, sizes: &Sizes) -> Result<AnyBackend> {
    if device != Device::Cpu {
        match open_cuda(model, sizes) {
            Ok(b) => return Ok(AnyBackend::Cuda(Box::new(b))),
            Err(e) if device == Device::Cuda => bail!("CUDA backend: {e}"),
            Err(e) => eprintln!("note: running on the CPU ({e})"),
        }
    }
    Ok(AnyBackend::Cpu(Box::new(CpuBackend::new(
        model.clone(),
        CpuOptions {
            n_ctx: sizes.n_ctx,
            n_slots: sizes.n_slots,
            max_batch: sizes.max_batch,
            threads: sizes.threads,
        },
    )?)))
}

fn open_cuda(model: &Arc<Model>, sizes: &Sizes) -> Result<CudaBackend> {
    if akunu_cuda::device_count()? == 0 {
        bail!("no CUDA device");
    }
    let gpu = akunu_cuda::Gpu::open(0)?;
    let to_compile = gpu.uncompiled(&akunu_cuda::backend::kernel_modules(&gpu.chip, model));
    if to_compile > 0 {
        let kept = match akunu_cuda::compile::cache_dir() {
            Some(dir) => format!("once: later runs load them from {}", dir.display()),
            None => "not kept: no cache directory (set AKUNU_KERNEL_CACHE)".into(),
        };
        eprintln!(
            "note: compiling {to_compile} GPU kernel modules for {} ({kept})",
            gpu.arch()
        );
    }
    Ok(CudaBackend::new(
        gpu,
        model.clone(),
        CudaOptions {
            n_ctx: sizes.n_ctx,
            n_slots: sizes.n_slots,
            max_batch: sizes.max_batch,
        },
    )?)
}

impl AnyBackend {
    /// The GPU's name when running on one.
    pub fn gpu_name(&self) -> Option<String> {
        match self {
            AnyBackend::Cpu(_) => None,
            AnyBackend::Cuda(b) => Some(b.gpu().chip.name.clone()),
        }
    }

    pub fn set_profiling(&mut self, on: bool) {
        match self {
            AnyBackend::Cpu(b) => b.set_profiling(on),
            AnyBackend::Cuda(b) => b.set_profiling(on),
        }
    }

    pub fn op_labels(&self) -> Vec<String> {
        match self {
            AnyBackend::Cpu(b) => b.op_labels().to_vec(),
            AnyBackend::Cuda(b) => b.op_labels().to_vec(),
        }
    }

    /// Seconds spent in each op since profiling was turned on (device time on the GPU).
    pub fn op_seconds(&self) -> Vec<f64> {
        match self {
            AnyBackend::Cpu(b) => b
                .op_times()
                .unwrap_or_default()
                .iter()
                .map(|d| d.as_secs_f64())
                .collect(),
            AnyBackend::Cuda(b) => b
                .op_times_ms()
                .unwrap_or_default()
                .iter()
                .map(|ms| ms / 1e3)
                .collect(),
        }
    }
}

impl Backend for AnyBackend {
    fn describe(&self) -> String {
        match self {
            AnyBackend::Cpu(b) => b.describe(),
            AnyBackend::Cuda(b) => b.describe(),
        }
    }

    fn max_batch(&self) -> usize {
        match self {
            AnyBackend::Cpu(b) => b.max_batch(),
            AnyBackend::Cuda(b) => b.max_batch(),
        }
    }

    fn n_ctx(&self) -> usize {
        match self {
            AnyBackend::Cpu(b) => b.n_ctx(),
            AnyBackend::Cuda(b) => b.n_ctx(),
        }
    }

    fn n_slots(&self) -> usize {
        match self {
            AnyBackend::Cpu(b) => b.n_slots(),
            AnyBackend::Cuda(b) => b.n_slots(),
        }
    }

    fn forward(&mut self, batch: &Batch) -> Result<(), EngineError> {
        match self {
            AnyBackend::Cpu(b) => b.forward(batch),
            AnyBackend::Cuda(b) => b.forward(batch),
        }
    }

    fn logits(&mut self) -> Result<&[f32], EngineError> {
        match self {
            AnyBackend::Cpu(b) => b.logits(),
            AnyBackend::Cuda(b) => b.logits(),
        }
    }

    fn chain_lengths(&self) -> Option<(usize, usize)> {
        match self {
            AnyBackend::Cpu(b) => b.chain_lengths(),
            AnyBackend::Cuda(b) => b.chain_lengths(),
        }
    }

    fn greedy_chain(
        &mut self,
        slot: usize,
        token: u32,
        pos: usize,
        n: usize,
    ) -> Result<Vec<u32>, EngineError> {
        match self {
            AnyBackend::Cpu(b) => b.greedy_chain(slot, token, pos, n),
            AnyBackend::Cuda(b) => b.greedy_chain(slot, token, pos, n),
        }
    }

    fn samples_on_device(&self, params: &SamplerParams) -> bool {
        match self {
            AnyBackend::Cpu(b) => b.samples_on_device(params),
            AnyBackend::Cuda(b) => b.samples_on_device(params),
        }
    }

    fn sampled_chain(
        &mut self,
        slot: usize,
        token: u32,
        pos: usize,
        n: usize,
        params: &SamplerParams,
        recent: &[u32],
    ) -> Result<Vec<u32>, EngineError> {
        match self {
            AnyBackend::Cpu(b) => b.sampled_chain(slot, token, pos, n, params, recent),
            AnyBackend::Cuda(b) => b.sampled_chain(slot, token, pos, n, params, recent),
        }
    }

    fn draw(&mut self, draws: &[Draw]) -> Result<Vec<u32>, EngineError> {
        match self {
            AnyBackend::Cpu(b) => b.draw(draws),
            AnyBackend::Cuda(b) => b.draw(draws),
        }
    }
}
