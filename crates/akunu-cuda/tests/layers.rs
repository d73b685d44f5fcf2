//! The per-layer kernels against f64 references written from the ops' definitions (those of
//! `akunu_cpu::ops`): RMSNorm, the fused residual add + RMSNorm, the fused QK-norm + RoPE + KV
//! store, attention and the element-wise ops, on random inputs and several shapes. Outputs
//! are poisoned with NaN first, so an element a kernel leaves unwritten fails the check.
//!
//! Tolerances (relative error of each row or group): 1e-5 for f32 math; 2e-3 where a value
//! passes through f16 storage; 1e-4 for attention, whose inputs (f16 cache, f16-rounded
//! queries) are the same bits in the reference, so only f32 accumulation differs.

mod common;

use std::sync::Arc;

use akunu_core::{Activation, RopeStyle};
use akunu_cuda::layers::{self, AttentionArgs, LayerKernels, QkRopeStore};
use akunu_cuda::{DeviceBuffer, Gpu};
use common::{gpu, random, rel_err, POISON};
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const F32_TOL: f64 = 1e-5;
const F16_TOL: f64 = 2e-3;
const ATT_TOL: f64 = 1e-4;

fn setup() -> Option<(Arc<Gpu>, LayerKernels)> {
    let g = gpu()?;
    let k = LayerKernels::new(&g).expect("layer kernels");
    Some((g, k))
}

fn read_f32(g: &Gpu, b: &DeviceBuffer, offset: usize, n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    g.read(b, offset, &mut v).unwrap();
    v
}

fn read_u16(g: &Gpu, b: &DeviceBuffer) -> Vec<u16> {
    let mut v = vec![0u16; b.bytes() / 2];
    g.read(b, 0, &mut v).unwrap();
    v
}

/// A buffer holding `data` starting `pad` floats in, so `at(4 * pad)` is its address.
fn upload_at(g: &Gpu, data: &[f32], pad: usize) -> DeviceBuffer {
    let mut v = vec![POISON; pad];
    v.extend_from_slice(data);
    g.upload(&v).unwrap()
}

fn f16_bits(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

fn from_f16(b: u16) -> f32 {
    f16::from_bits(b).to_f32()
}

fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// `x / sqrt(mean(x²) + eps) * w` in f64.
fn rms_ref(x: &[f64], w: &[f32], eps: f32) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps as f64).sqrt();
    x.iter().zip(w).map(|(v, &w)| v * s * w as f64).collect()
}

fn to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Relative error of each `width`-wide row; fails on the first one above `tol`.
fn check_rows(what: &str, got: &[f32], want: &[f64], width: usize, tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (r, (g, w)) in got.chunks(width).zip(want.chunks(width)).enumerate() {
        let e = rel_err(g, w);
        assert!(e <= tol, "{what}: row {r} relative error {e:e} > {tol:e}");
    }
}

#[test]
fn layer_modules_compile() {
    if !akunu_cuda::compile::nvrtc_present() {
        eprintln!("skipped: libnvrtc cannot be loaded");
        return;
    }
    for (file, defines) in layers::modules() {
        let key = akunu_cuda::compile::ModuleKey::new(file, "sm_90a", &defines);
        if let Err(e) = akunu_cuda::compile::compile(&key) {
            panic!("{file} {defines:?}: {e}");
        }
    }
}

