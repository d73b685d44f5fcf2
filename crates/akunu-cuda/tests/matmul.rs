//! The quantized products and the embedding lookup against f64 references computed from
//! `akunu_quant::dequantize`, for every weight type the kernels take.
//!
//! Weights come from `akunu_quant::quantize` of random values and, to reach every bit of every
//! field, from random bytes with sane f16 scales. Outputs start poisoned (NaN) so unwritten
//! elements show, and the rows past `m` and the gaps of strided outputs must stay poisoned.

mod common;

use std::sync::Arc;

use akunu_core::sampling::{Sampler, SamplerParams};
use akunu_core::Activation;
use akunu_cuda::compile::{self, ModuleKey};
use akunu_cuda::matmul::{self, ActScratch, ArgmaxTarget, DeviceMatrix, GridCap, MatmulKernels};
use akunu_cuda::sample::Chain;
use akunu_cuda::{CudaError, DeviceBuffer, Gpu};
use akunu_quant::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use common::{gpu, random, rel_err, POISON};

const TYPES: &[GgmlType] = matmul::SUPPORTED;

/// Relative tolerance against a reference that uses the activations as the kernels see them
/// (int8 levels per 32 values for quantized weights): only f32 rounding differs.
fn tolerance(ty: GgmlType) -> f64 {
    if ty.is_quantized() {
        2e-3
    } else {
        1e-5
    }
}

/// Relative tolerance against the exact f64 product, over whole outputs of at least
/// [`POOLED_MIN`] values: the int8 activations cost about 1/254 of each value.
const EXACT_TOL: f64 = 1e-2;
const POOLED_MIN: usize = 64;

/// The inputs as the kernels for `ty` use them: each 32 values quantized to `round(v/d)·d`
/// with `d = amax/127` for quantized weights, unchanged for float weights.
fn as_seen(ty: GgmlType, x: &[f32], cols: usize, stride: usize) -> Vec<f32> {
    if !ty.is_quantized() {
        return x.to_vec();
    }
    let mut out = x.to_vec();
    for row in out.chunks_mut(stride) {
        for g in row[..cols].chunks_exact_mut(32) {
            let amax = g.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            g.iter_mut()
                .for_each(|v| *v = (*v * id).round_ties_even().clamp(-127.0, 127.0) * d);
        }
    }
    out
}

/// A `rows x cols` matrix of `ty` quantized from random values, and its dequantized values.
fn quantized(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut x = random(rows * cols, 1.0, seed);
    // Rows of different magnitudes, so per-block scales differ.
    for (r, row) in x.chunks_exact_mut(cols).enumerate() {
        let s = 0.25 + (r % 5) as f32 * 0.5;
        row.iter_mut().for_each(|v| *v *= s);
    }
    let bytes_len = ty.bytes_for((rows * cols) as u64).unwrap() as usize;
    let mut bytes = vec![0u8; bytes_len];
    akunu_quant::quantize(ty, &x, &mut bytes).unwrap();
    let mut w = vec![0f32; rows * cols];
    akunu_quant::dequantize(ty, &bytes, &mut w).unwrap();
    (bytes, w)
}

/// Byte offsets of a block's f16 scale fields (d, m, dmin).
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType as T;
    match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::IQ4_XS => &[0],
        T::Q4_1 | T::Q5_1 | T::Q4_K | T::Q5_K => &[0, 2],
        T::Q2_K => &[80, 82],
        T::Q3_K => &[108],
        T::Q6_K => &[208],
        _ => &[],
    }
}

