//! The tensor-core GEMM against an f64 reference, for every weight type.
//!
//! Weights are random f32 quantized with `akunu_quant::quantize`; the reference multiplies the
//! `akunu_quant::dequantize`d weights with the f32 activations in f64. Checked, for every tile
//! kernel (64 and 128 tokens, one or two blocks per SM) and several shapes (odd token counts, row counts that are not a multiple of the tile,
//! K with an odd number of 32-groups): relative error ≤ 2e-3 overall and, per element, an error
//! within what f16 operands allow (2e-3 of Σ|w·x|); every output written and finite; the
//! output's stride gap and the row past `m` untouched (poison); aligned, strided and misaligned
//! inputs; bias; large activations (the power-of-two scaling); one prepared input shared by
//! several matrices, and several products in one launch; bad arguments refused.

mod common;

use std::sync::Arc;

use akunu_cuda::gemm::{self, GemmKernels, GemmScratch, GemmTile, TYPES};
use akunu_cuda::matmul::{DeviceMatrix, Product};
use akunu_cuda::{CudaError, DeviceBuffer, Gpu};
use akunu_quant::GgmlType;
use common::{gpu, random, rel_err, POISON};

/// Quantized weights `rows × cols` on the device and their dequantized values on the host.
struct Weights {
    dev: DeviceMatrix,
    host: Vec<f32>,
}

fn weights(g: &Gpu, ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Weights {
    let src = random(rows * cols, 1.0, seed);
    let bytes_len = ty.bytes_for((rows * cols) as u64).unwrap() as usize;
    let mut bytes = vec![0u8; bytes_len];
    akunu_quant::quantize(ty, &src, &mut bytes).unwrap();
    let mut host = vec![0f32; rows * cols];
    akunu_quant::dequantize(ty, &bytes, &mut host).unwrap();
    let dev = DeviceMatrix::upload(g, ty, &bytes, rows, cols).unwrap();
    Weights { dev, host }
}

/// How the activations and outputs are laid out in one case.
#[derive(Clone, Copy)]
struct Layout {
    /// Extra floats per input row (0: dense).
    x_pad: usize,
    /// Floats the input starts past a 256-byte boundary (1: not 16-byte aligned).
    x_offset: usize,
    /// Extra floats per output row.
    y_pad: usize,
    bias: bool,
}

fn layout(i: usize) -> Layout {
    Layout {
        x_pad: [0, 5, 4][i % 3],
        x_offset: [0, 0, 1][i % 3],
        y_pad: (i % 2) * 3,
        bias: i % 2 == 1,
    }
}

/// Activations uploaded with a layout, and the host copy in that layout.
struct Input {
    buf: DeviceBuffer,
    host: Vec<f32>,
    ptr: u64,
    stride: usize,
}

fn input(g: &Gpu, m: usize, k: usize, lay: Layout, x: &[f32]) -> Input {
    let stride = k + lay.x_pad;
    // Exactly what is read, so an over-read shows under compute-sanitizer.
    let len = lay.x_offset + (m - 1) * stride + k;
    let mut host = vec![POISON; len];
    for t in 0..m {
        let at = lay.x_offset + t * stride;
        host[at..at + k].copy_from_slice(&x[t * k..(t + 1) * k]);
    }
    let buf = g.upload(&host).unwrap();
    let ptr = buf.at(lay.x_offset * 4);
    Input {
        buf,
        host,
        ptr,
        stride,
    }
}

/// `Σ_c w[r][c]·x[t][c] + bias[r]` in f64, and `Σ_c |w[r][c]·x[t][c]|` (the scale of the f16
/// rounding error), for `x` dense `m × k`.
fn reference(
    w: &[f32],
    x: &[f32],
    m: usize,
    n: usize,
    k: usize,
    bias: Option<&[f32]>,
) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0f64; m * n];
    let mut mag = vec![0f64; m * n];
    for t in 0..m {
        let xr = &x[t * k..(t + 1) * k];
        for r in 0..n {
            let wr = &w[r * k..(r + 1) * k];
            let (mut s, mut a) = (0f64, 0f64);
            for (&wv, &xv) in wr.iter().zip(xr) {
                let p = wv as f64 * xv as f64;
                s += p;
                a += p.abs();
            }
            out[t * n + r] = s + bias.map_or(0.0, |b| b[r] as f64);
            mag[t * n + r] = a;
        }
    }
    (out, mag)
}