#[test]
fn rms_norm_groups() {
    let Some((g, k)) = setup() else { return };
    let eps = 1e-6f32;
    let cases = [
        (1, 8192),
        (3, 4096),
        (37, 128),
        (5, 129),
        (64, 1),
        (2, 1000),
        (7, 2050),
        (2, 2052),
        (9, 512),
        (4, 513),
        (33, 256),
        (1, 12288),
    ];
    for (seed, &(n_groups, group)) in cases.iter().enumerate() {
        let seed = seed as u64 * 10;
        let x = random(n_groups * group, 3.0, seed);
        let w = random(group, 2.0, seed + 1);
        let want: Vec<f64> = x
            .chunks(group)
            .flat_map(|row| rms_ref(&to_f64(row), &w, eps))
            .collect();
        let wd = g.upload(&w).unwrap();
        // Out of place, then in place, then out of place from addresses 4 bytes off 16-byte
        // alignment (the scalar path).
        let src = g.upload(&x).unwrap();
        let dst = g.upload(&vec![POISON; x.len()]).unwrap();
        k.rms_norm(&g, src.ptr(), dst.ptr(), wd.ptr(), n_groups, group, eps)
            .unwrap();
        let what = format!("rms_norm {n_groups}x{group}");
        check_rows(
            &what,
            &read_f32(&g, &dst, 0, x.len()),
            &want,
            group,
            F32_TOL,
        );
        assert_eq!(read_f32(&g, &src, 0, x.len()), x, "{what}: src changed");

        k.rms_norm(&g, src.ptr(), src.ptr(), wd.ptr(), n_groups, group, eps)
            .unwrap();
        let what = format!("rms_norm in place {n_groups}x{group}");
        check_rows(
            &what,
            &read_f32(&g, &src, 0, x.len()),
            &want,
            group,
            F32_TOL,
        );

        let src = upload_at(&g, &x, 1);
        let dst = upload_at(&g, &vec![POISON; x.len()], 1);
        k.rms_norm(&g, src.at(4), dst.at(4), wd.ptr(), n_groups, group, eps)
            .unwrap();
        let what = format!("rms_norm unaligned {n_groups}x{group}");
        check_rows(
            &what,
            &read_f32(&g, &dst, 4, x.len()),
            &want,
            group,
            F32_TOL,
        );
    }
}

#[test]
fn add_rms_norm_rows() {
    let Some((g, k)) = setup() else { return };
    let eps = 1e-5f32;
    let cases = [
        (1, 4096, false),
        (1, 4096, true),
        (5, 2050, true),
        (3, 8192, false),
        (7, 100, true),
        (2, 16384, true),
        (4, 2304, true),
        (3, 1, false),
    ];
    for (seed, &(m, width, post)) in cases.iter().enumerate() {
        let seed = 1000 + seed as u64 * 10;
        let res = random(m * width, 2.0, seed);
        let add = random(m * width, 5.0, seed + 1);
        let pw = random(width, 1.5, seed + 2);
        let nw = random(width, 1.5, seed + 3);
        let mut want_res = Vec::new();
        let mut want_norm = Vec::new();
        for (r, a) in res.chunks(width).zip(add.chunks(width)) {
            let a = if post {
                rms_ref(&to_f64(a), &pw, eps)
            } else {
                to_f64(a)
            };
            let sum: Vec<f64> = r.iter().zip(&a).map(|(&r, a)| r as f64 + a).collect();
            want_norm.extend(rms_ref(&sum, &nw, eps));
            want_res.extend(sum);
        }
        let rd = g.upload(&res).unwrap();
        let ad = g.upload(&add).unwrap();
        let pwd = g.upload(&pw).unwrap();
        let nwd = g.upload(&nw).unwrap();
        let out = g.upload(&vec![POISON; m * width]).unwrap();
        // Widths of whole 32-value groups also get the int8 form.
        let quant = width.is_multiple_of(32).then(|| {
            let q = g.upload(&vec![0x55u8; m * width]).unwrap();
            let s = g.upload(&vec![POISON; m * width / 8]).unwrap();
            (q, s)
        });
        k.add_rms_norm(
            &g,
            rd.ptr(),
            ad.ptr(),
            post.then(|| pwd.ptr()),
            nwd.ptr(),
            out.ptr(),
            m,
            width,
            eps,
            quant.as_ref().map(|(q, s)| (q.ptr(), s.ptr())),
        )
        .unwrap();
        let what = format!("add_rms_norm {m}x{width} post {post}");
        let got_res = read_f32(&g, &rd, 0, m * width);
        check_rows(
            &format!("{what} residual"),
            &got_res,
            &want_res,
            width,
            F32_TOL,
        );
        let got = read_f32(&g, &out, 0, m * width);
        check_rows(&format!("{what} normed"), &got, &want_norm, width, F32_TOL);
        assert_eq!(read_f32(&g, &ad, 0, m * width), add, "{what}: add changed");
        if let Some((q, s)) = &quant {
            let mut levels = vec![0i8; m * width];
            g.read(q, 0, &mut levels).unwrap();
            common::check_act_quant(&what, &got, &levels, &read_f32(&g, s, 0, m * width / 8));
        }
    }
}

