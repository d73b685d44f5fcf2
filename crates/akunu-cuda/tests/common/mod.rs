//! Shared by the GPU tests: the device, or a skip when there is none.
//!
//! Without a usable GPU the tests print a note and pass, unless `AKUNU_REQUIRE_GPU=1` (set by
//! the device script), which turns a missing GPU into a failure so a GPU test can never pass by
//! not running.

#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use akunu_cuda::Gpu;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub fn gpu() -> Option<Arc<Gpu>> {
    static GPU: OnceLock<Option<Arc<Gpu>>> = OnceLock::new();
    GPU.get_or_init(|| {
        let required = std::env::var("AKUNU_REQUIRE_GPU").as_deref() == Ok("1");
        match akunu_cuda::device_count().and_then(|n| {
            if n == 0 {
                Err(akunu_cuda::CudaError::Unsupported("no CUDA device".into()))
            } else {
                Gpu::open(0)
            }
        }) {
            Ok(g) => Some(g),
            Err(e) => {
                assert!(!required, "AKUNU_REQUIRE_GPU=1 but no GPU: {e}");
                eprintln!("skipped: no GPU ({e})");
                None
            }
        }
    })
    .clone()
}

/// Whether the tests run under compute-sanitizer (`AKUNU_SANITIZE=1`, set by
/// `scripts/gpu/device.sh`), which runs each launch hundreds of times slower: the longest
/// tests then do less of the same work (the kernels' accesses are checked on its first part).
pub fn sanitizing() -> bool {
    std::env::var("AKUNU_SANITIZE").as_deref() == Ok("1")
}

/// `n` values uniform in `[-scale, scale)`, never all zero.
pub fn random(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// ‖a − b‖ / ‖b‖ in f64; NaN anywhere gives infinity.
pub fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        if !x.is_finite() {
            return f64::INFINITY;
        }
        num += (x as f64 - y).powi(2);
        den += y * y;
    }
    (num / den.max(1e-300)).sqrt()
}

/// Host-side poison written into outputs before a kernel runs, so unwritten elements show.
pub const POISON: f32 = f32::NAN;

/// Checks the GEMVs' int8 form (`kernels/actq.cuh`) of `x`: per 32 values, d = amax / 127 and
/// every level the nearest integer to x / d; then the sums {d, d·Σq, d·Σq[..16], d·Σq[16..]}.
pub fn check_act_quant(what: &str, x: &[f32], levels: &[i8], sums: &[f32]) {
    for (gi, ((xg, lg), sg)) in x
        .chunks(32)
        .zip(levels.chunks(32))
        .zip(sums.chunks(4))
        .enumerate()
    {
        let amax = xg.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
        let d = amax / 127.0;
        assert!(
            (sg[0] as f64 - d).abs() <= 1e-6 * d,
            "{what}: group {gi}: d {} vs {d}",
            sg[0]
        );
        for (i, (&v, &l)) in xg.iter().zip(lg).enumerate() {
            let exact = if amax > 0.0 { v as f64 / d } else { 0.0 };
            assert!(
                (l as f64 - exact).abs() <= 0.5 + 1e-4,
                "{what}: group {gi} value {i}: level {l} for {exact:.4}"
            );
        }
        let half = |r: std::ops::Range<usize>| lg[r].iter().map(|&l| l as f64).sum::<f64>();
        let (lo, hi) = (half(0..16), half(16..32));
        for (j, want) in [(1, lo + hi), (2, lo), (3, hi)] {
            let want = sg[0] as f64 * want;
            assert!(
                (sg[j] as f64 - want).abs() <= 1e-6 * want.abs().max(d),
                "{what}: group {gi}: sum {j} {} vs {want}",
                sg[j]
            );
        }
    }
}