/// Runs the product into a poisoned output of `m + 1` rows and checks it against `want`.
#[allow(clippy::too_many_arguments)]
fn check_output(
    g: &Gpu,
    what: &str,
    y: &DeviceBuffer,
    m: usize,
    n: usize,
    y_stride: usize,
    want: &[f64],
    mag: &[f64],
) {
    let mut got = vec![0f32; (m + 1) * y_stride];
    g.read(y, 0, &mut got).unwrap();
    let mut dense = Vec::with_capacity(m * n);
    for t in 0..=m {
        for c in 0..y_stride {
            let v = got[t * y_stride + c];
            if t < m && c < n {
                assert!(
                    v.is_finite(),
                    "{what}: y[{t}][{c}] = {v} (unwritten or overflow)"
                );
                let (w, a) = (want[t * n + c], mag[t * n + c]);
                let err = (v as f64 - w).abs();
                assert!(
                    err <= 2e-3 * a + 1e-5 * w.abs() + 1e-6,
                    "{what}: y[{t}][{c}] = {v}, want {w} (error {err:.3e}, Σ|w·x| {a:.3e})"
                );
                dense.push(v);
            } else {
                assert_eq!(
                    v.to_bits(),
                    POISON.to_bits(),
                    "{what}: y[{t}][{c}] outside the output was written"
                );
            }
        }
    }
    let e = rel_err(&dense, want);
    assert!(e <= 2e-3, "{what}: relative error {e:.3e}");
}

fn poisoned(g: &Gpu, len: usize) -> DeviceBuffer {
    g.upload(&vec![POISON; len]).unwrap()
}

#[allow(clippy::too_many_arguments)]
fn run_case(
    g: &Arc<Gpu>,
    k: &mut GemmKernels,
    scratch: &GemmScratch,
    ty: GgmlType,
    (m, n, cols): (usize, usize, usize),
    lay: Layout,
    tiles: &[GemmTile],
    seed: u64,
) {
    let w = weights(g, ty, n, cols, seed);
    let x = random(m * cols, 1.0, seed + 1);
    let bias = lay.bias.then(|| random(n, 0.5, seed + 2));
    let (want, mag) = reference(&w.host, &x, m, n, cols, bias.as_deref());
    let inp = input(g, m, cols, lay, &x);
    assert_eq!(inp.host.len() * 4, inp.buf.bytes());
    let bias_buf = bias.as_ref().map(|b| g.upload(b).unwrap());
    let y_stride = n + lay.y_pad;
    for &tile in tiles {
        k.set_tile(tile);
        let y = poisoned(g, (m + 1) * y_stride);
        gemm::gemm(
            g,
            k,
            &w.dev,
            inp.ptr,
            inp.stride,
            m,
            y.ptr(),
            y_stride,
            bias_buf.as_ref().map(|b| b.ptr()),
            scratch,
        )
        .unwrap();
        g.sync().unwrap();
        let what = format!(
            "{ty} m={m} n={n} k={cols} {tile:?} x_stride={} x_offset={} y_stride={y_stride} bias={}",
            inp.stride, lay.x_offset, lay.bias
        );
        check_output(g, &what, &y, m, n, y_stride, &want, &mag);
    }
    k.set_tile(GemmTile::Auto);
}

const BOTH: &[GemmTile] = &[
    GemmTile::Tokens64,
    GemmTile::Tokens128,
    GemmTile::Tokens128Pair,
];

#[test]
fn every_type_matches_the_reference() {
    let Some(g) = gpu() else { return };
    let mut k = GemmKernels::new(&g, TYPES).unwrap();
    let scratch = GemmScratch::new(&g, 130, 4096).unwrap();
    for (ti, &ty) in TYPES.iter().enumerate() {
        // K: one group, an odd number of 32-groups (half a 64-column step at the end) where
        // the block allows it, and a long K.
        let (k_small, k_mid) = if ty.block_size() == 256 {
            (256, 768)
        } else {
            (32, 96)
        };
        let shapes = [
            (1, 96, k_small),
            (17, 257, k_mid),
            (64, 1, 4096),
            (100, 1000, 256),
            (130, 96, 4096),
        ];
        for (si, &shape) in shapes.iter().enumerate() {
            let seed = (ti * 100 + si * 10) as u64;
            run_case(&g, &mut k, &scratch, ty, shape, layout(si + ti), BOTH, seed);
        }
    }
}