struct RopeCase {
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    head_dim_v: usize,
    n_rot: usize,
    style: RopeStyle,
    q_norm: bool,
    k_norm: bool,
    n_slots: usize,
    n_ctx: usize,
    /// (slot, position) of each token; no two alike.
    tokens: Vec<(u32, u32)>,
}

/// The reference of one head: optional RMSNorm, then RoPE of the first n_rot dimensions at
/// angles `(pos as f32 * inv_freq[i])` (rounded to f32 as the CPU backend does), in f64.
fn rope_head_ref(
    x: &[f32],
    w: Option<&[f32]>,
    eps: f32,
    pos: u32,
    inv_freq: &[f32],
    n_rot: usize,
    style: RopeStyle,
) -> Vec<f64> {
    let mut h = match w {
        Some(w) => rms_ref(&to_f64(x), w, eps),
        None => to_f64(x),
    };
    let half = n_rot / 2;
    for (i, &f) in inv_freq.iter().enumerate().take(half) {
        let angle = (pos as f32 * f) as f64;
        let (s, c) = angle.sin_cos();
        let (a, b) = match style {
            RopeStyle::Normal => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
        };
        let (x0, x1) = (h[a], h[b]);
        h[a] = x0 * c - x1 * s;
        h[b] = x0 * s + x1 * c;
    }
    h
}

