//! Continuous batching's decode speed on the GPU: a scheduler over N slots decoding N requests
//! at once with the CLI's default sampler (seeded), each a 16-token prompt and 128 generated
//! tokens, past end-of-generation. Two ways to choose the tokens, taking turns round by round:
//! drawn on the device after each pass (the scheduler's default) and drawn by the host from the
//! logits read back (the same backend behind a wrapper that declines device draws). A time is
//! the median over rounds of the decode passes' wall time (passes without prompt tokens, less
//! the first, which captures the pass's graph), host clock, as generated tokens per second over
//! all sequences, and as µs a pass beside the same passes and draws made straight through the
//! session (no scheduler: no detokenizing, stop strings or events), which tells the scheduler's
//! own cost.
//!
//!   bench-batch MODEL.gguf [--slots 1,4,8,16] [--rounds 3]
//!
//! Built by `cargo bench --no-run` (scripts/gpu/build.sh carries it as `.gpu/bin/bench-batch`).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use akunu_core::batch::{Listener, Scheduler, SeqEvent, SeqRequest};
use akunu_core::generate::GenerateParams;
use akunu_core::sampling::SamplerParams;
use akunu_core::session::Logits;
use akunu_core::{Backend, Batch, EngineError, Model, Part, Session};
use akunu_cuda::backend::{CudaBackend, CudaOptions};
use akunu_cuda::Gpu;

const PROMPT: usize = 16;
const GENERATED: usize = 128;

/// The CUDA backend with device draws declined, so the scheduler reads logits back.
struct HostDraws(CudaBackend);

impl Backend for HostDraws {
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn max_batch(&self) -> usize {
        self.0.max_batch()
    }
    fn n_ctx(&self) -> usize {
        self.0.n_ctx()
    }
    fn n_slots(&self) -> usize {
        self.0.n_slots()
    }
    fn forward(&mut self, batch: &Batch) -> Result<(), EngineError> {
        self.0.forward(batch)
    }
    fn logits(&mut self) -> Result<&[f32], EngineError> {
        self.0.logits()
    }
}

/// Drops a sequence's events: only its passes are timed.
struct Quiet;

impl Listener for Quiet {
    fn send(&mut self, event: SeqEvent) -> bool {
        if let SeqEvent::Failed(why) = event {
            eprintln!("a sequence failed: {why}");
        }
        true
    }
    fn cancelled(&self) -> bool {
        false
    }
}

/// Runs `slots` requests to their end; returns the decode passes' time and generated tokens.
fn run<B: Backend>(session: Session<B>, model: &Model, slots: usize) -> (Duration, usize) {
    let mut sched = Scheduler::new(session, &model.tokenizer).expect("scheduler");
    let n_vocab = model.config.n_vocab as u32;
    for s in 0..slots {
        let prompt = (0..PROMPT as u32)
            .map(|i| 300 + (i * 7919 + s as u32 * 104_729) % (n_vocab - 300))
            .collect();
        let request = SeqRequest {
            prompt,
            params: GenerateParams {
                max_tokens: Some(GENERATED),
                sampler: SamplerParams {
                    seed: s as u64,
                    ..SamplerParams::default()
                },
                stop: Vec::new(),
                ignore_eos: true,
            },
            logprobs: None,
        };
        sched.submit(request, Box::new(Quiet)).expect("submit");
    }
    let (mut time, mut tokens, mut decode_passes) = (Duration::ZERO, 0, 0);
    while !sched.is_idle() {
        let t = Instant::now();
        let stats = sched.step();
        if stats.prompt_tokens == 0 {
            // The first captures the pass's graph.
            decode_passes += 1;
            if decode_passes > 1 {
                time += t.elapsed();
                tokens += stats.decode_tokens;
            }
        }
    }
    (time, tokens)
}

