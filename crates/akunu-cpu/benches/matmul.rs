//! Quantized products on the shapes of the default model (Gemma 3 270M Q4_K_M: width 640, FFN
//! 2048, 4×256 query heads, one 256 KV head, 18 layers, tied 262144×640 Q8_0 output), for m = 1
//! (decode) and m = 128 (prompt), at every SIMD level this CPU runs.
//!
//! `cargo bench -p akunu-cpu --bench matmul [-- FILTER]`. Prints the median of repeated runs:
//! time, GB/s of weights read (m = 1) and GOP/s (2·rows·cols·m operations). For m = 1 the
//! weights are cycled through copies larger than the last-level cache, as in a real forward pass,
//! where each matrix is read once per token. The summary adds up one token through all layers and
//! the output matrix, as decode and as a 128-token prompt (whose logits need only the last
//! token), counting matrix products only. Activations are quantized outside the timed region;
//! `quantize_for` is timed on its own.

use std::time::{Duration, Instant};

use akunu_cpu::quant::{matmul_with, Activations, SimdLevel, WeightMatrix};
use akunu_quant::GgmlType;

const WIDTH: usize = 640;
const FFN: usize = 2048;
const LAYERS: usize = 18;
const VOCAB: usize = 262_144;
/// Weights streamed per m = 1 measurement, above the 32 MiB last-level cache.
const STREAM_BYTES: usize = 96 << 20;

struct Shape {
    name: &'static str,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// Uses per layer (0 for the output matrix).
    per_layer: usize,
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "attn_q",
        ty: GgmlType::Q5_0,
        rows: 1024,
        cols: WIDTH,
        per_layer: 1,
    },
    Shape {
        name: "attn_k",
        ty: GgmlType::Q5_0,
        rows: 256,
        cols: WIDTH,
        per_layer: 1,
    },
    Shape {
        name: "attn_v",
        ty: GgmlType::Q8_0,
        rows: 256,
        cols: WIDTH,
        per_layer: 1,
    },
    Shape {
        name: "attn_output",
        ty: GgmlType::Q4_K,
        rows: WIDTH,
        cols: 1024,
        per_layer: 1,
    },
    Shape {
        name: "ffn_gate/up",
        ty: GgmlType::Q5_0,
        rows: FFN,
        cols: WIDTH,
        per_layer: 2,
    },
    Shape {
        name: "ffn_down",
        ty: GgmlType::Q4_K,
        rows: WIDTH,
        cols: FFN,
        per_layer: 1,
    },
    Shape {
        name: "ffn_down",
        ty: GgmlType::Q6_K,
        rows: WIDTH,
        cols: FFN,
        per_layer: 0,
    },
    Shape {
        name: "output",
        ty: GgmlType::Q8_0,
        rows: VOCAB,
        cols: WIDTH,
        per_layer: 0,
    },
];

/// Deterministic values in (−1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn weights(sh: &Shape) -> Vec<u8> {
    let n = sh.rows * sh.cols;
    let mut bytes = vec![0u8; sh.ty.bytes_for(n as u64).unwrap() as usize];
    // Quantizing a 262144-row matrix with the reference quantizer takes a while; one block
    // pattern repeated is as good for timing.
    let unit = (sh.cols * 64).min(n);
    let mut blk = vec![0u8; sh.ty.bytes_for(unit as u64).unwrap() as usize];
    akunu_quant::quantize(sh.ty, &values(unit, n as u64), &mut blk).unwrap();
    for c in bytes.chunks_mut(blk.len()) {
        c.copy_from_slice(&blk[..c.len()]);
    }
    bytes
}

/// Median seconds of `f` over enough runs to fill about `budget`.
fn median(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    f();
    let once = start.elapsed().max(Duration::from_nanos(100));
    let runs = (budget.as_secs_f64() / once.as_secs_f64()).clamp(5.0, 2000.0) as usize;
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[runs / 2]
}

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let budget = Duration::from_millis(400);
    let levels = SimdLevel::available();
    println!(
        "threads: {}, levels: {}",
        rayon::current_num_threads(),
        levels
            .iter()
            .map(|l| l.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "{:<12} {:<5} {:>7} {:>5} {:<10} {:>4} {:>10} {:>8} {:>8}",
        "matrix", "type", "rows", "cols", "level", "m", "time", "GB/s", "GOP/s"
    );
    // (level, m) -> seconds per token of the model, summed.
    let mut decode = vec![0.0f64; levels.len()];
    let mut prompt = vec![0.0f64; levels.len()];
    for sh in SHAPES {
        if filter
            .as_deref()
            .is_some_and(|f| !sh.name.contains(f) && !sh.ty.name().eq_ignore_ascii_case(f))
        {
            continue;
        }
        let wb = weights(sh);
        let copies = STREAM_BYTES.div_ceil(wb.len()).clamp(1, 64);
        let stream: Vec<Vec<u8>> = (0..copies).map(|_| wb.clone()).collect();
        let mats: Vec<WeightMatrix> = stream
            .iter()
            .map(|b| WeightMatrix::new(sh.ty, b, sh.rows, sh.cols).unwrap())
            .collect();
        let ms: &[usize] = if sh.per_layer == 0 && sh.name == "output" {
            &[1]
        } else {
            &[1, 128]
        };
        for &m in ms {
            let x = values(m * sh.cols, 7);
            let mut act = Activations::new();
            let tq = median(budget / 4, || act.quantize_for(sh.ty, &x, m, sh.cols));
            let mut out = vec![0f32; m * sh.rows];
            for (li, &level) in levels.iter().enumerate() {
                let mut i = 0;
                let secs = median(budget, || {
                    let w = if m == 1 { &mats[i % copies] } else { &mats[0] };
                    i += 1;
                    matmul_with(level, w, &act, &mut out, sh.rows).unwrap();
                });
                let gbs = wb.len() as f64 / secs / 1e9;
                let gops = 2.0 * (sh.rows * sh.cols * m) as f64 / secs / 1e9;
                println!(
                    "{:<12} {:<5} {:>7} {:>5} {:<10} {:>4} {:>8.1}µs {:>8.1} {:>8.1}   (quantize {:.1}µs)",
                    sh.name,
                    sh.ty.name(),
                    sh.rows,
                    sh.cols,
                    level.name(),
                    m,
                    secs * 1e6,
                    gbs,
                    gops,
                    tq * 1e6
                );
                let uses = if sh.name == "output" {
                    1
                } else {
                    sh.per_layer * LAYERS
                };
                if m == 1 {
                    decode[li] += uses as f64 * (secs + tq);
                    if sh.name == "output" {
                        prompt[li] += secs + tq;
                    }
                } else {
                    prompt[li] += uses as f64 * (secs + tq);
                }
            }
        }
    }
    if filter.is_none() {
        println!("\nmatrix products of one forward pass (Q4_K ffn_down everywhere):");
        for (li, level) in levels.iter().enumerate() {
            println!(
                "  {:<10} decode {:>7.2} ms/token = {:>6.1} tokens/s; 128-token prompt {:>7.2} ms = {:>6.1} tokens/s",
                level.name(),
                decode[li] * 1e3,
                1.0 / decode[li],
                prompt[li] * 1e3,
                128.0 / prompt[li]
            );
        }
    }
}