fn run_rope(case: &RopeCase, seed: u64) {
    let Some((g, k)) = setup() else { return };
    let RopeCase {
        n_head: nh,
        n_head_kv: hk,
        head_dim: d,
        head_dim_v: dv,
        n_rot,
        style,
        n_slots,
        n_ctx,
        ..
    } = *case;
    let m = case.tokens.len();
    let eps = 1e-6f32;
    let q = random(m * nh * d, 4.0, seed);
    let kk = random(m * hk * d, 4.0, seed + 1);
    let v = random(m * hk * dv, 4.0, seed + 2);
    let qw = random(d, 2.0, seed + 3);
    let kw = random(d, 2.0, seed + 4);
    let inv_freq = akunu_core::plan::inv_freq(n_rot, 10000.0, 1.0, None);
    let positions: Vec<u32> = case.tokens.iter().map(|t| t.1).collect();
    let slots: Vec<u32> = case.tokens.iter().map(|t| t.0).collect();
    let mut rng = StdRng::seed_from_u64(seed + 5);
    let k_init: Vec<u16> = (0..n_slots * hk * n_ctx * d)
        .map(|_| rng.random_range(0x3000u16..0x3c00))
        .collect();
    let v_init: Vec<u16> = (0..n_slots * hk * n_ctx * dv)
        .map(|_| rng.random_range(0x3000u16..0x3c00))
        .collect();

    let qd = g.upload(&q).unwrap();
    let kd = g.upload(&kk).unwrap();
    let vd = g.upload(&v).unwrap();
    let qwd = g.upload(&qw).unwrap();
    let kwd = g.upload(&kw).unwrap();
    let fd = g.upload(&inv_freq).unwrap();
    let pd = g.upload(&positions).unwrap();
    let sd = g.upload(&slots).unwrap();
    let kc = g.upload(&k_init).unwrap();
    let vc = g.upload(&v_init).unwrap();
    let args = |q16| QkRopeStore {
        q: qd.ptr(),
        q16,
        k: kd.ptr(),
        v: vd.ptr(),
        m,
        n_head: nh,
        n_head_kv: hk,
        head_dim: d,
        head_dim_v: dv,
        q_norm: case.q_norm.then(|| qwd.ptr()),
        k_norm: case.k_norm.then(|| kwd.ptr()),
        eps,
        style,
        n_rot,
        inv_freq: fd.ptr(),
        positions: pd.ptr(),
        slots: sd.ptr(),
        k_cache: kc.ptr(),
        v_cache: vc.ptr(),
        n_ctx,
    };
    // First with f16 queries into their own buffer, which leaves the f32 ones as they were;
    // then in place, the same values rounded to f16 precision.
    let q16 = g.upload(&vec![0xffffu16; q.len()]).unwrap();
    k.qk_rope_store(&g, &args(Some(q16.ptr()))).unwrap();
    let what = format!("qk_rope_store {nh}/{hk}x{d}/{dv} rot {n_rot} {style:?}");
    assert!(
        read_f32(&g, &qd, 0, q.len()) == q,
        "{what}: f32 queries changed though f16 ones were asked for"
    );
    k.qk_rope_store(&g, &args(None)).unwrap();

    let got_q = read_f32(&g, &qd, 0, q.len());
    let got_q16 = read_u16(&g, &q16);
    let bad = got_q
        .iter()
        .zip(&got_q16)
        .position(|(&x, &b)| f16_bits(x) != b);
    assert!(bad.is_none(), "{what}: f16 queries differ at {bad:?}");
    let mut want_q = Vec::new();
    for (t, &pos) in positions.iter().enumerate() {
        for h in 0..nh {
            let x = &q[(t * nh + h) * d..(t * nh + h + 1) * d];
            let w = case.q_norm.then_some(&qw[..]);
            want_q.extend(rope_head_ref(x, w, eps, pos, &inv_freq, n_rot, style));
        }
    }
    check_rows(&format!("{what} q"), &got_q, &want_q, d, F16_TOL);
    assert!(
        got_q.iter().all(|&x| round_f16(x) == x),
        "{what}: q not rounded to f16"
    );

    let got_k = read_u16(&g, &kc);
    let got_v = read_u16(&g, &vc);
    let mut want_k = k_init.clone();
    let mut want_v = v_init.clone();
    for (t, (&pos, &slot)) in positions.iter().zip(&slots).enumerate() {
        for h in 0..hk {
            let at = (slot as usize * hk + h) * n_ctx + pos as usize;
            let x = &kk[(t * hk + h) * d..(t * hk + h + 1) * d];
            let w = case.k_norm.then_some(&kw[..]);
            let want = rope_head_ref(x, w, eps, pos, &inv_freq, n_rot, style);
            let got: Vec<f32> = got_k[at * d..(at + 1) * d]
                .iter()
                .map(|&b| from_f16(b))
                .collect();
            let e = rel_err(&got, &want);
            assert!(e <= F16_TOL, "{what}: K of token {t} head {h}: error {e:e}");
            want_k[at * d..(at + 1) * d].copy_from_slice(&got_k[at * d..(at + 1) * d]);
            let src = &v[(t * hk + h) * dv..(t * hk + h + 1) * dv];
            for (i, &x) in src.iter().enumerate() {
                want_v[at * dv + i] = f16_bits(x);
            }
        }
    }
    assert!(
        want_k == got_k,
        "{what}: K cache written outside the tokens' rows"
    );
    let bad_v = got_v.iter().zip(&want_v).position(|(a, b)| a != b);
    assert!(bad_v.is_none(), "{what}: V cache differs at {bad_v:?}");
}

#[test]
fn qk_rope_store_neox_qk_norm() {
    run_rope(
        &RopeCase {
            n_head: 8,
            n_head_kv: 2,
            head_dim: 128,
            head_dim_v: 128,
            n_rot: 128,
            style: RopeStyle::Neox,
            q_norm: true,
            k_norm: true,
            n_slots: 3,
            n_ctx: 200,
            tokens: vec![
                (2, 10),
                (2, 11),
                (2, 12),
                (2, 13),
                (2, 14),
                (0, 0),
                (0, 199),
            ],
        },
        100,
    );
}