/// The same decode as `run` without the scheduler: `slots` sequences' passes and device draws
/// straight through the session (each slot's 16-token prompt read first); µs a pass, the first
/// (graph capture) left out.
fn session_passes(mut session: Session<CudaBackend>, slots: usize) -> f64 {
    let params: Vec<SamplerParams> = (0..slots)
        .map(|s| SamplerParams {
            seed: s as u64,
            ..SamplerParams::default()
        })
        .collect();
    for s in 0..slots {
        let prompt: Vec<u32> = (0..PROMPT as u32).map(|i| 300 + i + s as u32).collect();
        session.eval(s, &prompt, Logits::None).expect("prompt");
    }
    let draws: Vec<Option<&SamplerParams>> = params.iter().map(Some).collect();
    let mut next: Vec<u32> = vec![300; slots];
    let mut time = Duration::ZERO;
    for i in 0..GENERATED {
        let t = Instant::now();
        let parts: Vec<Part> = (0..slots)
            .map(|s| Part {
                slot: s,
                tokens: std::slice::from_ref(&next[s]),
                logits: true,
            })
            .collect();
        let drawn = session.step_drawing(&parts, &draws).expect("pass");
        let tokens: Vec<u32> = drawn.tokens.iter().map(|t| t.expect("drawn")).collect();
        next = tokens;
        if i > 0 {
            time += t.elapsed();
        }
    }
    time.as_secs_f64() * 1e6 / (GENERATED - 1) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut path = None;
    let mut slots = vec![1usize, 4, 8, 16];
    let mut rounds = 3usize;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--slots" => {
                slots = it
                    .next()
                    .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
                    .unwrap_or_default()
            }
            "--rounds" => rounds = it.next().and_then(|v| v.parse().ok()).unwrap_or(0),
            "--bench" => {}
            p if !p.starts_with('-') => path = Some(p.to_string()),
            other => {
                eprintln!("bench-batch: unknown argument {other}");
                return ExitCode::FAILURE;
            }
        }
    }
    let Some(path) = path else {
        eprintln!("usage: bench-batch MODEL.gguf [--slots 1,4,8,16] [--rounds 3]");
        return ExitCode::FAILURE;
    };
    if slots.is_empty() || slots.contains(&0) || rounds == 0 {
        eprintln!("bench-batch: --slots takes positive counts, --rounds a positive number");
        return ExitCode::FAILURE;
    }
    let model = match Model::load(&path) {
        Ok(m) => Arc::new(m),
        Err(e) => {
            eprintln!("bench-batch: {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let gpu = match Gpu::open(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("bench-batch: {e}");
            return ExitCode::FAILURE;
        }
    };
    let name = std::path::Path::new(&path)
        .file_name()
        .map_or(path.clone(), |n| n.to_string_lossy().into_owned());
    println!(
        "| {name}, batched decode | device draws, t/s | host draws, t/s | ratio | µs a pass, scheduler | µs a pass, session |"
    );
    println!("|---|---|---|---|---|---|");
    for &n in &slots {
        let backend = || {
            CudaBackend::new(
                gpu.clone(),
                model.clone(),
                CudaOptions {
                    n_ctx: PROMPT + GENERATED + 16,
                    n_slots: n,
                    max_batch: (n * PROMPT).max(64),
                },
            )
            .expect("backend")
        };
        let n_vocab = model.config.n_vocab;
        let (mut device, mut host, mut bare) = (Vec::new(), Vec::new(), Vec::new());
        // One round of each first: graph capture and kernel loads.
        run(Session::new(backend(), n_vocab), &model, n);
        run(Session::new(HostDraws(backend()), n_vocab), &model, n);
        for _ in 0..rounds {
            let (t, k) = run(Session::new(backend(), n_vocab), &model, n);
            device.push(k as f64 / t.as_secs_f64());
            let (t, k) = run(Session::new(HostDraws(backend()), n_vocab), &model, n);
            host.push(k as f64 / t.as_secs_f64());
            bare.push(session_passes(Session::new(backend(), n_vocab), n));
        }
        let (d, h, b) = (median(device), median(host), median(bare));
        // Every sequence gets a token each pass.
        let pass = 1e6 * n as f64 / d;
        println!(
            "| {n} sequences | {d:.1} | {h:.1} | {:.2} | {pass:.0} | {b:.0} |",
            d / h
        );
    }
    ExitCode::SUCCESS
}
