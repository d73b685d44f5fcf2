//! Loading a model into a session, with the flags every engine command shares (llama.cpp's
//! names: `-c`, `-t`, `-b`, `-ngl`, and the sampling flags).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::device::{self, AnyBackend, Device, Sizes};
use akunu_core::generate::GenerateParams;
use akunu_core::sampling::SamplerParams;
use akunu_core::{Model, Session};
use akunu_tokenizer::{ChatError, ChatTemplate};
use anyhow::{bail, Context, Result};
use clap::Args;

/// How the engine is sized and where it runs.
#[derive(Args, Clone, Debug)]
pub struct EngineArgs {
    /// Context size in tokens (0 = the model's training context).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx_size: usize,
    /// Threads (default: the number of physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Most tokens evaluated in one pass during prompt processing.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: usize,
    /// Layers to put on the GPU: 0 runs on the CPU; any other value puts the whole model on
    /// the GPU (the default when one can be used).
    #[arg(long = "n-gpu-layers", value_name = "N", allow_negative_numbers = true)]
    pub n_gpu_layers: Option<i64>,
    /// Where to run: auto (the GPU when one can be used), cpu or cuda.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    pub device: Device,
}

/// Sampling flags, with llama.cpp's defaults.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 picks the most likely token every time (greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Keep the most likely tokens whose probabilities add up to P (1.0 = off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0.0 = off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalise repeating tokens of the last --repeat-last-n (1.0 = off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at (0 = off).
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Subtract this times a token's count in the window (0.0 = off).
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Subtract this from tokens present in the window (0.0 = off).
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Random seed (default: a new one each run).
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn params(&self) -> Result<SamplerParams> {
        let mut p = SamplerParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            penalty_last_n: self.repeat_last_n,
            ..SamplerParams::default()
        };
        if let Some(seed) = self.seed {
            p.seed = seed;
        }
        p.validate().context("sampling parameters")?;
        Ok(p)
    }
}

/// Generation flags shared by `run`, `complete` and `chat`.
#[derive(Args, Clone, Debug)]
pub struct GenArgs {
    /// Tokens to generate (-1 = until the model stops or the context is full).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// Stop when the text contains this string (may be repeated).
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Keep generating past the model's end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

impl GenArgs {
    pub fn params(&self) -> Result<GenerateParams> {
        if self.n_predict < -1 {
            bail!(
                "-n must be -1 (no limit) or a token count, not {}",
                self.n_predict
            );
        }
        Ok(GenerateParams {
            max_tokens: usize::try_from(self.n_predict).ok(),
            sampler: self.sampling.params()?,
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
        })
    }
}

/// The default thread count: physical cores.
pub fn default_threads() -> usize {
    num_cpus::get_physical().max(1)
}

pub struct Loaded {
    pub model: Arc<Model>,
    pub session: Session<AnyBackend>,
    pub load_time: Duration,
    /// The chat template (the model's own or the built-in one for its vocabulary), or why
    /// there is none that works.
    pub template: Result<ChatTemplate, ChatError>,
}

/// Loads `path` and builds a session with `n_slots` KV-cache slots on the device the flags
/// choose.
pub fn load(path: &Path, args: &EngineArgs, n_slots: usize) -> Result<Loaded> {
    let start = Instant::now();
    let mut model = Model::load(path).with_context(|| format!("loading {}", path.display()))?;
    let mut template = model.tokenizer.chat_template_for(model.arch.family.name());
    if let Ok(t) = &template {
        // The template's end-of-turn marker ends generation too. A template that cannot
        // render the probe conversation cannot render chats either: plain completion still
        // works, and chat says why it cannot.
        if let Err(why) = model.tokenizer.learn_end_of_turn(t) {
            template = Err(why);
        }
    }
    let model = Arc::new(model);
    let n_ctx = if args.ctx_size == 0 {
        model.config.n_ctx_train
    } else {
        args.ctx_size
    };
    let threads = args.threads.unwrap_or_else(default_threads);
    if threads == 0 {
        bail!("-t must be at least 1");
    }
    if args.batch_size == 0 {
        bail!("-b must be at least 1");
    }
    let device = match (args.n_gpu_layers, args.device) {
        (Some(0), Device::Cuda) => bail!("-ngl 0 runs on the CPU, which contradicts --device cuda"),
        (Some(0), _) => Device::Cpu,
        (_, d) => d,
    };
    let backend = device::open(
        &model,
        device,
        &Sizes {
            n_ctx,
            n_slots,
            max_batch: args.batch_size.min(n_ctx),
            threads,
        },
    )?;
    let session = Session::new(backend, model.config.n_vocab);
    Ok(Loaded {
        model,
        session,
        load_time: start.elapsed(),
        template,
    })
}

/// `n` reproducible pseudo-random token ids, starting with BOS when the model adds one, as
/// llama-bench builds its prompts: benchmark inputs that no tokenizer quirk can shorten.
pub fn synthetic_tokens(model: &Model, n: usize) -> Vec<u32> {
    let n_vocab = model.config.n_vocab as u64;
    let bos = model
        .tokenizer
        .special_tokens()
        .bos
        .filter(|_| model.tokenizer.add_bos());
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|i| match (i, bos) {
            (0, Some(b)) => b,
            _ => {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 33) % n_vocab) as u32
            }
        })
        .collect()
}