#[test]
fn qk_rope_store_normal_partial() {
    run_rope(
        &RopeCase {
            n_head: 4,
            n_head_kv: 4,
            head_dim: 64,
            head_dim_v: 64,
            n_rot: 32,
            style: RopeStyle::Normal,
            q_norm: false,
            k_norm: false,
            n_slots: 2,
            n_ctx: 64,
            tokens: (0..37).map(|i| (i % 2, 20 + i / 2)).collect(),
        },
        200,
    );
}

#[test]
fn qk_rope_store_long_positions_gemma_shape() {
    run_rope(
        &RopeCase {
            n_head: 8,
            n_head_kv: 1,
            head_dim: 256,
            head_dim_v: 256,
            n_rot: 256,
            style: RopeStyle::Neox,
            q_norm: true,
            k_norm: true,
            n_slots: 1,
            n_ctx: 131072,
            tokens: vec![(0, 131071), (0, 100_000), (0, 65_537), (0, 3)],
        },
        300,
    );
}

#[test]
fn qk_rope_store_partial_neox_k_norm_only_dv_differs() {
    run_rope(
        &RopeCase {
            n_head: 6,
            n_head_kv: 2,
            head_dim: 96,
            head_dim_v: 64,
            n_rot: 64,
            style: RopeStyle::Neox,
            q_norm: false,
            k_norm: true,
            n_slots: 4,
            n_ctx: 50,
            tokens: vec![(3, 49), (1, 0), (2, 7), (0, 25), (3, 48)],
        },
        400,
    );
}

#[test]
fn qk_rope_store_normal_qk_norm_odd_shape() {
    run_rope(
        &RopeCase {
            n_head: 5,
            n_head_kv: 5,
            head_dim: 80,
            head_dim_v: 80,
            n_rot: 80,
            style: RopeStyle::Normal,
            q_norm: true,
            k_norm: true,
            n_slots: 1,
            n_ctx: 4096,
            tokens: vec![(0, 4095), (0, 1234), (0, 1)],
        },
        500,
    );
}

struct AttnCase {
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    head_dim_v: usize,
    n_slots: usize,
    n_ctx: usize,
    /// (slot, position) of each query token.
    tokens: Vec<(u32, u32)>,
    window: Option<usize>,
    softcap: Option<f32>,
    scale: f32,
}

/// `softmax(q16 · K[first..=pos] · scale, soft-capped) · V` of one query head, in f64.
#[allow(clippy::too_many_arguments)]
fn attention_ref(
    q: &[f32],
    kc: &[u16],
    vc: &[u16],
    base: usize,
    first: usize,
    pos: usize,
    d: usize,
    dv: usize,
    scale: f32,
    softcap: Option<f32>,
) -> Vec<f64> {
    let q: Vec<f64> = q.iter().map(|&x| round_f16(x) as f64).collect();
    let scores: Vec<f64> = (first..=pos)
        .map(|p| {
            let k = &kc[(base + p) * d..(base + p + 1) * d];
            let s = q
                .iter()
                .zip(k)
                .map(|(a, &b)| a * from_f16(b) as f64)
                .sum::<f64>()
                * scale as f64;
            match softcap {
                Some(c) => (s / c as f64).tanh() * c as f64,
                None => s,
            }
        })
        .collect();
    let mut out = vec![0f64; dv];
    if scores.is_empty() {
        return out;
    }
    let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for (i, s) in scores.iter().enumerate() {
        let p = (s - mx).exp();
        sum += p;
        let v = &vc[(base + first + i) * dv..(base + first + i + 1) * dv];
        for (o, &x) in out.iter_mut().zip(v) {
            *o += p * from_f16(x) as f64;
        }
    }
    out.iter_mut().for_each(|o| *o /= sum);
    out
}