#[test]
fn prefill_sized_products() {
    let Some(g) = gpu() else { return };
    let types = [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::F16];
    let mut k = GemmKernels::new(&g, &types).unwrap();
    let scratch = GemmScratch::new(&g, 512, 4096).unwrap();
    let tiles = [
        GemmTile::Auto,
        GemmTile::Tokens64,
        GemmTile::Tokens128,
        GemmTile::Tokens128Pair,
    ];
    for (i, &ty) in types.iter().enumerate() {
        let seed = 5000 + i as u64 * 10;
        run_case(
            &g,
            &mut k,
            &scratch,
            ty,
            (512, 96, 4096),
            layout(i),
            &tiles,
            seed,
        );
        run_case(
            &g,
            &mut k,
            &scratch,
            ty,
            (512, 1000, 256),
            layout(i + 1),
            &tiles,
            seed + 5,
        );
    }
}

#[test]
fn large_activations_are_scaled_into_f16_range() {
    let Some(g) = gpu() else { return };
    let k = GemmKernels::new(&g, &[GgmlType::Q8_0]).unwrap();
    let scratch = GemmScratch::new(&g, 33, 512).unwrap();
    let (m, n, cols) = (33, 70, 512);
    let w = weights(&g, GgmlType::Q8_0, n, cols, 77);
    let mut x = random(m * cols, 1.0, 78);
    // Token rows far past f16's range (65504), one far below it, one with a single outlier.
    for t in 0..m {
        let s = match t % 4 {
            0 => 1.0e6,
            1 => 3.0e4,
            2 => 1.0e-3,
            _ => 1.0,
        };
        for v in &mut x[t * cols..(t + 1) * cols] {
            *v *= s;
        }
    }
    x[5 * cols + 7] = 2.0e5;
    let (want, mag) = reference(&w.host, &x, m, n, cols, None);
    let xb = g.upload(&x).unwrap();
    let y = poisoned(&g, (m + 1) * n);
    gemm::gemm(
        &g,
        &k,
        &w.dev,
        xb.ptr(),
        cols,
        m,
        y.ptr(),
        n,
        None,
        &scratch,
    )
    .unwrap();
    g.sync().unwrap();
    check_output(&g, "large activations", &y, m, n, n, &want, &mag);
}

#[test]
fn one_prepared_input_serves_several_matrices() {
    let Some(g) = gpu() else { return };
    let types = [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0];
    let k = GemmKernels::new(&g, &types).unwrap();
    let (m, cols) = (45, 512);
    let scratch = GemmScratch::new(&g, m, cols).unwrap();
    let x = random(m * cols, 1.0, 900);
    let xb = g.upload(&x).unwrap();
    gemm::prepare(&g, &k, xb.ptr(), cols, m, cols, &scratch).unwrap();
    assert_eq!(scratch.prepared(), Some((m, cols)));
    for (i, (&ty, n)) in types.iter().zip([300, 77, 128]).enumerate() {
        let w = weights(&g, ty, n, cols, 901 + i as u64);
        let (want, mag) = reference(&w.host, &x, m, n, cols, None);
        let y = poisoned(&g, (m + 1) * n);
        gemm::gemm_prepared(&g, &k, &w.dev, &scratch, y.ptr(), n, None).unwrap();
        g.sync().unwrap();
        check_output(&g, &format!("shared input, {ty}"), &y, m, n, n, &want, &mag);
    }
}

