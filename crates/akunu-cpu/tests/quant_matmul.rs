//! The quantized products against an `f64` reference built from `akunu-quant`'s dequantizers, at
//! every SIMD level this CPU runs, on random weights and activations of varied magnitude.

use akunu_cpu::quant::{
    dequantize_row, matmul_with, Activations, MatmulError, SimdLevel, WeightMatrix,
};
use akunu_quant::GgmlType;
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

const MS: [usize; 7] = [1, 2, 3, 7, 16, 33, 128];

/// A value of random sign and magnitude spread over a few decades.
fn varied(rng: &mut StdRng) -> f32 {
    let mag = 10f32.powf(rng.random_range(-2.0..1.0));
    let v = rng.random_range(-1.0f32..1.0) * mag;
    if v == 0.0 {
        0.5
    } else {
        v
    }
}

/// `rows × cols` weights of `ty`: quantized from random values, or (for quantized types with
/// `raw`) random block bytes whose `f16` fields are finite and below 2 in magnitude.
fn weights(ty: GgmlType, rows: usize, cols: usize, raw: bool, rng: &mut StdRng) -> Vec<u8> {
    let n = rows * cols;
    let mut bytes = vec![0u8; ty.bytes_for(n as u64).unwrap() as usize];
    if raw && ty.is_quantized() {
        rng.fill(&mut bytes[..]);
        for block in bytes.chunks_exact_mut(ty.type_size()) {
            for off in f16_fields(ty) {
                block[off + 1] &= 0x3F;
            }
        }
    } else {
        let scale = 10f32.powf(rng.random_range(-1.0..1.0));
        let w: Vec<f32> = (0..n).map(|_| varied(rng) * scale).collect();
        akunu_quant::quantize(ty, &w, &mut bytes).unwrap();
    }
    bytes
}

/// Byte offsets of the `f16` fields in a block of `ty`.
fn f16_fields(ty: GgmlType) -> Vec<usize> {
    use GgmlType as T;
    match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::IQ4_XS => vec![0],
        T::Q4_1 | T::Q5_1 | T::Q4_K | T::Q5_K => vec![0, 2],
        T::Q2_K => vec![80, 82],
        T::Q3_K => vec![108],
        T::Q6_K => vec![208],
        _ => unreachable!("{ty}"),
    }
}

/// The activations as the kernels see them, dequantized: blocks of 32 with `id = 127/amax` and
/// levels rounded half to even, the scale `amax/127` rounded to `f16` as ggml's Q8_0 for the
/// legacy types and kept in `f32` for the k-quants; `f32` for float weights.
fn seen_activations(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    use GgmlType as T;
    match ty {
        T::F32 | T::F16 | T::BF16 => x.to_vec(),
        _ => x
            .chunks_exact(32)
            .flat_map(|c| {
                let amax = c.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let d = match ty {
                    T::Q2_K | T::Q3_K | T::Q4_K | T::Q5_K | T::Q6_K | T::IQ4_XS => amax / 127.0,
                    _ => f16::from_f32(amax / 127.0).to_f32(),
                };
                let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
                c.iter()
                    .map(move |&v| d * (v * id).round_ties_even())
                    .collect::<Vec<_>>()
            })
            .collect(),
    }
}

struct Case {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    raw: bool,
}

fn check(case: &Case, rng: &mut StdRng) {
    let Case {
        ty,
        rows,
        cols,
        raw,
    } = *case;
    let wb = weights(ty, rows, cols, raw, rng);
    let w = WeightMatrix::new(ty, &wb, rows, cols).unwrap();
    let mut wf = vec![0f32; rows * cols];
    akunu_quant::dequantize(ty, &wb, &mut wf).unwrap();

    let mmax = *MS.last().unwrap();
    let x: Vec<f32> = (0..mmax)
        .flat_map(|t| {
            let scale = 10f32.powi(t as i32 % 5 - 2);
            (0..cols).map(|_| varied(rng) * scale).collect::<Vec<_>>()
        })
        .collect();
    let seen = seen_activations(ty, &x);
    // want[t][r], with the tolerance scale Σ|w·x| and the raw-activation value.
    let reference = |xs: &[f32], t: usize, r: usize| {
        let (wr, xt) = (&wf[r * cols..][..cols], &xs[t * cols..][..cols]);
        wr.iter()
            .zip(xt)
            .fold((0.0f64, 0.0f64), |(v, a), (&w, &x)| {
                let p = f64::from(w) * f64::from(x);
                (v + p, a + p.abs())
            })
    };

    let mut act = Activations::new();
    for &m in &MS {
        act.quantize_for(ty, &x[..m * cols], m, cols);
        let ldo = rows + 3;
        for level in SimdLevel::available() {
            let mut out = vec![f32::NAN; (m - 1) * ldo + rows + 1];
            matmul_with(level, &w, &act, &mut out, ldo).unwrap();
            for t in 0..m {
                for r in 0..rows {
                    let got = f64::from(out[t * ldo + r]);
                    let (want, mag) = reference(&seen, t, r);
                    let what = format!("{ty} {rows}x{cols} raw={raw} m={m} {level} t={t} r={r}");
                    assert!(
                        (got - want).abs() <= 1e-5 * mag + 1e-30,
                        "{what}: {got} vs {want} (scale {mag})"
                    );
                    // Against the unquantized activations, within what quantizing them moved.
                    let (want_raw, _) = reference(&x, t, r);
                    let moved: f64 = (0..cols)
                        .map(|i| {
                            let (xi, si) = (x[t * cols + i], seen[t * cols + i]);
                            f64::from(wf[r * cols + i]).abs() * f64::from(xi - si).abs()
                        })
                        .sum();
                    assert!(
                        (got - want_raw).abs() <= moved + 1e-5 * mag + 1e-30,
                        "{what} raw activations: {got} vs {want_raw} (moved {moved})"
                    );
                }
                if t + 1 < m {
                    assert!(out[t * ldo + rows..(t + 1) * ldo]
                        .iter()
                        .all(|v| v.is_nan()));
                }
            }
            assert!(out.last().unwrap().is_nan(), "wrote past the last row");
        }
    }
}