fn run_attention(case: &AttnCase, seed: u64) {
    let Some((g, k)) = setup() else { return };
    let AttnCase {
        n_head: nh,
        n_head_kv: hk,
        head_dim: d,
        head_dim_v: dv,
        n_slots,
        n_ctx,
        window,
        softcap,
        scale,
        ..
    } = *case;
    let m = case.tokens.len();
    let cache = |n: usize, seed: u64| -> Vec<u16> {
        random(n, 1.0, seed).into_iter().map(f16_bits).collect()
    };
    let kc = cache(n_slots * hk * n_ctx * d, seed);
    let vc = cache(n_slots * hk * n_ctx * dv, seed + 1);
    let q = random(m * nh * d, 1.0, seed + 2);
    let positions: Vec<u32> = case.tokens.iter().map(|t| t.1).collect();
    let slots: Vec<u32> = case.tokens.iter().map(|t| t.0).collect();

    let kd = g.upload(&kc).unwrap();
    let vd = g.upload(&vc).unwrap();
    let qd = g.upload(&q).unwrap();
    let pd = g.upload(&positions).unwrap();
    let sd = g.upload(&slots).unwrap();
    let out = g.upload(&vec![POISON; m * nh * dv]).unwrap();
    let splits = k.attention_splits(m, nh, hk, dv, n_ctx, window);
    k.attention(
        &g,
        &AttentionArgs {
            q: qd.ptr(),
            k_cache: kd.ptr(),
            v_cache: vd.ptr(),
            out: out.ptr(),
            m,
            slots: sd.ptr(),
            positions: pd.ptr(),
            n_head: nh,
            n_head_kv: hk,
            head_dim: d,
            head_dim_v: dv,
            n_ctx,
            scale,
            window,
            softcap,
        },
    )
    .unwrap();
    let got = read_f32(&g, &out, 0, m * nh * dv);
    let group = nh / hk;
    let mut want = Vec::with_capacity(got.len());
    for (t, (&pos, &slot)) in positions.iter().zip(&slots).enumerate() {
        let pos = pos as usize;
        let first = match window {
            Some(w) if pos + 1 > w => pos + 1 - w,
            _ => 0,
        };
        for h in 0..nh {
            let base = (slot as usize * hk + h / group) * n_ctx;
            let qh = &q[(t * nh + h) * d..(t * nh + h + 1) * d];
            want.extend(attention_ref(
                qh, &kc, &vc, base, first, pos, d, dv, scale, softcap,
            ));
        }
    }
    let what = format!(
        "attention {nh}/{hk}x{d}/{dv} m {m} window {window:?} softcap {softcap:?} splits {splits}"
    );
    check_rows(&what, &got, &want, dv, ATT_TOL);
    eprintln!("{what}: ok");
}

#[test]
fn attention_prefill_mha_two_slots() {
    let mut tokens: Vec<(u32, u32)> = (0..21).map(|p| (1, p)).collect();
    tokens.extend((100..116).map(|p| (0, p)));
    run_attention(
        &AttnCase {
            n_head: 8,
            n_head_kv: 8,
            head_dim: 64,
            head_dim_v: 64,
            n_slots: 2,
            n_ctx: 256,
            tokens,
            window: None,
            softcap: None,
            scale: 0.125,
        },
        1000,
    );
}

#[test]
fn attention_prefill_gqa2_window_softcap() {
    run_attention(
        &AttnCase {
            n_head: 16,
            n_head_kv: 8,
            head_dim: 128,
            head_dim_v: 128,
            n_slots: 1,
            n_ctx: 128,
            tokens: (60..97).map(|p| (0, p)).collect(),
            window: Some(16),
            softcap: Some(20.0),
            scale: 0.5,
        },
        2000,
    );
}