#[test]
fn several_products_in_one_launch_match_the_reference() {
    let Some(g) = gpu() else { return };
    let types = [GgmlType::Q4_K, GgmlType::Q6_K];
    let mut k = GemmKernels::new(&g, &types).unwrap();
    let cols = 512;
    // Four Q4_K matrices (three in the first launch, one in the second) and a Q6_K one; the
    // second has a bias and a padded output.
    let specs = [
        (GgmlType::Q4_K, 300, 0),
        (GgmlType::Q4_K, 77, 3),
        (GgmlType::Q4_K, 128, 0),
        (GgmlType::Q4_K, 40, 0),
        (GgmlType::Q6_K, 200, 0),
    ];
    let ws: Vec<Weights> = specs
        .iter()
        .enumerate()
        .map(|(i, &(ty, n, _))| weights(&g, ty, n, cols, 950 + i as u64))
        .collect();
    let bias = random(77, 0.5, 960);
    let bias_buf = g.upload(&bias).unwrap();
    for m in [45, 200] {
        let scratch = GemmScratch::new(&g, m, cols).unwrap();
        let x = random(m * cols, 1.0, 970 + m as u64);
        let xb = g.upload(&x).unwrap();
        gemm::prepare(&g, &k, xb.ptr(), cols, m, cols, &scratch).unwrap();
        for tile in [GemmTile::Auto, GemmTile::Tokens64, GemmTile::Tokens128Pair] {
            k.set_tile(tile);
            let ys: Vec<DeviceBuffer> = specs
                .iter()
                .map(|&(_, n, pad)| poisoned(&g, (m + 1) * (n + pad)))
                .collect();
            let products: Vec<Product> = specs
                .iter()
                .zip(&ws)
                .zip(&ys)
                .enumerate()
                .map(|(i, ((&(_, n, pad), w), y))| Product {
                    w: &w.dev,
                    y: y.ptr(),
                    y_stride: n + pad,
                    bias: (i == 1).then(|| bias_buf.ptr()),
                })
                .collect();
            gemm::gemm_many(&g, &k, &products, &scratch).unwrap();
            g.sync().unwrap();
            for (i, ((&(ty, n, pad), w), y)) in specs.iter().zip(&ws).zip(&ys).enumerate() {
                let b = (i == 1).then_some(bias.as_slice());
                let (want, mag) = reference(&w.host, &x, m, n, cols, b);
                let what = format!("product {i} of a launch ({ty}, m={m}, {tile:?})");
                check_output(&g, &what, y, m, n, n + pad, &want, &mag);
            }
        }
    }
}

#[test]
fn bad_arguments_are_refused() {
    let Some(g) = gpu() else { return };
    let k = GemmKernels::new(&g, &[GgmlType::Q4_0]).unwrap();
    let (m, n, cols) = (20, 64, 256);
    let scratch = GemmScratch::new(&g, m, cols).unwrap();
    let w = weights(&g, GgmlType::Q4_0, n, cols, 1);
    let other = weights(&g, GgmlType::Q8_0, n, cols, 2);
    let narrow = weights(&g, GgmlType::Q4_0, n, 128, 3);
    let xb = g.upload(&random(m * cols, 1.0, 4)).unwrap();
    let y = poisoned(&g, m * n);
    let (x, yp) = (xb.ptr(), y.ptr());
    let bounds = |r: Result<(), CudaError>, what: &str| {
        assert!(matches!(r, Err(CudaError::Bounds(_))), "{what}: {r:?}");
    };
    bounds(
        gemm::gemm_prepared(&g, &k, &w.dev, &scratch, yp, n, None),
        "nothing prepared",
    );
    bounds(
        gemm::gemm(&g, &k, &w.dev, x, cols - 1, m, yp, n, None, &scratch),
        "short input stride",
    );
    bounds(
        gemm::gemm(&g, &k, &w.dev, x, cols, m, yp, n - 1, None, &scratch),
        "short output stride",
    );
    bounds(
        gemm::gemm(&g, &k, &w.dev, x, cols, m + 1, yp, n, None, &scratch),
        "more tokens than the scratch holds",
    );
    bounds(
        gemm::gemm(&g, &k, &w.dev, 0, cols, m, yp, n, None, &scratch),
        "null input",
    );
    bounds(
        gemm::gemm(&g, &k, &w.dev, x, cols, m, 0, n, None, &scratch),
        "null output",
    );
    bounds(
        gemm::prepare(&g, &k, x, cols, m, 48, &scratch),
        "width not a multiple of 32",
    );
    gemm::prepare(&g, &k, x, cols, m, cols, &scratch).unwrap();
    bounds(
        gemm::gemm_prepared(&g, &k, &narrow.dev, &scratch, yp, n, None),
        "matrix narrower than the prepared input",
    );
    let r = gemm::gemm(&g, &k, &other.dev, x, cols, m, yp, n, None, &scratch);
    assert!(
        matches!(r, Err(CudaError::Unsupported(_))),
        "type not built: {r:?}"
    );
    // Nothing above launched a product.
    g.sync().unwrap();
    let mut got = vec![0f32; m * n];
    g.read(&y, 0, &mut got).unwrap();
    assert!(got.iter().all(|v| v.to_bits() == POISON.to_bits()));
    // Zero tokens is a no-op.
    gemm::gemm(&g, &k, &w.dev, x, cols, 0, yp, n, None, &scratch).unwrap();
}

