//! Times the GPU sampler on one row of a 262,144-token vocabulary: the argmax, then each
//! setting on each launch path (as `SampleKernels::sample` picks it, and both forced); then the
//! defaults over 1, 4 and 16 rows of 151,936 logits by the most blocks a row is split over. A time
//! is the median over rounds of 200 launches queued back to back (the variants of a setting
//! taking turns), per launch, host clock:
//! what a decode step pays for its sampler, launch cost included.
//!
//!   bench-sampler [--rounds N]
//!
//! Built by `cargo bench --no-run` (scripts/gpu/build.sh carries it as `.gpu/bin/bench-sampler`).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use akunu_core::sampling::SamplerParams;
use akunu_cuda::sample::{SampleKernels, SamplerState};
use akunu_cuda::{CudaError, Gpu};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const VOCAB: usize = 262_144;
const LAUNCHES: usize = 200;

fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplerParams {
    SamplerParams {
        temperature,
        top_k,
        top_p,
        min_p,
        penalty_last_n: 0,
        seed: 1,
        ..SamplerParams::default()
    }
}

/// Logits in [-8, 8) with a few raised spikes, so the top of the distribution has structure.
fn logits(n: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(3);
    let mut l: Vec<f32> = (0..n).map(|_| rng.random_range(-8.0..8.0)).collect();
    for _ in 0..8 {
        let i = rng.random_range(0..n);
        l[i] += 6.4;
    }
    l
}

type Launch<'a> = Box<dyn Fn() -> Result<(), CudaError> + 'a>;

/// Median microseconds per launch of each of `variants` over `rounds` rounds of LAUNCHES
/// launches, the variants taking turns round by round (so a drift in clocks or state touches
/// each alike).
fn time(gpu: &Gpu, rounds: usize, variants: &[Launch]) -> Result<Vec<f64>, CudaError> {
    let mut us = vec![Vec::with_capacity(rounds); variants.len()];
    for f in variants {
        f()?;
    }
    gpu.sync()?;
    for _ in 0..rounds {
        for (f, us) in variants.iter().zip(&mut us) {
            let t = Instant::now();
            for _ in 0..LAUNCHES {
                f()?;
            }
            gpu.sync()?;
            us.push(t.elapsed().as_secs_f64() * 1e6 / LAUNCHES as f64);
        }
    }
    Ok(us
        .into_iter()
        .map(|mut u| {
            u.sort_by(f64::total_cmp);
            u[u.len() / 2]
        })
        .collect())
}

fn run(rounds: usize) -> Result<(), CudaError> {
    let gpu: Arc<Gpu> = Gpu::open(0)?;
    let k = SampleKernels::new(&gpu)?;
    let buf = gpu.upload(&logits(VOCAB))?;
    let out = gpu.alloc(4)?;
    let mut st = SamplerState::new(&gpu, 1, 64)?;
    let argmax = time(
        &gpu,
        rounds,
        &[Box::new(|| {
            k.argmax(&gpu, buf.ptr(), 1, VOCAB, out.ptr(), None)
        })],
    )?;
    println!("| what (1 x {VOCAB} logits) | automatic | one block | exact launches |");
    println!("|---|---|---|---|");
    println!("| argmax | {:.1} | | |", argmax[0]);
    for (what, p) in [
        ("greedy", params(0.0, 40, 0.95, 0.05)),
        (
            "defaults (0.8, top-k 40, top-p 0.95, min-p 0.05)",
            params(0.8, 40, 0.95, 0.05),
        ),
        ("top-p 0.9", params(1.0, 0, 0.9, 0.0)),
        ("top-k 1000, top-p 0.95", params(1.0, 1000, 0.95, 0.0)),
        ("min-p 0.05", params(1.0, 0, 1.0, 0.05)),
    ] {
        st.set_params(0, &p, &[])?;
        let (gpu, k, st) = (&gpu, &k, &st);
        let (logits, out) = (buf.ptr(), out.ptr());
        let forced = |exact| -> Launch {
            Box::new(move || k.sample_with(gpu, logits, 1, VOCAB, st, out, exact))
        };
        let t = time(
            gpu,
            rounds,
            &[
                Box::new(move || k.sample(gpu, logits, 1, VOCAB, st, out)),
                forced(false),
                forced(true),
            ],
        )?;
        println!("| {what} | {:.1} | {:.1} | {:.1} |", t[0], t[1], t[2]);
    }
    rows_by_splits(&gpu, rounds)
}

/// The defaults over several rows of a 151,936-token vocabulary (qwen3's; a batched decode
/// step draws a row per sequence), each row split over at most 64, 32, 16, 8 or 4 blocks (and
/// at most one wave's: `SampleKernels` caps a launch at a block per SM).
fn rows_by_splits(gpu: &Arc<Gpu>, rounds: usize) -> Result<(), CudaError> {
    const V: usize = 151_936;
    const CAPS: [usize; 5] = [64, 32, 16, 8, 4];
    const ROWS: [usize; 3] = [1, 4, 16];
    let m_max = ROWS[ROWS.len() - 1];
    let row = logits(V);
    let mut all = Vec::with_capacity(m_max * V);
    for _ in 0..m_max {
        all.extend_from_slice(&row);
    }
    let buf = gpu.upload(&all)?;
    let out = gpu.alloc(m_max * 4)?;
    let mut st = SamplerState::new(gpu, m_max, 64)?;
    let p = params(0.8, 40, 0.95, 0.05);
    for r in 0..m_max {
        st.set_params(r, &p, &[])?;
    }
    let kernels = CAPS
        .iter()
        .map(|&c| SampleKernels::new(gpu).map(|k| k.with_max_splits(c)))
        .collect::<Result<Vec<_>, _>>()?;
    print!("\n| defaults, rows of {V} logits |");
    for c in CAPS {
        print!(" at most {c} |");
    }
    println!("\n|---|{}", "---|".repeat(CAPS.len()));
    for m in ROWS {
        let (st, logits, out) = (&st, buf.ptr(), out.ptr());
        let variants: Vec<Launch> = kernels
            .iter()
            .map(|k| -> Launch { Box::new(move || k.sample(gpu, logits, m, V, st, out)) })
            .collect();
        let t = time(gpu, rounds, &variants)?;
        print!("| {m} rows |");
        for us in t {
            print!(" {us:.1} |");
        }
        println!();
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let rounds = match args.as_slice() {
        [] => 5,
        [flag, n] if flag == "--rounds" => match n.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("bench-sampler: --rounds takes a positive count");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("usage: bench-sampler [--rounds N]");
            return ExitCode::from(2);
        }
    };
    match run(rounds) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-sampler: {e}");
            ExitCode::FAILURE
        }
    }
}