#[test]
fn attention_decode_long_gqa4_d256_softcap() {
    run_attention(
        &AttnCase {
            n_head: 8,
            n_head_kv: 2,
            head_dim: 256,
            head_dim_v: 256,
            n_slots: 2,
            n_ctx: 5100,
            tokens: vec![(1, 4999)],
            window: None,
            softcap: Some(50.0),
            scale: 0.0625,
        },
        3000,
    );
}

#[test]
fn attention_decode_long_gqa4_d256_window() {
    run_attention(
        &AttnCase {
            n_head: 8,
            n_head_kv: 2,
            head_dim: 256,
            head_dim_v: 256,
            n_slots: 2,
            n_ctx: 5100,
            tokens: vec![(0, 5099), (1, 700)],
            window: Some(1024),
            softcap: None,
            scale: 0.0625,
        },
        3500,
    );
}

#[test]
fn attention_decode_gqa8_several_slots() {
    run_attention(
        &AttnCase {
            n_head: 32,
            n_head_kv: 4,
            head_dim: 128,
            head_dim_v: 128,
            n_slots: 3,
            n_ctx: 5001,
            tokens: vec![(0, 5000), (2, 17), (1, 2500), (1, 0)],
            window: None,
            softcap: None,
            scale: 0.088,
        },
        4000,
    );
}

#[test]
fn attention_mqa_two_head_chunks_d80() {
    let mut tokens: Vec<(u32, u32)> = (0..20).map(|p| (0, p)).collect();
    tokens.extend((250..267).map(|p| (1, p)));
    run_attention(
        &AttnCase {
            n_head: 12,
            n_head_kv: 1,
            head_dim: 80,
            head_dim_v: 80,
            n_slots: 2,
            n_ctx: 300,
            tokens,
            window: Some(40),
            softcap: None,
            scale: 0.11,
        },
        5000,
    );
}

#[test]
fn attention_prefill_window_shorter_than_prompt() {
    run_attention(
        &AttnCase {
            n_head: 4,
            n_head_kv: 1,
            head_dim: 256,
            head_dim_v: 256,
            n_slots: 1,
            n_ctx: 64,
            tokens: (0..37).map(|p| (0, p)).collect(),
            window: Some(8),
            softcap: Some(30.0),
            scale: 1.0,
        },
        6000,
    );
}

#[test]
fn attention_value_dim_differs() {
    run_attention(
        &AttnCase {
            n_head: 8,
            n_head_kv: 2,
            head_dim: 192,
            head_dim_v: 128,
            n_slots: 2,
            n_ctx: 700,
            tokens: vec![(1, 699), (0, 5), (1, 300), (0, 64), (0, 63)],
            window: None,
            softcap: None,
            scale: 0.07,
        },
        7000,
    );
}

#[test]
fn attention_split_path_is_used_for_decode() {
    let Some((_, k)) = setup() else { return };
    assert!(k.attention_splits(1, 8, 2, 256, 5100, None) > 1);
    assert!(k.attention_splits(1, 32, 4, 128, 5001, None) > 1);
    assert_eq!(k.attention_splits(37, 16, 8, 128, 128, Some(16)), 1);
}

#[test]
fn attention_rejects_bad_shapes() {
    let Some((g, k)) = setup() else { return };
    let b = g.alloc(1 << 16).unwrap();
    let args = AttentionArgs {
        q: b.ptr(),
        k_cache: b.ptr(),
        v_cache: b.ptr(),
        out: b.ptr(),
        m: 1,
        slots: b.ptr(),
        positions: b.ptr(),
        n_head: 8,
        n_head_kv: 2,
        head_dim: 64,
        head_dim_v: 64,
        n_ctx: 16,
        scale: 1.0,
        window: None,
        softcap: None,
    };
    for bad in [
        AttentionArgs { n_head: 7, ..args },
        AttentionArgs {
            head_dim: 60,
            ..args
        },
        AttentionArgs {
            head_dim_v: 512,
            ..args
        },
        AttentionArgs {
            softcap: Some(0.0),
            ..args
        },
        AttentionArgs {
            k_cache: b.ptr() + 4,
            ..args
        },
        AttentionArgs { q: 0, ..args },
    ] {
        assert!(k.attention(&g, &bad).is_err(), "accepted {bad:?}");
    }
}