/// Timing, for the GPU machine (`--ignored`): 512-token products of the 8B model's shapes for
/// the weight types the benchmarks use, per tile size, in µs and TFLOP/s.
#[test]
#[ignore]
fn gemm_throughput() {
    let Some(g) = gpu() else { return };
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::F16,
    ];
    let mut k = GemmKernels::new(&g, &types).unwrap();
    let m = 512;
    let shapes = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)];
    let scratch = GemmScratch::new(&g, m, 14336).unwrap();
    let tiles = [
        GemmTile::Auto,
        GemmTile::Tokens64,
        GemmTile::Tokens128,
        GemmTile::Tokens128Pair,
    ];
    for &ty in &types {
        for &(rows, cols) in &shapes {
            let w = timing_matrix(&g, ty, rows, cols);
            let x = g.upload(&random(m * cols, 1.0, 8)).unwrap();
            let y = g.alloc(m * rows * 4).unwrap();
            gemm::prepare(&g, &k, x.ptr(), cols, m, cols, &scratch).unwrap();
            let mut line = format!("{ty:>5} m={m} {rows:>5}x{cols:<5}");
            for &tile in &tiles {
                k.set_tile(tile);
                let us = launch_us(&g, || {
                    gemm::gemm_prepared(&g, &k, &w, &scratch, y.ptr(), rows, None).unwrap()
                });
                let tflops = 2.0 * (m * rows * cols) as f64 / (us * 1e-6) / 1e12;
                line += &format!("  {tile:?}: {us:>7.1} us {tflops:>5.0} TF/s");
            }
            println!("{line}");
        }
        k.set_tile(GemmTile::Auto);
        // The 8B's q/k/v and gate/up: one launch per matrix, then one for all.
        for rows in [&[4096, 1024, 1024][..], &[14336, 14336][..]] {
            let cols = 4096;
            let mats: Vec<DeviceMatrix> = rows
                .iter()
                .map(|&r| timing_matrix(&g, ty, r, cols))
                .collect();
            let ys: Vec<DeviceBuffer> = rows.iter().map(|&r| g.alloc(m * r * 4).unwrap()).collect();
            let products: Vec<Product> = mats
                .iter()
                .zip(&ys)
                .map(|(w, y)| Product {
                    w,
                    y: y.ptr(),
                    y_stride: w.rows(),
                    bias: None,
                })
                .collect();
            let x = g.upload(&random(m * cols, 1.0, 8)).unwrap();
            gemm::prepare(&g, &k, x.ptr(), cols, m, cols, &scratch).unwrap();
            let mut line = format!("{ty:>5} m={m} {rows:?}x{cols}");
            for (name, one_launch) in [("separate", false), ("one launch", true)] {
                let us = launch_us(&g, || {
                    if one_launch {
                        gemm::gemm_many(&g, &k, &products, &scratch).unwrap();
                    } else {
                        for p in &products {
                            gemm::gemm_many(&g, &k, std::slice::from_ref(p), &scratch).unwrap();
                        }
                    }
                });
                let flop = 2.0 * (m * rows.iter().sum::<usize>() * cols) as f64;
                let tflops = flop / (us * 1e-6) / 1e12;
                line += &format!("  {name}: {us:>7.1} us {tflops:>5.0} TF/s");
            }
            println!("{line}");
        }
    }
}

/// Random weights, quantized (no host reference: for timing only).
fn timing_matrix(g: &Gpu, ty: GgmlType, rows: usize, cols: usize) -> DeviceMatrix {
    let mut bytes = vec![0u8; ty.bytes_for((rows * cols) as u64).unwrap() as usize];
    akunu_quant::quantize(ty, &random(rows * cols, 1.0, rows as u64), &mut bytes).unwrap();
    DeviceMatrix::upload(g, ty, &bytes, rows, cols).unwrap()
}

/// Mean µs of `launch` over 20 runs on the GPU's stream (events), after 3 untimed ones.
fn launch_us(g: &Gpu, launch: impl Fn()) -> f64 {
    use cudarc::driver::sys;
    for _ in 0..3 {
        launch();
    }
    g.sync().unwrap();
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = g.stream().record_event(flags).unwrap();
    let reps = 20;
    for _ in 0..reps {
        launch();
    }
    let end = g.stream().record_event(flags).unwrap();
    start.elapsed_ms(&end).unwrap() as f64 * 1e3 / reps as f64
}