fn shapes(ty: GgmlType) -> Vec<(usize, usize)> {
    let b = ty.block_size().max(32);
    // One block; several blocks with rows around the tile sizes; the Gemma widths.
    vec![(5, b), (37, 3 * b), (16, 640.max(b)), (19, 2 * 256.max(b))]
}

#[test]
fn every_type_matches_reference_at_every_level() {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    for ty in TYPES {
        for (rows, cols) in shapes(ty) {
            if cols % ty.block_size() != 0 {
                continue;
            }
            for raw in [false, true] {
                if raw && !ty.is_quantized() {
                    continue;
                }
                check(
                    &Case {
                        ty,
                        rows,
                        cols,
                        raw,
                    },
                    &mut rng,
                );
            }
        }
    }
}

/// Batch sizes around every kernel boundary: the small-batch row kernels (up to 5 tokens), the
/// panel product's token tiles (4 tokens with AVX2, 8 with AVX-512) and their tails.
const BATCH_MS: [usize; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33];

/// A server batches many users' tokens into one product: each token's output must be exactly what
/// it gets alone, whatever the batch size, its place in the batch and the thread count. Rows that
/// are not a whole number of panels (16) or row steps (8) check the tails.
#[test]
fn every_token_gets_the_same_bits_in_any_batch() {
    let mut rng = StdRng::seed_from_u64(0xba7c);
    let n_tok = *BATCH_MS.last().unwrap();
    let pools: Vec<rayon::ThreadPool> = [1, 3]
        .iter()
        .map(|&n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        })
        .collect();
    for ty in TYPES {
        let b = ty.block_size().max(32);
        for (rows, cols) in [(5, b), (37, 3 * b), (19, 8 * b)] {
            for raw in [false, true] {
                if raw && !ty.is_quantized() {
                    continue;
                }
                let wb = weights(ty, rows, cols, raw, &mut rng);
                let w = WeightMatrix::new(ty, &wb, rows, cols).unwrap();
                let x: Vec<f32> = (0..n_tok)
                    .flat_map(|t| {
                        let scale = 10f32.powi(t as i32 % 5 - 2);
                        (0..cols)
                            .map(|_| varied(&mut rng) * scale)
                            .collect::<Vec<_>>()
                    })
                    .collect();
                for level in SimdLevel::available() {
                    let mut act = Activations::new();
                    let mut alone = vec![0u32; n_tok * rows];
                    let mut out = vec![0f32; rows];
                    for t in 0..n_tok {
                        act.quantize_for(ty, &x[t * cols..(t + 1) * cols], 1, cols);
                        matmul_with(level, &w, &act, &mut out, rows).unwrap();
                        for (a, v) in alone[t * rows..(t + 1) * rows].iter_mut().zip(&out) {
                            *a = v.to_bits();
                        }
                    }
                    for (i, &m) in BATCH_MS.iter().enumerate() {
                        // The batch starts at token `first` and wraps around.
                        for (j, first) in [0, 11, 29].into_iter().enumerate() {
                            let order: Vec<usize> = (0..m).map(|p| (first + p) % n_tok).collect();
                            let xs: Vec<f32> = order
                                .iter()
                                .flat_map(|&t| x[t * cols..(t + 1) * cols].iter().copied())
                                .collect();
                            act.quantize_for(ty, &xs, m, cols);
                            let mut out = vec![f32::NAN; m * rows];
                            pools[(i + j) % 2]
                                .install(|| matmul_with(level, &w, &act, &mut out, rows))
                                .unwrap();
                            for (p, &t) in order.iter().enumerate() {
                                for r in 0..rows {
                                    let (got, want) = (out[p * rows + r], alone[t * rows + r]);
                                    assert!(
                                        got.to_bits() == want,
                                        "{ty} {rows}x{cols} raw={raw} {level} m={m}: token {t} at \
                                         {p}, row {r}: {got:e} in the batch, {:e} alone",
                                        f32::from_bits(want)
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn zero_rows_and_tokens_are_no_ops() {
    let bytes = vec![0u8; 0];
    let w = WeightMatrix::new(GgmlType::Q4_0, &bytes, 0, 64).unwrap();
    let mut act = Activations::new();
    act.quantize_for(GgmlType::Q4_0, &[1.0; 64], 1, 64);
    let mut out = vec![7.0f32; 1];
    for level in SimdLevel::available() {
        matmul_with(level, &w, &act, &mut out, 0).unwrap();
    }
    assert_eq!(out, [7.0]);
}

#[test]
fn bad_shapes_and_types_are_errors() {
    let q4 = vec![0u8; 18 * 4];
    assert!(matches!(
        WeightMatrix::new(GgmlType::IQ2_XXS, &q4, 1, 256),
        Err(MatmulError::Unsupported(GgmlType::IQ2_XXS))
    ));
    assert!(matches!(
        WeightMatrix::new(GgmlType::Q8_K, &q4, 1, 256),
        Err(MatmulError::Unsupported(_))
    ));
    assert!(matches!(
        WeightMatrix::new(GgmlType::Q4_0, &q4, 2, 48),
        Err(MatmulError::PartialBlock { .. })
    ));
    assert!(matches!(
        WeightMatrix::new(GgmlType::Q4_0, &q4, 3, 32),
        Err(MatmulError::Length { .. })
    ));
    let w = WeightMatrix::new(GgmlType::Q4_0, &q4, 2, 64).unwrap();
    assert_eq!((w.ty(), w.rows(), w.cols()), (GgmlType::Q4_0, 2, 64));

    let mut act = Activations::new();
    let mut out = vec![0f32; 16];
    assert!(matches!(
        matmul_with(SimdLevel::Portable, &w, &act, &mut out, 2),
        Err(MatmulError::Cols { .. }) | Err(MatmulError::Prepared(_))
    ));
    act.quantize_for(GgmlType::Q4_K, &[0.5; 256], 1, 256);
    let q4k = vec![0u8; 144 * 2];
    let wk = WeightMatrix::new(GgmlType::Q4_K, &q4k, 2, 256).unwrap();
    assert!(matches!(
        matmul_with(SimdLevel::Portable, &w, &act, &mut out, 2),
        Err(MatmulError::Cols { .. })
    ));
    // Same width, other activation format.
    act.quantize_for(GgmlType::Q8_0, &[0.5; 256], 1, 256);
    assert!(matches!(
        matmul_with(SimdLevel::Portable, &wk, &act, &mut out, 2),
        Err(MatmulError::Prepared(GgmlType::Q4_K))
    ));
    // Q6_K groups by 16, Q4_K by 32: not interchangeable.
    act.quantize_for(GgmlType::Q6_K, &[0.5; 256], 1, 256);
    assert!(matches!(
        matmul_with(SimdLevel::Portable, &wk, &act, &mut out, 2),
        Err(MatmulError::Prepared(_))
    ));
    act.quantize_for(GgmlType::Q5_K, &[0.5; 512], 2, 256);
    assert!(matmul_with(SimdLevel::Portable, &wk, &act, &mut out, 2).is_ok());
    assert!(matches!(
        matmul_with(SimdLevel::Portable, &wk, &act, &mut out[..3], 2),
        Err(MatmulError::Output { .. })
    ));
    assert!(matches!(
        matmul_with(SimdLevel::Portable, &wk, &act, &mut out, 1),
        Err(MatmulError::Output { .. })
    ));
    for level in SimdLevel::ALL {
        if !level.is_available() {
            assert_eq!(
                matmul_with(level, &wk, &act, &mut out, 2),
                Err(MatmulError::Level(level))
            );
        }
    }
}

#[test]
fn dequantize_row_matches_reference() {
    let mut rng = StdRng::seed_from_u64(7);
    let bytes = weights(GgmlType::Q6_K, 1, 512, false, &mut rng);
    let mut want = vec![0f32; 512];
    akunu_quant::dequantize(GgmlType::Q6_K, &bytes, &mut want).unwrap();
    let mut got = vec![0f32; 512];
    dequantize_row(GgmlType::Q6_K, &bytes, &mut got).unwrap();
    assert_eq!(got, want);
    assert!(dequantize_row(GgmlType::Q6_K, &bytes[1..], &mut got).is_err());
}