/// Random bytes for a quantized `ty` (every quant, scale and high bit pattern) with f16 scale
/// fields set to sane magnitudes; random finite values for the float types.
fn random_bytes(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    if !ty.is_quantized() {
        return quantized(ty, rows, cols, seed);
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let n = ty.bytes_for((rows * cols) as u64).unwrap() as usize;
    let mut bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
    for blk in bytes.chunks_exact_mut(ty.type_size()) {
        for &o in f16_fields(ty) {
            let v = half::f16::from_f32(rng.random_range(-0.02f32..0.02));
            blk[o..o + 2].copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
    let mut w = vec![0f32; rows * cols];
    akunu_quant::dequantize(ty, &bytes, &mut w).unwrap();
    (bytes, w)
}

/// `m` rows of `stride` random values as f64 references and a device buffer.
fn inputs(gpu: &Gpu, m: usize, stride: usize, seed: u64) -> (Vec<f32>, DeviceBuffer) {
    let x = random(m * stride, 1.0, seed);
    let buf = gpu.upload(&x).unwrap();
    (x, buf)
}

/// `Σ_c w[r][c]·x[t][c]` in f64 for each token t and row r (`out[t][r]`).
fn reference(
    w: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    stride: usize,
    m: usize,
) -> Vec<Vec<f64>> {
    (0..m)
        .map(|t| {
            let xt = &x[t * stride..t * stride + cols];
            (0..rows)
                .map(|r| {
                    w[r * cols..(r + 1) * cols]
                        .iter()
                        .zip(xt)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum()
                })
                .collect()
        })
        .collect()
}

/// A poisoned output of `m + 1` rows of `stride` floats.
fn poisoned(gpu: &Gpu, m: usize, stride: usize) -> DeviceBuffer {
    gpu.upload(&vec![POISON; (m + 1) * stride]).unwrap()
}

/// Checks the `m x rows` block of `y` (rows `stride` apart): per token within `tol` of `want`
/// (the reference on the inputs as the kernel sees them), over the whole output within
/// `exact_tol` of `exact` when it is large enough to measure, and everything else still
/// poison.
#[allow(clippy::too_many_arguments)]
fn check_output(
    gpu: &Gpu,
    y: &DeviceBuffer,
    m: usize,
    rows: usize,
    stride: usize,
    want: &[Vec<f64>],
    exact: &[Vec<f64>],
    (tol, exact_tol): (f64, f64),
    what: &str,
) {
    let mut got = vec![0f32; (m + 1) * stride];
    gpu.read(y, 0, &mut got).unwrap();
    for (i, v) in got.iter().enumerate() {
        let (t, r) = (i / stride, i % stride);
        if t < m && r < rows {
            assert!(v.is_finite(), "{what}: y[{t}][{r}] not written ({v})");
        } else {
            assert_eq!(
                v.to_bits(),
                POISON.to_bits(),
                "{what}: y[{t}][{r}] written outside the output"
            );
        }
    }
    let mut all_got = Vec::new();
    let mut all_exact = Vec::new();
    for t in 0..m {
        let row = &got[t * stride..t * stride + rows];
        let e = rel_err(row, &want[t]);
        if e > tol {
            let (r, _) = row
                .iter()
                .zip(&want[t])
                .map(|(&g, &w)| (g as f64 - w).abs())
                .enumerate()
                .fold((0, 0.0), |b, (i, d)| if d > b.1 { (i, d) } else { b });
            panic!(
                "{what}: token {t}: relative error {e:.2e} > {tol:.0e}; worst row {r}: {} vs \
                 {}",
                row[r], want[t][r]
            );
        }
        all_got.extend_from_slice(row);
        all_exact.extend_from_slice(&exact[t]);
    }
    if all_got.len() >= POOLED_MIN {
        let e = rel_err(&all_got, &all_exact);
        assert!(
            e <= exact_tol,
            "{what}: relative error {e:.2e} > {exact_tol:.0e} against the exact product"
        );
    }
}

/// Shapes `(rows, cols, m)` for a type: odd row counts, odd chunk counts, every batch variant.
fn shapes(ty: GgmlType) -> Vec<(usize, usize, usize)> {
    let mut v = vec![
        (1, 256, 1),
        (7, 512, 2),
        (257, 256, 3),
        (33, 4096, 5),
        (20, 5120, 8),
        (3, 768, 13),
        (17, 2304, 16),
        (131, 2304, 2),
        (64, 1280, 1),
    ];
    if ty.block_size() == 32 || !ty.is_quantized() {
        v.extend([(5, 32, 1), (9, 96, 4), (11, 160, 16), (6, 4128, 2)]);
    }
    v
}

fn kernels(gpu: &Arc<Gpu>) -> MatmulKernels {
    MatmulKernels::new(gpu, TYPES).unwrap()
}

fn run_gemv_case(
    gpu: &Arc<Gpu>,
    k: &MatmulKernels,
    ty: GgmlType,
    (bytes, w): &(Vec<u8>, Vec<f32>),
    (rows, cols, m): (usize, usize, usize),
    seed: u64,
    what: &str,
) {
    let dm = DeviceMatrix::upload(gpu, ty, bytes, rows, cols).unwrap();
    assert_eq!((dm.ty(), dm.rows(), dm.cols()), (ty, rows, cols));
    // Strided input and output in odd cases, dense otherwise; a bias on every other case.
    let strided = seed % 2 == 1;
    let x_stride = if strided { cols + 36 } else { cols };
    let y_stride = if strided { rows + 5 } else { rows };
    let (x, xb) = inputs(gpu, m, x_stride, seed);
    let mut acts = ActScratch::new(gpu, 16, cols.max(4096)).unwrap();
    acts.prepare(gpu, k, xb.ptr(), x_stride, m, cols).unwrap();
    let mut want = reference(w, rows, cols, &as_seen(ty, &x, cols, x_stride), x_stride, m);
    let mut exact = reference(w, rows, cols, &x, x_stride, m);
    let bias_vals = random(rows, 0.5, seed + 7);
    let bias = if seed.is_multiple_of(3) {
        for row in want.iter_mut().chain(&mut exact) {
            row.iter_mut()
                .zip(&bias_vals)
                .for_each(|(y, &b)| *y += b as f64);
        }
        Some(gpu.upload(&bias_vals).unwrap())
    } else {
        None
    };
    let y = poisoned(gpu, m, y_stride);
    matmul::gemv(
        gpu,
        k,
        &dm,
        &acts,
        m,
        y.ptr(),
        y_stride,
        bias.as_ref().map(|b| b.ptr()),
    )
    .unwrap();
    gpu.sync().unwrap();
    check_output(
        gpu,
        &y,
        m,
        rows,
        y_stride,
        &want,
        &exact,
        (tolerance(ty), EXACT_TOL),
        &format!("{what} {ty} {rows}x{cols} m={m}"),
    );
}

#[test]
fn gemv_matches_reference_for_every_type_and_shape() {
    let Some(gpu) = gpu() else { return };
    for (k, split) in split_configs(&gpu) {
        for &ty in TYPES {
            for (i, &shape) in shapes(ty).iter().enumerate() {
                let seed = 1000 * (ty as u64) + i as u64;
                let w = quantized(ty, shape.0, shape.1, seed);
                run_gemv_case(
                    &gpu,
                    &k,
                    ty,
                    &w,
                    shape,
                    seed,
                    &format!("quantized, {split}"),
                );
            }
        }
    }
}

#[test]
fn products_of_one_launch_match_reference() {
    let Some(gpu) = gpu() else { return };
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::F16,
    ];
    // q, k and v shaped: one tall and two short matrices, the middle one with a bias.
    let (cols, part_rows) = (1024, [130, 9, 37]);
    for (c, (k, split)) in split_configs(&gpu).iter().enumerate() {
        for (i, &ty) in types.iter().enumerate() {
            for m in [1, 5] {
                let seed = 9000 + 100 * c as u64 + 10 * i as u64 + m as u64;
                let (x, xb) = inputs(&gpu, m, cols, seed);
                let mut acts = ActScratch::new(&gpu, m, cols).unwrap();
                acts.prepare(&gpu, k, xb.ptr(), cols, m, cols).unwrap();
                let mut cases = Vec::new();
                for (j, &rows) in part_rows.iter().enumerate() {
                    let (bytes, w) = quantized(ty, rows, cols, seed + 1 + j as u64);
                    let dm = DeviceMatrix::upload(&gpu, ty, &bytes, rows, cols).unwrap();
                    let mut want = reference(&w, rows, cols, &as_seen(ty, &x, cols, cols), cols, m);
                    let mut exact = reference(&w, rows, cols, &x, cols, m);
                    let bias = (j == 1).then(|| random(rows, 0.5, seed + 20));
                    for (row, b) in want
                        .iter_mut()
                        .chain(&mut exact)
                        .flat_map(|r| r.iter_mut().zip(bias.iter().flatten()))
                    {
                        *row += *b as f64;
                    }
                    let bias = bias.map(|b| gpu.upload(&b).unwrap());
                    let y_stride = rows + 3 * j;
                    let y = poisoned(&gpu, m, y_stride);
                    cases.push((dm, y, y_stride, bias, want, exact));
                }
                let parts: Vec<matmul::Product> = cases
                    .iter()
                    .map(|(w, y, y_stride, bias, _, _)| matmul::Product {
                        w,
                        y: y.ptr(),
                        y_stride: *y_stride,
                        bias: bias.as_ref().map(|b| b.ptr()),
                    })
                    .collect();
                matmul::gemv_many(&gpu, k, &parts, &acts, m).unwrap();
                gpu.sync().unwrap();
                for (j, (w, y, y_stride, _, want, exact)) in cases.iter().enumerate() {
                    let what = format!("{ty} part {j} of 3 ({}x{cols}) m={m}, {split}", w.rows());
                    let tol = (tolerance(ty), EXACT_TOL);
                    check_output(&gpu, y, m, w.rows(), *y_stride, want, exact, tol, &what);
                }
            }
        }
    }
}

/// The kernels as the chip config launches them; with rows' columns never split, on one
/// block per row group and on a grid of 3 blocks (so each warp walks several row groups and
/// the last round is partial); split over as many of 8 warps as the row length allows; and
/// batches on the int8 dot products instead of tensor cores, or on tensor cores from 2 tokens
/// with 16 or with 32 rows a block.
fn split_configs(gpu: &Arc<Gpu>) -> Vec<(MatmulKernels, &'static str)> {
    vec![
        (kernels(gpu), "default blocks"),
        (kernels(gpu).with_mma(0, 32), "batches without tensor cores"),
        (
            kernels(gpu).with_mma(2, 16),
            "batches on tensor cores, 16 rows a block",
        ),
        (
            kernels(gpu).with_mma(2, 32),
            "batches on tensor cores, 32 rows a block",
        ),
        (
            kernels(gpu)
                .with_split(4, 0)
                .with_grid_cap(GridCap::Waves(0)),
            "unsplit rows, a block per row group",
        ),
        (
            kernels(gpu)
                .with_split(4, 0)
                .with_grid_cap(GridCap::Blocks(3)),
            "unsplit rows, 3 blocks",
        ),
        (
            kernels(gpu).with_split(8, usize::MAX),
            "rows split over up to 8 warps",
        ),
    ]
}

#[test]
fn gemv_reads_every_bit_of_random_blocks() {
    let Some(gpu) = gpu() else { return };
    let k = kernels(&gpu);
    for &ty in TYPES {
        for (i, &shape) in [(9, 512, 1), (31, 2304, 3), (4, 4096, 16)]
            .iter()
            .enumerate()
        {
            let seed = 77 + 1000 * (ty as u64) + i as u64;
            let w = random_bytes(ty, shape.0, shape.1, seed);
            run_gemv_case(&gpu, &k, ty, &w, shape, seed, "random bytes");
        }
    }
}

fn act_ref(act: Activation, g: f64) -> f64 {
    match act {
        Activation::Silu => g / (1.0 + (-g).exp()),
        Activation::GeluTanh => {
            let u = (2.0 / std::f64::consts::PI).sqrt() * g * (1.0 + 0.044715 * g * g);
            g / (1.0 + (-2.0 * u).exp())
        }
    }
}

#[test]
fn gated_product_matches_reference() {
    let Some(gpu) = gpu() else { return };
    for (k, _) in split_configs(&gpu) {
        gated_cases(&gpu, &k);
    }
}

fn gated_cases(gpu: &Arc<Gpu>, k: &MatmulKernels) {
    // Same-type pairs take the fused kernel; a mixed pair takes two launches.
    let mut pairs: Vec<(GgmlType, GgmlType)> = TYPES.iter().map(|&t| (t, t)).collect();
    pairs.push((GgmlType::Q4_K, GgmlType::Q6_K));
    pairs.push((GgmlType::Q8_0, GgmlType::F16));
    for (i, &(tg, tu)) in pairs.iter().enumerate() {
        for (j, &(rows, cols, m)) in [
            (19, 512, 1),
            (67, 2304, 2),
            (130, 2304, 4),
            (7, 4096, 13),
            (33, 1024, 16),
        ]
        .iter()
        .enumerate()
        {
            let act = if (i + j) % 2 == 0 {
                Activation::Silu
            } else {
                Activation::GeluTanh
            };
            let seed = 5000 + 100 * i as u64 + j as u64;
            let (gb, gw) = quantized(tg, rows, cols, seed);
            let (ub, uw) = quantized(tu, rows, cols, seed + 50);
            let gate = DeviceMatrix::upload(gpu, tg, &gb, rows, cols).unwrap();
            let up = DeviceMatrix::upload(gpu, tu, &ub, rows, cols).unwrap();
            let x_stride = cols + 4 * (j % 2);
            let out_stride = rows + 3 * (j % 2);
            let (x, xb) = inputs(gpu, m, x_stride, seed + 1);
            let mut acts = ActScratch::new(gpu, m, cols).unwrap();
            acts.prepare(gpu, k, xb.ptr(), x_stride, m, cols).unwrap();
            let gated = |g: &[Vec<f64>], u: &[Vec<f64>]| -> Vec<Vec<f64>> {
                g.iter()
                    .zip(u)
                    .map(|(g, u)| {
                        g.iter()
                            .zip(u)
                            .map(|(&g, &u)| act_ref(act, g) * u)
                            .collect()
                    })
                    .collect()
            };
            let g = reference(
                &gw,
                rows,
                cols,
                &as_seen(tg, &x, cols, x_stride),
                x_stride,
                m,
            );
            let u = reference(
                &uw,
                rows,
                cols,
                &as_seen(tu, &x, cols, x_stride),
                x_stride,
                m,
            );
            let g_exact = reference(&gw, rows, cols, &x, x_stride, m);
            let u_exact = reference(&uw, rows, cols, &x, x_stride, m);
            let want = gated(&g, &u);
            let exact = gated(&g_exact, &u_exact);
            let out = poisoned(gpu, m, out_stride);
            matmul::gemv_gated(gpu, k, &gate, &up, &acts, m, out.ptr(), out_stride, act).unwrap();
            // The same prepared input serves plain products afterwards (as q, k and v share
            // one): the gate and up products alone, on the fused launch's path (tensor cores
            // or not; the plain products' own rule may pick the other).
            let on = |gated| k.on_tensor_cores(tg, m, (rows, cols), gated);
            let alone = (tg == tu && on(true) != on(false))
                .then(|| k.clone().with_mma(if on(true) { m } else { 0 }, 0));
            let ka = alone.as_ref().unwrap_or(k);
            let yg = poisoned(gpu, m, rows);
            let yu = poisoned(gpu, m, rows);
            matmul::gemv(gpu, ka, &gate, &acts, m, yg.ptr(), rows, None).unwrap();
            matmul::gemv(gpu, ka, &up, &acts, m, yu.ptr(), rows, None).unwrap();
            gpu.sync().unwrap();
            let what = format!("gated {tg}/{tu} {rows}x{cols} m={m} {act:?}");
            for (y, ty, sim, ex, name) in [
                (&yg, tg, &g, &g_exact, "gate"),
                (&yu, tu, &u, &u_exact, "up"),
            ] {
                let what = format!("{what}, {name} alone");
                check_output(
                    gpu,
                    y,
                    m,
                    rows,
                    rows,
                    sim,
                    ex,
                    (tolerance(ty), EXACT_TOL),
                    &what,
                );
            }
            // The fused output is act(gate)·up of those products (the activation's exponential
            // tail makes a per-token comparison with the f64 reference ill-conditioned when all
            // of a token's gates are negative), and close to the references over all tokens.
            let mut got = vec![0f32; (m + 1) * out_stride];
            gpu.read(&out, 0, &mut got).unwrap();
            let (mut gv, mut uv) = (vec![0f32; m * rows], vec![0f32; m * rows]);
            gpu.read(&yg, 0, &mut gv).unwrap();
            gpu.read(&yu, 0, &mut uv).unwrap();
            let (mut pooled, mut pooled_want, mut pooled_exact) = (vec![], vec![], vec![]);
            for (i, &v) in got.iter().enumerate() {
                let (t, r) = (i / out_stride, i % out_stride);
                if t >= m || r >= rows {
                    assert_eq!(
                        v.to_bits(),
                        POISON.to_bits(),
                        "{what}: [{t}][{r}] written outside"
                    );
                    continue;
                }
                let (gg, uu) = (gv[t * rows + r] as f64, uv[t * rows + r] as f64);
                let e = act_ref(act, gg) * uu;
                let bound = 1e-4 * e.abs() + 1e-5 * uu.abs() * (1.0 + gg.abs());
                assert!(
                    (v as f64 - e).abs() <= bound,
                    "{what}: [{t}][{r}] = {v}, act({gg})·{uu} = {e}"
                );
                pooled.push(v);
                pooled_want.push(want[t][r]);
                pooled_exact.push(exact[t][r]);
            }
            if pooled.len() >= POOLED_MIN {
                let e = rel_err(&pooled, &pooled_want);
                assert!(
                    e <= 2.0 * tolerance(tg).max(tolerance(tu)),
                    "{what}: relative error {e:.2e}"
                );
                let e = rel_err(&pooled, &pooled_exact);
                assert!(
                    e <= 2.0 * EXACT_TOL,
                    "{what}: relative error {e:.2e} against the exact product"
                );
            }
        }
    }
}

#[test]
fn embed_matches_dequantize() {
    let Some(gpu) = gpu() else { return };
    let k = kernels(&gpu);
    for &ty in TYPES {
        for (rows, cols) in [(37, 256), (5, 2304)] {
            for random_blocks in [false, true] {
                let seed = 9000 + ty as u64;
                let (bytes, w) = if random_blocks {
                    random_bytes(ty, rows, cols, seed)
                } else {
                    quantized(ty, rows, cols, seed)
                };
                let table = DeviceMatrix::upload(&gpu, ty, &bytes, rows, cols).unwrap();
                // Boundary ids, repeats, and two ids past the table (which give zero rows).
                let tokens: Vec<u32> = vec![
                    0,
                    rows as u32 - 1,
                    3,
                    rows as u32 - 1,
                    0,
                    rows as u32,
                    u32::MAX,
                ];
                let m = tokens.len();
                let tb = gpu.upload(&tokens).unwrap();
                let out = gpu.upload(&vec![POISON; (m + 1) * cols]).unwrap();
                let scale = 1.7f32;
                matmul::embed(&gpu, &k, &table, tb.ptr(), m, out.ptr(), scale).unwrap();
                let mut got = vec![0f32; (m + 1) * cols];
                gpu.read(&out, 0, &mut got).unwrap();
                for (t, &tok) in tokens.iter().enumerate() {
                    let row = &got[t * cols..(t + 1) * cols];
                    if (tok as usize) < rows {
                        let want = &w[tok as usize * cols..(tok as usize + 1) * cols];
                        let amax = want.iter().fold(0f32, |a, v| a.max(v.abs())) * scale;
                        for (c, (&g, &v)) in row.iter().zip(want).enumerate() {
                            let d = (g - v * scale).abs();
                            assert!(
                                d <= 1e-6 * amax,
                                "{ty} {rows}x{cols}: token {tok} [{c}] = {g}, want {}",
                                v * scale
                            );
                        }
                    } else {
                        assert!(
                            row.iter().all(|&v| v == 0.0),
                            "{ty}: id {tok} past the table"
                        );
                    }
                }
                assert!(
                    got[m * cols..]
                        .iter()
                        .all(|v| v.to_bits() == POISON.to_bits()),
                    "{ty}: wrote past m rows"
                );
            }
        }
    }
}

#[test]
fn embed_norm_matches_the_lookup_and_the_norm() {
    let Some(gpu) = gpu() else { return };
    let k = kernels(&gpu);
    for &ty in TYPES {
        // 8 groups a row, and 72 (a block of 96 threads, 24 of them idle).
        for cols in [256, 2304] {
            let rows = 11;
            let (bytes, _) = quantized(ty, rows, cols, 7100 + ty as u64);
            let table = DeviceMatrix::upload(&gpu, ty, &bytes, rows, cols).unwrap();
            // Repeats, the last row, and an id past the table (a zero row: its norm is zero).
            let tokens: Vec<u32> = vec![3, 0, rows as u32 - 1, 3, rows as u32];
            let m = tokens.len();
            let tb = gpu.upload(&tokens).unwrap();
            let nw = random(cols, 1.0, 7200 + cols as u64);
            let nwd = gpu.upload(&nw).unwrap();
            let (scale, eps) = (1.3f32, 1e-5f32);
            let looked_up = gpu.upload(&vec![POISON; m * cols]).unwrap();
            matmul::embed(&gpu, &k, &table, tb.ptr(), m, looked_up.ptr(), scale).unwrap();
            let mut want_res = vec![0f32; m * cols];
            gpu.read(&looked_up, 0, &mut want_res).unwrap();
            for quantize in [false, true] {
                let what = format!("{ty} {cols} quantized {quantize}");
                let residual = gpu.upload(&vec![POISON; m * cols]).unwrap();
                let normed = gpu.upload(&vec![POISON; m * cols]).unwrap();
                let q = gpu.upload(&vec![0x55u8; m * cols]).unwrap();
                let qs = gpu.upload(&vec![POISON; m * cols / 8]).unwrap();
                let norm = matmul::EmbedNorm {
                    weight: nwd.ptr(),
                    eps,
                    normed: normed.ptr(),
                };
                let quantized = quantize.then(|| (q.ptr(), qs.ptr()));
                matmul::embed_norm(
                    &gpu,
                    &k,
                    &table,
                    tb.ptr(),
                    m,
                    residual.ptr(),
                    scale,
                    &norm,
                    quantized,
                )
                .unwrap();
                let mut res = vec![0f32; m * cols];
                gpu.read(&residual, 0, &mut res).unwrap();
                // The lookup's values to the bit.
                assert!(
                    res.iter()
                        .zip(&want_res)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: residual differs from the lookup"
                );
                let mut got = vec![0f32; m * cols];
                gpu.read(&normed, 0, &mut got).unwrap();
                for (t, (row, r)) in got.chunks(cols).zip(res.chunks(cols)).enumerate() {
                    let ms = r.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64;
                    let inv = 1.0 / (ms + eps as f64).sqrt();
                    let want: Vec<f64> = r
                        .iter()
                        .zip(&nw)
                        .map(|(&v, &g)| v as f64 * inv * g as f64)
                        .collect();
                    let amax = want.iter().fold(0f64, |a, v| a.max(v.abs()));
                    for (c, (&g, &v)) in row.iter().zip(&want).enumerate() {
                        assert!(
                            (g as f64 - v).abs() <= 1e-5 * amax,
                            "{what}: token {t} [{c}] = {g}, want {v}"
                        );
                    }
                    if tokens[t] as usize >= rows {
                        assert!(row.iter().all(|&v| v == 0.0), "{what}: id past the table");
                    }
                }
                let mut levels = vec![0i8; m * cols];
                gpu.read(&q, 0, &mut levels).unwrap();
                let mut sums = vec![0f32; m * cols / 8];
                gpu.read(&qs, 0, &mut sums).unwrap();
                if quantize {
                    common::check_act_quant(&what, &got, &levels, &sums);
                } else {
                    assert!(levels.iter().all(|&l| l == 0x55), "{what}: levels written");
                    assert!(sums.iter().all(|v| v.is_nan()), "{what}: sums written");
                }
            }
        }
    }
}

/// [`matmul::gemv_argmax`] of `dm` with the prepared `acts`, launched twice (the second on
/// the scratch the first left); checks the chain's bookkeeping (the token in `out` and twice in
/// the chain's list, the count 2, the position moved on twice) and returns the token.
fn argmax_twice(gpu: &Arc<Gpu>, k: &MatmulKernels, dm: &DeviceMatrix, acts: &ActScratch) -> u32 {
    let out = gpu.upload(&[u32::MAX]).unwrap();
    let positions = gpu.upload(&[41u32]).unwrap();
    let list = gpu.upload(&[u32::MAX; 3]).unwrap();
    let count = gpu.upload(&[0u32]).unwrap();
    let scratch = gpu.alloc(matmul::ARGMAX_SCRATCH_BYTES).unwrap();
    let target = ArgmaxTarget {
        out: out.ptr(),
        chain: Chain {
            positions: positions.ptr(),
            out: list.ptr(),
            count: count.ptr(),
        },
        scratch: scratch.ptr(),
    };
    for _ in 0..2 {
        matmul::gemv_argmax(gpu, k, dm, acts, &target).unwrap();
    }
    gpu.sync().unwrap();
    let read = |b: &DeviceBuffer, n: usize| {
        let mut v = vec![0u32; n];
        gpu.read(b, 0, &mut v).unwrap();
        v
    };
    let token = read(&out, 1)[0];
    assert_eq!(
        read(&list, 3),
        [token, token, u32::MAX],
        "the chain's tokens"
    );
    assert_eq!(read(&count, 1), [2], "the chain's count");
    assert_eq!(read(&positions, 1), [43], "the chain's position");
    token
}

/// The CPU's greedy choice over `v` (`akunu_core::sampling`): the largest, ties to the lowest
/// index, NaN skipped, 0 if all are NaN.
fn argmax_of(v: &[f32]) -> u32 {
    let mut greedy = Sampler::new(SamplerParams::greedy(), v.len()).unwrap();
    greedy.sample(&mut v.to_vec())
}

/// `dm`'s written single-token product of the prepared `acts` (rows f32).
fn written_product(
    gpu: &Arc<Gpu>,
    k: &MatmulKernels,
    dm: &DeviceMatrix,
    acts: &ActScratch,
) -> Vec<f32> {
    let y = poisoned(gpu, 1, dm.rows());
    matmul::gemv(gpu, k, dm, acts, 1, y.ptr(), dm.rows(), None).unwrap();
    let mut got = vec![0f32; dm.rows()];
    gpu.read(&y, 0, &mut got).unwrap();
    got
}

/// The output product's own argmax picks the row the written products' argmax picks: the same
/// row where the products stream (vocabulary-sized: each warp walks several row groups, and
/// every row's sum is the streamed product's to the bit), a row whose exact product is the
/// largest within the tolerance otherwise; for every weight type.
#[test]
fn output_product_argmax_matches_the_products() {
    let Some(gpu) = gpu() else { return };
    let k = kernels(&gpu);
    let mut acts = ActScratch::new(&gpu, 1, 4096).unwrap();
    for &ty in TYPES {
        for (i, &(rows, cols)) in [(1, 256), (300, 512), (40_000, 256)].iter().enumerate() {
            let seed = 7000 + 100 * ty as u64 + i as u64;
            let (bytes, w) = random_bytes(ty, rows, cols, seed);
            let dm = DeviceMatrix::upload(&gpu, ty, &bytes, rows, cols).unwrap();
            let (x, xb) = inputs(&gpu, 1, cols, seed);
            acts.prepare(&gpu, &k, xb.ptr(), cols, 1, cols).unwrap();
            let want = reference(&w, rows, cols, &as_seen(ty, &x, cols, cols), cols, 1).remove(0);
            let token = argmax_twice(&gpu, &k, &dm, &acts);
            let what = format!("{ty} {rows}x{cols}");
            if rows > 10_000 {
                let got = written_product(&gpu, &k, &dm, &acts);
                assert_eq!(
                    token,
                    argmax_of(&got),
                    "{what}: the written products' argmax"
                );
            }
            let max = want.iter().cloned().fold(f64::MIN, f64::max);
            let scale = want.iter().fold(0f64, |a, v| a.max(v.abs()));
            assert!(
                want[token as usize] >= max - tolerance(ty) * scale,
                "{what}: row {token} ({}) is not the largest ({max})",
                want[token as usize]
            );
        }
    }
}

/// Equal products go to the lowest row, NaN products are skipped, and all NaN gives row 0, as
/// the argmax over written logits has them.
#[test]
fn output_product_argmax_ties_and_nan() {
    let Some(gpu) = gpu() else { return };
    let k = kernels(&gpu);
    let mut acts = ActScratch::new(&gpu, 1, 4096).unwrap();
    let (rows, cols) = (40_000, 256);
    for ty in [GgmlType::Q4_0, GgmlType::Q6_K, GgmlType::F16] {
        let row_bytes = ty.bytes_for(cols as u64).unwrap() as usize;
        let (_, xb) = inputs(&gpu, 1, cols, 3);
        acts.prepare(&gpu, &k, xb.ptr(), cols, 1, cols).unwrap();
        // Two distinct rows: the first 7,001 rows are copies of the smaller, the rest of the
        // larger, so the larger's first copy must win.
        let (two, _) = random_bytes(ty, 2, cols, 11);
        let small = DeviceMatrix::upload(&gpu, ty, &two, 2, cols).unwrap();
        let pair = written_product(&gpu, &k, &small, &acts);
        assert_ne!(pair[0], pair[1], "{ty}: two rows of one product");
        let (lo, hi) = if pair[0] < pair[1] { (0, 1) } else { (1, 0) };
        let copy = |r: usize| &two[r * row_bytes..(r + 1) * row_bytes];
        let mut bytes = Vec::with_capacity(rows * row_bytes);
        (0..rows).for_each(|r| bytes.extend_from_slice(copy(if r <= 7000 { lo } else { hi })));
        let dm = DeviceMatrix::upload(&gpu, ty, &bytes, rows, cols).unwrap();
        assert_eq!(argmax_twice(&gpu, &k, &dm, &acts), 7001, "{ty}: ties");
        // NaN in the winning row: the best of the others wins.
        let (mut bytes, _) = random_bytes(ty, rows, cols, 12);
        let nan = |bytes: &mut [u8], r: usize| {
            let at = r * row_bytes + if ty == GgmlType::Q6_K { 208 } else { 0 };
            bytes[at..at + 2].copy_from_slice(&half::f16::NAN.to_bits().to_le_bytes());
        };
        let dm = DeviceMatrix::upload(&gpu, ty, &bytes, rows, cols).unwrap();
        let mut got = written_product(&gpu, &k, &dm, &acts);
        let best = argmax_of(&got) as usize;
        nan(&mut bytes, best);
        got[best] = f32::NAN;
        let dm = DeviceMatrix::upload(&gpu, ty, &bytes, rows, cols).unwrap();
        assert_eq!(
            argmax_twice(&gpu, &k, &dm, &acts),
            argmax_of(&got),
            "{ty}: a NaN row"
        );
        (0..rows).for_each(|r| nan(&mut bytes, r));
        let dm = DeviceMatrix::upload(&gpu, ty, &bytes, rows, cols).unwrap();
        assert_eq!(argmax_twice(&gpu, &k, &dm, &acts), 0, "{ty}: every row NaN");
    }
}

#[test]
fn bad_arguments_are_refused() {
    let Some(gpu) = gpu() else { return };
    let k = MatmulKernels::new(&gpu, &[GgmlType::Q4_0]).unwrap();
    let (bytes, _) = quantized(GgmlType::Q4_0, 4, 64, 1);
    let unsupported =
        |r: Result<DeviceMatrix, CudaError>| matches!(r, Err(CudaError::Unsupported(_)));
    let bounds = |r: Result<(), CudaError>| matches!(r, Err(CudaError::Bounds(_)));
    assert!(unsupported(DeviceMatrix::upload(
        &gpu,
        GgmlType::Q8_K,
        &[0; 292],
        1,
        256
    )));
    assert!(unsupported(DeviceMatrix::upload(
        &gpu,
        GgmlType::IQ2_XXS,
        &[0; 66],
        1,
        256
    )));
    assert!(unsupported(DeviceMatrix::upload(
        &gpu,
        GgmlType::F32,
        &[0; 4 * 48],
        1,
        48
    )));
    assert!(matches!(
        DeviceMatrix::upload(&gpu, GgmlType::Q4_0, &bytes[1..], 4, 64),
        Err(CudaError::Bounds(_))
    ));
    assert!(matches!(
        MatmulKernels::new(&gpu, &[GgmlType::Q8_K]),
        Err(CudaError::Unsupported(_))
    ));
    let w = DeviceMatrix::upload(&gpu, GgmlType::Q4_0, &bytes, 4, 64).unwrap();
    let x = gpu.alloc(4 * 2 * 128).unwrap();
    let y = gpu.alloc(4 * 2 * 4).unwrap();
    let mut acts = ActScratch::new(&gpu, 2, 128).unwrap();
    // Not prepared yet.
    assert!(bounds(matmul::gemv(
        &gpu,
        &k,
        &w,
        &acts,
        1,
        y.ptr(),
        4,
        None
    )));
    assert!(bounds(acts.prepare(&gpu, &k, x.ptr(), 64, 3, 64)));
    assert!(bounds(acts.prepare(&gpu, &k, x.ptr() + 4, 64, 1, 64)));
    assert!(bounds(acts.prepare(&gpu, &k, x.ptr(), 32, 1, 64)));
    assert!(matches!(
        acts.prepare(&gpu, &k, x.ptr(), 128, 1, 48),
        Err(CudaError::Unsupported(_))
    ));
    acts.prepare(&gpu, &k, x.ptr(), 128, 2, 128).unwrap();
    // Columns differ from the prepared input's.
    assert!(bounds(matmul::gemv(
        &gpu,
        &k,
        &w,
        &acts,
        1,
        y.ptr(),
        4,
        None
    )));
    acts.prepare(&gpu, &k, x.ptr(), 64, 2, 64).unwrap();
    assert!(bounds(matmul::gemv(
        &gpu,
        &k,
        &w,
        &acts,
        3,
        y.ptr(),
        4,
        None
    )));
    assert!(bounds(matmul::gemv(
        &gpu,
        &k,
        &w,
        &acts,
        2,
        y.ptr(),
        3,
        None
    )));
    assert!(bounds(matmul::gemv(
        &gpu,
        &k,
        &w,
        &acts,
        1,
        y.ptr(),
        4,
        Some(0)
    )));
    assert!(bounds(matmul::embed(
        &gpu,
        &k,
        &w,
        x.ptr(),
        1,
        y.ptr() + 4,
        1.0
    )));
    // The norm's output misaligned, its epsilon not a number.
    for (normed, eps) in [(y.ptr() + 4, 1e-5), (y.ptr(), f32::NAN)] {
        let norm = matmul::EmbedNorm {
            weight: x.ptr(),
            eps,
            normed,
        };
        assert!(bounds(matmul::embed_norm(
            &gpu,
            &k,
            &w,
            x.ptr(),
            1,
            y.ptr(),
            1.0,
            &norm,
            None
        )));
    }
    let other = DeviceMatrix::upload(
        &gpu,
        GgmlType::Q8_0,
        &quantized(GgmlType::Q8_0, 4, 64, 2).0,
        4,
        64,
    )
    .unwrap();
    assert!(matches!(
        matmul::gemv(&gpu, &k, &other, &acts, 1, y.ptr(), 4, None),
        Err(CudaError::Unsupported(_))
    ));
    matmul::gemv(&gpu, &k, &w, &acts, 2, y.ptr(), 4, None).unwrap();
    // The residual norm product: one prepared row only, rows a multiple of 32, real outputs.
    let norm_out = matmul::ResidualNorm {
        residual: x.ptr(),
        weight: x.ptr(),
        eps: 1e-6,
        normed: y.ptr(),
    };
    assert!(matches!(
        matmul::gemv_residual_norm(&gpu, &k, &w, None, &mut acts, &norm_out),
        Err(CudaError::Unsupported(_))
    ));
    acts.prepare(&gpu, &k, x.ptr(), 64, 1, 64).unwrap();
    assert!(matches!(
        matmul::gemv_residual_norm(&gpu, &k, &w, None, &mut acts, &norm_out),
        Err(CudaError::Unsupported(_))
    ));
    let (bytes32, _) = quantized(GgmlType::Q4_0, 32, 64, 3);
    let w32 = DeviceMatrix::upload(&gpu, GgmlType::Q4_0, &bytes32, 32, 64).unwrap();
    for bad in [
        matmul::ResidualNorm {
            normed: y.ptr() + 4,
            ..norm_out
        },
        matmul::ResidualNorm {
            residual: 0,
            ..norm_out
        },
        matmul::ResidualNorm {
            eps: f32::NAN,
            ..norm_out
        },
    ] {
        assert!(bounds(matmul::gemv_residual_norm(
            &gpu, &k, &w32, None, &mut acts, &bad
        )));
    }
    assert!(bounds(matmul::gemv_residual_norm(
        &gpu,
        &k,
        &w32,
        Some(0),
        &mut acts,
        &norm_out
    )));
    // An unquantized input: refused by the plain products, and by the residual norm product
    // beyond the width its blocks can hold quantized.
    acts.prepare_unquantized(&gpu, x.ptr(), 64, 1, 64).unwrap();
    assert!(matches!(
        matmul::gemv(&gpu, &k, &w32, &acts, 1, y.ptr(), 32, None),
        Err(CudaError::Unsupported(_))
    ));
    let wide_cols = (gpu.chip.smem_per_block * 2 / 3).next_multiple_of(1024);
    let wide = DeviceMatrix::upload(
        &gpu,
        GgmlType::Q4_0,
        &quantized(GgmlType::Q4_0, 32, wide_cols, 4).0,
        32,
        wide_cols,
    )
    .unwrap();
    let mut wide_acts = ActScratch::new(&gpu, 1, wide_cols).unwrap();
    let wide_x = gpu.alloc(wide_cols * 4).unwrap();
    wide_acts
        .prepare_unquantized(&gpu, wide_x.ptr(), wide_cols, 1, wide_cols)
        .unwrap();
    assert!(!matmul::residual_norm_quantizes(&gpu, &k, &wide));
    assert!(matches!(
        matmul::gemv_residual_norm(&gpu, &k, &wide, None, &mut wide_acts, &norm_out),
        Err(CudaError::Unsupported(_))
    ));
    gpu.sync().unwrap();
}

/// `gemv_residual_norm` against f64: the residual it leaves is residual + W·x (+ bias) on the
/// input as the kernel sees it, and the products of the input it prepares (a multi-matrix and
/// a gated one, on every launch shape) equal those products of norm(residual)·weight, where
/// the norm takes the residual the kernel left.
#[test]
fn residual_norm_product_matches_reference() {
    let Some(gpu) = gpu() else { return };
    if !kernels(&gpu).folds_norms() {
        eprintln!("skipped: the chip config leaves norms out of products");
        return;
    }
    for (c, (k, split)) in split_configs(&gpu).iter().enumerate() {
        for (i, &ty) in TYPES.iter().enumerate() {
            for (j, &(rows, cols)) in [(256, 256), (1024, 2304), (2048, 512), (256, 32768)]
                .iter()
                .enumerate()
            {
                let seed = 40_000 + 1000 * c as u64 + 10 * i as u64 + j as u64;
                let what = format!("residual norm {ty} {rows}x{cols}, {split}");
                // About the residual's mean square, so a lost epsilon shows.
                let eps = cols as f32 / 9.0;
                let (bytes, w) = quantized(ty, rows, cols, seed);
                let dm = DeviceMatrix::upload(&gpu, ty, &bytes, rows, cols).unwrap();
                let (x, xb) = inputs(&gpu, 1, cols, seed + 1);
                let res0 = random(rows, 2.0, seed + 2);
                let residual = gpu.upload(&res0).unwrap();
                let gamma: Vec<f32> = random(rows, 0.5, seed + 3)
                    .iter()
                    .map(|g| 1.0 + g)
                    .collect();
                let weight = gpu.upload(&gamma).unwrap();
                // A bias on a shape below and one above the size that takes clusters.
                let bias = (j == 1 || j == 3).then(|| random(rows, 0.5, seed + 4));
                let bias_dev = bias.as_ref().map(|b| gpu.upload(b).unwrap());
                let normed = poisoned(&gpu, 0, rows);
                let mut acts = ActScratch::new(&gpu, 1, cols.max(rows)).unwrap();
                acts.prepare(&gpu, k, xb.ptr(), cols, 1, cols).unwrap();
                let norm_out = matmul::ResidualNorm {
                    residual: residual.ptr(),
                    weight: weight.ptr(),
                    eps,
                    normed: normed.ptr(),
                };
                matmul::gemv_residual_norm(
                    &gpu,
                    k,
                    &dm,
                    bias_dev.as_ref().map(|b| b.ptr()),
                    &mut acts,
                    &norm_out,
                )
                .unwrap();
                // No product before the next input is prepared.
                let unprepared = poisoned(&gpu, 0, rows);
                assert!(matches!(
                    matmul::gemv(&gpu, k, &dm, &acts, 1, unprepared.ptr(), rows, None),
                    Err(CudaError::Bounds(_))
                ));
                // The next products: q, k and v shaped, and a gated pair, of the same type.
                acts.prepare(&gpu, k, normed.ptr(), rows, 1, rows).unwrap();
                let part_rows = [96, 33, 7];
                let parts: Vec<(DeviceMatrix, Vec<f32>, DeviceBuffer)> = part_rows
                    .iter()
                    .enumerate()
                    .map(|(p, &r)| {
                        let (b, wf) = quantized(ty, r, rows, seed + 10 + p as u64);
                        let m = DeviceMatrix::upload(&gpu, ty, &b, r, rows).unwrap();
                        (m, wf, poisoned(&gpu, 1, r))
                    })
                    .collect();
                let products: Vec<matmul::Product> = parts
                    .iter()
                    .map(|(m, _, y)| matmul::Product {
                        w: m,
                        y: y.ptr(),
                        y_stride: m.rows(),
                        bias: None,
                    })
                    .collect();
                matmul::gemv_many(&gpu, k, &products, &acts, 1).unwrap();
                let gated_out = poisoned(&gpu, 1, part_rows[0]);
                let (up_bytes, up_w) = quantized(ty, part_rows[0], rows, seed + 20);
                let up = DeviceMatrix::upload(&gpu, ty, &up_bytes, part_rows[0], rows).unwrap();
                matmul::gemv_gated(
                    &gpu,
                    k,
                    &parts[0].0,
                    &up,
                    &acts,
                    1,
                    gated_out.ptr(),
                    part_rows[0],
                    Activation::Silu,
                )
                .unwrap();
                // Its blocks would write the sums of squares its own readers add up.
                if rows == cols {
                    assert!(matches!(
                        matmul::gemv_residual_norm(&gpu, k, &dm, None, &mut acts, &norm_out),
                        Err(CudaError::Unsupported(_))
                    ));
                }
                gpu.sync().unwrap();

                // The residual: its change is the product on the input as seen.
                let mut got_res = vec![0f32; rows];
                gpu.read(&residual, 0, &mut got_res).unwrap();
                let mut want = reference(&w, rows, cols, &as_seen(ty, &x, cols, cols), cols, 1);
                let mut exact = reference(&w, rows, cols, &x, cols, 1);
                for (r, b) in want[0]
                    .iter_mut()
                    .chain(exact[0].iter_mut())
                    .zip(bias.iter().flatten().chain(bias.iter().flatten()))
                {
                    *r += *b as f64;
                }
                let delta: Vec<f32> = got_res.iter().zip(&res0).map(|(g, r)| g - r).collect();
                let e = rel_err(&delta, &want[0]);
                assert!(e <= tolerance(ty), "{what}: residual change off by {e:.2e}");
                let e = rel_err(&delta, &exact[0]);
                assert!(
                    e <= EXACT_TOL,
                    "{what}: residual change off the exact product by {e:.2e}"
                );

                // The norm's input, and what the next products must see.
                let scaled: Vec<f32> = got_res.iter().zip(&gamma).map(|(r, g)| r * g).collect();
                let mut got_normed = vec![0f32; rows];
                gpu.read(&normed, 0, &mut got_normed).unwrap();
                assert_eq!(got_normed, scaled, "{what}: residual · weight");
                if ty.is_quantized() && k.norms_quantize_inputs() {
                    let case = NormCase {
                        w: &dm,
                        x: &xb,
                        res0: &res0,
                        weight: &weight,
                        eps,
                        bias: bias_dev.as_ref().map(|b| b.ptr()),
                    };
                    quantized_in_blocks_gives_same_bits(
                        &gpu,
                        k,
                        &case,
                        (&got_res, &got_normed),
                        (&parts[0].0, &parts[0].2),
                        &what,
                    );
                }
                let ss: f64 = got_res.iter().map(|&r| r as f64 * r as f64).sum();
                let inv = 1.0 / (ss / rows as f64 + eps as f64).sqrt();
                let seen: Vec<f32> = as_seen(ty, &scaled, rows, rows)
                    .iter()
                    .map(|&v| (v as f64 * inv) as f32)
                    .collect();
                let norm_exact: Vec<f32> =
                    scaled.iter().map(|&v| (v as f64 * inv) as f32).collect();
                // The norm's input has heavier tails than uniform values, so its int8 form
                // is further from exact.
                for (p, (m, wf, y)) in parts.iter().enumerate() {
                    let r = m.rows();
                    check_output(
                        &gpu,
                        y,
                        1,
                        r,
                        r,
                        &reference(wf, r, rows, &seen, rows, 1),
                        &reference(wf, r, rows, &norm_exact, rows, 1),
                        (tolerance(ty), 2.0 * EXACT_TOL),
                        &format!("{what}: product {p} of its output"),
                    );
                }
                let g = &reference(&parts[0].1, part_rows[0], rows, &seen, rows, 1)[0];
                let u = &reference(&up_w, part_rows[0], rows, &seen, rows, 1)[0];
                let want: Vec<f64> = g
                    .iter()
                    .zip(u)
                    .map(|(&g, &u)| act_ref(Activation::Silu, g) * u)
                    .collect();
                let mut got = vec![0f32; part_rows[0]];
                gpu.read(&gated_out, 0, &mut got).unwrap();
                let e = rel_err(&got, &want);
                assert!(
                    e <= 2.0 * tolerance(ty),
                    "{what}: gated product off by {e:.2e}"
                );
            }
        }
    }
}

/// The input of one `gemv_residual_norm` case: the one-row f32 input, the residual before,
/// the next norm's weights and epsilon, and the bias.
struct NormCase<'a> {
    w: &'a DeviceMatrix,
    x: &'a DeviceBuffer,
    res0: &'a [f32],
    weight: &'a DeviceBuffer,
    eps: f32,
    bias: Option<u64>,
}

/// What one run of a `NormCase` left: the residual and `residual · weight` as bits, that f32
/// output on the device and the scratch holding it as the next input.
struct NormRun {
    residual: Vec<u32>,
    normed_bits: Vec<u32>,
    normed: DeviceBuffer,
    acts: ActScratch,
}

/// Runs `c` on a fresh residual and scratch, its input quantized by a launch first
/// (`quantize_first`) or left to the product's blocks.
fn run_norm_case(gpu: &Arc<Gpu>, k: &MatmulKernels, c: &NormCase, quantize_first: bool) -> NormRun {
    let (rows, cols) = (c.w.rows(), c.w.cols());
    let residual = gpu.upload(c.res0).unwrap();
    let normed = poisoned(gpu, 0, rows);
    let mut acts = ActScratch::new(gpu, 1, cols.max(rows)).unwrap();
    if quantize_first {
        acts.prepare(gpu, k, c.x.ptr(), cols, 1, cols).unwrap();
    } else {
        acts.prepare_unquantized(gpu, c.x.ptr(), cols, 1, cols)
            .unwrap();
    }
    let out = matmul::ResidualNorm {
        residual: residual.ptr(),
        weight: c.weight.ptr(),
        eps: c.eps,
        normed: normed.ptr(),
    };
    matmul::gemv_residual_norm(gpu, k, c.w, c.bias, &mut acts, &out).unwrap();
    gpu.sync().unwrap();
    NormRun {
        residual: read_bits(gpu, &residual, rows),
        normed_bits: read_bits(gpu, &normed, rows),
        normed,
        acts,
    }
}

fn read_bits(gpu: &Gpu, b: &DeviceBuffer, n: usize) -> Vec<u32> {
    let mut v = vec![0f32; n];
    gpu.read(b, 0, &mut v).unwrap();
    bits_of(&v)
}

/// `gemv_residual_norm` of case `c` with its input left unquantized, so that its blocks
/// quantize it: the residual, `residual · weight` and a product of the input it prepares have
/// the bits of the run after a quantize launch (`want_*`, `product` and its output `want_y`).
fn quantized_in_blocks_gives_same_bits(
    gpu: &Arc<Gpu>,
    k: &MatmulKernels,
    c: &NormCase,
    (want_res, want_normed): (&[f32], &[f32]),
    (product, want_y): (&DeviceMatrix, &DeviceBuffer),
    what: &str,
) {
    let rows = c.w.rows();
    let mut run = run_norm_case(gpu, k, c, false);
    run.acts
        .prepare(gpu, k, run.normed.ptr(), rows, 1, rows)
        .unwrap();
    let y = poisoned(gpu, 1, product.rows());
    matmul::gemv(gpu, k, product, &run.acts, 1, y.ptr(), product.rows(), None).unwrap();
    gpu.sync().unwrap();
    let what = format!("{what}, quantized in its blocks");
    assert_eq!(run.residual, bits_of(want_res), "{what}: residual");
    assert_eq!(
        run.normed_bits,
        bits_of(want_normed),
        "{what}: residual · weight"
    );
    assert_eq!(
        read_bits(gpu, &y, product.rows()),
        read_bits(gpu, want_y, product.rows()),
        "{what}: a product of its output"
    );
}

/// The quantizing residual norm product alone, on a few types and on both kernels (one block
/// per group, and clusters where the chip config allows): the same bits as after a quantize
/// launch. Small enough for compute-sanitizer.
#[test]
fn residual_norm_quantizing_its_input() {
    let Some(gpu) = gpu() else { return };
    let k = kernels(&gpu);
    if !k.norms_quantize_inputs() || !k.folds_norms() {
        eprintln!("skipped: the chip config leaves quantization or norms out of products");
        return;
    }
    for (i, &ty) in [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q8_0]
        .iter()
        .enumerate()
    {
        // 2080 and 16416 columns (one block per group, clusters): a last unit of four groups
        // partly past the row, which only 32-value blocks allow.
        let widths: &[(usize, usize)] = if ty == GgmlType::Q4_K {
            &[(1024, 2304), (256, 32768)]
        } else {
            &[(1024, 2304), (256, 32768), (512, 2080), (256, 16416)]
        };
        for (j, &(rows, cols)) in widths.iter().enumerate() {
            let seed = 47_000 + 10 * i as u64 + j as u64;
            let what = format!("residual norm {ty} {rows}x{cols}");
            let (bytes, _) = quantized(ty, rows, cols, seed);
            let dm = DeviceMatrix::upload(&gpu, ty, &bytes, rows, cols).unwrap();
            let (_, xb) = inputs(&gpu, 1, cols, seed + 1);
            let res0 = random(rows, 2.0, seed + 2);
            let weight = gpu.upload(&random(rows, 0.5, seed + 3)).unwrap();
            let bias = gpu.upload(&random(rows, 0.5, seed + 4)).unwrap();
            let case = NormCase {
                w: &dm,
                x: &xb,
                res0: &res0,
                weight: &weight,
                eps: 1e-5,
                bias: Some(bias.ptr()),
            };
            let want = run_norm_case(&gpu, &k, &case, true);
            let got = run_norm_case(&gpu, &k, &case, false);
            assert_ne!(
                want.residual,
                bits_of(&res0),
                "{what}: the residual unchanged"
            );
            assert_eq!(
                got.residual, want.residual,
                "{what}: quantized in its blocks"
            );
            assert_eq!(
                got.normed_bits, want.normed_bits,
                "{what}: quantized in its blocks, residual · weight"
            );
        }
    }
}

fn bits_of(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn every_module_variant_compiles() {
    if !compile::nvrtc_present() {
        eprintln!("skipped: no NVRTC");
        return;
    }
    for (file, defines) in matmul::modules() {
        let key = ModuleKey::new(file, "sm_90a", &defines);
        if let Err(e) = compile::compile(&key) {
            panic!("{file} {defines:?}: {e}");
        }
    }
}

/// Decode-sized products timed in a CUDA graph, weights rotated through enough copies to
/// defeat the L2 cache; each line times the launch shapes the chip config picks against one
/// block per row group (rows never split over warps, no grid cap), blocks of 8 warps, batches
/// without tensor cores and batches on them from 2 tokens at 16 and at 32 rows a block, in
/// the same run. Lines marked `gated` time the gated product of two such matrices (the
/// bandwidth counts both). `cargo test --release -p akunu-cuda --test matmul -- --ignored
/// --nocapture gemv_bandwidth`
#[test]
#[ignore]
fn gemv_bandwidth() {
    use cudarc::driver::sys;
    let Some(gpu) = gpu() else { return };
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
    ];
    let k = MatmulKernels::new(&gpu, &types).unwrap();
    let fill = gpu.chip.sm_count * gpu.chip.gemv_fill_warps;
    let configs = [
        ("chip", MatmulKernels::new(&gpu, &types).unwrap()),
        (
            "per group",
            MatmulKernels::new(&gpu, &types)
                .unwrap()
                .with_split(4, 0)
                .with_grid_cap(GridCap::Waves(0)),
        ),
        (
            "8 warps",
            MatmulKernels::new(&gpu, &types)
                .unwrap()
                .with_split(8, fill),
        ),
        (
            "dp4a",
            MatmulKernels::new(&gpu, &types).unwrap().with_mma(0, 32),
        ),
        (
            "mma r16",
            MatmulKernels::new(&gpu, &types).unwrap().with_mma(2, 16),
        ),
        (
            "mma r32",
            MatmulKernels::new(&gpu, &types).unwrap().with_mma(2, 32),
        ),
    ];
    // 8B q/o, k/v, down and a gate-sized matrix; the 0.6B q and down; the vocabularies of
    // qwen3-0.6b, llama3.2-1b and llama3.1-8b.
    let shapes = [
        (4096, 4096),
        (1024, 4096),
        (4096, 14336),
        (14336, 4096),
        (2048, 1024),
        (1024, 3072),
        (151936, 1024),
        (128256, 2048),
        (128256, 4096),
    ];
    for &ty in &types {
        for &(rows, cols) in &shapes {
            let bytes = random_bytes_fast(ty, rows, cols);
            let first = DeviceMatrix::upload(&gpu, ty, &bytes, rows, cols).unwrap();
            let copies = (256 << 20) / first.device_bytes() + 1;
            let mut mats = vec![first];
            for _ in 1..copies {
                mats.push(DeviceMatrix::upload(&gpu, ty, &bytes, rows, cols).unwrap());
            }
            let x = gpu.upload(&random(16 * cols, 1.0, 3)).unwrap();
            let y = gpu.alloc(16 * rows * 4).unwrap();
            let mut acts = ActScratch::new(&gpu, 16, cols).unwrap();
            for (m, gated) in [
                (1, false),
                (1, true),
                (2, false),
                (2, true),
                (3, false),
                (3, true),
                (4, false),
                (4, true),
                (8, false),
                (16, false),
                (16, true),
            ] {
                let what = if gated { "gated" } else { "" };
                let mut line = format!("{ty:>6} {rows:>6}x{cols:<6} m={m:<2} {what:5}");
                acts.prepare(&gpu, &k, x.ptr(), cols, m, cols).unwrap();
                for (name, kc) in &configs {
                    gpu.sync().unwrap();
                    let reps = 4 * copies.max(8);
                    let stream = gpu.stream();
                    stream
                        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
                        .unwrap();
                    for i in 0..reps {
                        let w = &mats[i % copies];
                        if gated {
                            let up = &mats[(i + copies / 2) % copies];
                            let act = Activation::Silu;
                            matmul::gemv_gated(&gpu, kc, w, up, &acts, m, y.ptr(), rows, act)
                                .unwrap();
                        } else {
                            matmul::gemv(&gpu, kc, w, &acts, m, y.ptr(), rows, None).unwrap();
                        }
                    }
                    let graph = stream
                        .end_capture(sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
                        .unwrap()
                        .unwrap();
                    graph.launch().unwrap();
                    gpu.sync().unwrap();
                    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
                    let start = stream.record_event(flags).unwrap();
                    for _ in 0..3 {
                        graph.launch().unwrap();
                    }
                    let end = stream.record_event(flags).unwrap();
                    let ms = start.elapsed_ms(&end).unwrap() as f64 / (3 * reps) as f64;
                    let bytes = mats[0].device_bytes() * if gated { 2 } else { 1 };
                    let gbs = bytes as f64 / (ms * 1e-3) / 1e9;
                    line += &format!("  {name}: {:>6.1} us {gbs:>5.0} GB/s", ms * 1e3);
                }
                println!("{line}");
            }
        }
    }
}

/// Random blocks with small f16 scales, without the reference dequantization (for timing).
fn random_bytes_fast(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(5);
    let n = ty.bytes_for((rows * cols) as u64).unwrap() as usize;
    let mut bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
    if ty.is_quantized() {
        for blk in bytes.chunks_exact_mut(ty.type_size()) {
            for &o in f16_fields(ty) {
                blk[o..o + 2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
            }
        }
    } else {
        let one = if ty == GgmlType::F32 {
            vec![0, 0, 128, 63]
        } else if ty == GgmlType::F16 {
            vec![0, 60]
        } else {
            vec![128, 63]
        };
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = one[i % one.len()];
        }
    }
    bytes
}