fn silu_ref(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn gelu_ref(x: f64) -> f64 {
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    0.5 * x * (1.0 + u.tanh())
}

#[test]
fn gated_activations() {
    let Some((g, k)) = setup() else { return };
    for (act, f) in [
        (Activation::Silu, silu_ref as fn(f64) -> f64),
        (Activation::GeluTanh, gelu_ref),
    ] {
        for (i, &n) in [1usize, 7, 4096 * 3 + 3, 100_003].iter().enumerate() {
            for pad in [0, 1] {
                let seed = 8000 + i as u64 * 10 + pad as u64;
                let gate = random(n, 8.0, seed);
                let up = random(n, 2.0, seed + 1);
                let want: Vec<f64> = gate
                    .iter()
                    .zip(&up)
                    .map(|(&g, &u)| f(g as f64) * u as f64)
                    .collect();
                let gd = upload_at(&g, &gate, pad);
                let ud = upload_at(&g, &up, pad);
                k.gated_act(&g, gd.at(4 * pad), ud.at(4 * pad), n, act)
                    .unwrap();
                let got = read_f32(&g, &gd, 4 * pad, n);
                let e = rel_err(&got, &want);
                assert!(e <= F32_TOL, "{act:?} n {n} pad {pad}: error {e:e}");
            }
        }
    }
}

#[test]
fn softcap_and_add() {
    let Some((g, k)) = setup() else { return };
    for (i, &n) in [1usize, 5, 10_007, 65_536].iter().enumerate() {
        for (scale, cap) in [(100.0f32, 30.0f32), (0.01, 50.0), (3.0, 1.0)] {
            let seed = 9000 + i as u64 * 10;
            let x = random(n, scale, seed);
            let want: Vec<f64> = x
                .iter()
                .map(|&x| (x as f64 / cap as f64).tanh() * cap as f64)
                .collect();
            let xd = g.upload(&x).unwrap();
            k.softcap(&g, xd.ptr(), n, cap).unwrap();
            let e = rel_err(&read_f32(&g, &xd, 0, n), &want);
            assert!(e <= F32_TOL, "softcap n {n} cap {cap}: error {e:e}");
        }
        for pad in [0, 1] {
            let a = random(n, 3.0, 9500 + i as u64);
            let b = random(n, 3.0, 9600 + i as u64);
            let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            let ad = upload_at(&g, &a, pad);
            let bd = upload_at(&g, &b, 0);
            k.add(&g, ad.at(4 * pad), bd.ptr(), n).unwrap();
            assert_eq!(read_f32(&g, &ad, 4 * pad, n), want, "add n {n} pad {pad}");
        }
    }
    assert!(k.softcap(&g, 0, 4, 1.0).is_err());
}

#[test]
fn gather_rows_copies_selected_rows() {
    let Some((g, k)) = setup() else { return };
    for &width in &[5usize, 1024, 4097, 8192] {
        let n_src = 8;
        let src = random(n_src * width, 1.0, 9900 + width as u64);
        let rows: Vec<u32> = vec![3, 0, 3, 7, 1];
        let sd = g.upload(&src).unwrap();
        let rd = g.upload(&rows).unwrap();
        let dd = g.upload(&vec![POISON; rows.len() * width]).unwrap();
        k.gather_rows(&g, sd.ptr(), dd.ptr(), rd.ptr(), rows.len(), width)
            .unwrap();
        let got = read_f32(&g, &dd, 0, rows.len() * width);
        for (i, &r) in rows.iter().enumerate() {
            let r = r as usize;
            assert_eq!(
                &got[i * width..(i + 1) * width],
                &src[r * width..(r + 1) * width],
                "gather width {width} row {i}"
            );
        }
    }
}
