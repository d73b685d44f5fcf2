//! The FlashAttention kernels against the f64 reference (`akunu_cpu::flash::reference_f64`)
//! on random inputs: head sizes, GQA ratios, causal and full, sliding windows, queries past
//! existing keys (chunked prefill), several sequences of different lengths, segments, tree
//! masks, soft-capping, odd lengths, single tokens, split-KV decode and fully masked rows; the
//! per-step debug dump against the reference's online-softmax states; and bad arguments.

mod common;

use std::sync::Arc;

use akunu_core::RopeStyle;
use akunu_cpu::flash::{intermediates, reference_f64, Problem};
use akunu_cuda::flash::{
    FlashArgs, FlashConfig, FlashDtype, FlashKernels, FlashRope, FlashScratch, Queries,
};
use akunu_cuda::layers::{LayerKernels, QkRopeStore};
use akunu_cuda::{DeviceBuffer, Gpu};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One test shape; sequences get `tokens[s]` queries placed after `offset[s]` stored keys.
#[derive(Clone, Debug)]
struct Case {
    d: usize,
    dv: usize,
    n_head: usize,
    n_kv: usize,
    tokens: Vec<usize>,
    offset: Vec<usize>,
    causal: bool,
    window: Option<usize>,
    softcap: Option<f32>,
    segments: bool,
    tree: bool,
    /// Tokens whose segment matches no key: their rows must come out as zeros.
    masked_rows: bool,
    per_token: bool,
    /// Every KV head reads the same K and V rows (a head stride of zero), which rules out the
    /// tensor copies of wgmma prefill: its whole tiles then load with cp.async too.
    shared_kv_heads: bool,
    /// Key rows scaled by 1 + position / 64: each tile's scores outgrow the rows' running
    /// maxima by more than the kernels let a maximum lag, so the outputs are rescaled often.
    growing_keys: bool,
}

impl Case {
    fn new(d: usize, n_head: usize, n_kv: usize, tokens: &[usize], offset: &[usize]) -> Case {
        Case {
            d,
            dv: d,
            n_head,
            n_kv,
            tokens: tokens.to_vec(),
            offset: offset.to_vec(),
            causal: true,
            window: None,
            softcap: None,
            segments: false,
            tree: false,
            masked_rows: false,
            per_token: false,
            shared_kv_heads: false,
            growing_keys: false,
        }
    }
}

fn round(x: f32, dtype: FlashDtype) -> f32 {
    match dtype {
        FlashDtype::F16 => f16::from_f32(x).to_f32(),
        FlashDtype::Bf16 => bf16::from_f32(x).to_f32(),
    }
}

fn bits(x: &[f32], dtype: FlashDtype) -> Vec<u16> {
    x.iter()
        .map(|&v| match dtype {
            FlashDtype::F16 => f16::from_f32(v).to_bits(),
            FlashDtype::Bf16 => bf16::from_f32(v).to_bits(),
        })
        .collect()
}

/// A random problem for `c`: values in [-2, 2) with a few large rows (peaky softmax), rounded
/// to the element type so the reference sees what the kernel sees.
fn problem(c: &Case, dtype: FlashDtype, seed: u64) -> Problem {
    let mut rng = StdRng::seed_from_u64(seed);
    let n_seq = c.tokens.len();
    let n_tokens: usize = c.tokens.iter().sum();
    let n_ctx = (0..n_seq)
        .map(|s| c.offset[s] + c.tokens[s])
        .max()
        .unwrap_or(1)
        .max(1)
        + 3;
    let vals = |n: usize, rng: &mut StdRng| -> Vec<f32> {
        (0..n)
            .map(|i| {
                let big = if i % 97 == 5 { 4.0 } else { 1.0 };
                round(rng.random_range(-2.0f32..2.0) * big, dtype)
            })
            .collect()
    };
    let q = vals(n_tokens * c.n_head * c.d, &mut rng);
    let mut k = vals(n_seq * c.n_kv * n_ctx * c.d, &mut rng);
    let mut v = vals(n_seq * c.n_kv * n_ctx * c.dv, &mut rng);
    if c.growing_keys {
        for (row, chunk) in k.chunks_mut(c.d).enumerate() {
            let scale = 1.0 + (row % n_ctx) as f32 / 64.0;
            for x in chunk {
                *x = round(*x * scale, dtype);
            }
        }
    }
    if c.shared_kv_heads {
        // What the kernels read through a zero head stride: head 0's rows for every head.
        for (x, d) in [(&mut k, c.d), (&mut v, c.dv)] {
            let head = n_ctx * d;
            for s in 0..n_seq {
                let seq = s * c.n_kv * head;
                for h in 1..c.n_kv {
                    x.copy_within(seq..seq + head, seq + h * head);
                }
            }
        }
    }
    let (mut q_pos, mut q_seq) = (Vec::new(), Vec::new());
    for s in 0..n_seq {
        for i in 0..c.tokens[s] {
            q_pos.push((c.offset[s] + i) as u32);
            q_seq.push(s as u32);
        }
    }
    let kv_len: Vec<u32> = (0..n_seq)
        .map(|s| (c.offset[s] + c.tokens[s]) as u32)
        .collect();
    let (mut q_seg, mut k_seg) = (None, None);
    if c.segments || c.masked_rows {
        // Packed documents: segment ids change at random key positions.
        let mut ks = vec![0i32; n_seq * n_ctx];
        for s in 0..n_seq {
            let mut id = 0;
            for j in 0..n_ctx {
                if c.segments && j > 0 && rng.random_range(0..13) == 0 {
                    id += 1;
                }
                ks[s * n_ctx + j] = id;
            }
        }
        let qs: Vec<i32> = (0..n_tokens)
            .map(|t| {
                if c.masked_rows && t % 3 == 1 {
                    -1
                } else {
                    ks[q_seq[t] as usize * n_ctx + q_pos[t] as usize]
                }
            })
            .collect();
        q_seg = Some(qs);
        k_seg = Some(ks);
    }
    let tree = c.tree.then(|| {
        // Draft tokens start at each sequence's offset; a token sees itself and a random
        // subset of the earlier drafts.
        let mut masks = Vec::new();
        let mut bases = Vec::new();
        for t in 0..n_tokens {
            let s = q_seq[t] as usize;
            let i = q_pos[t] as usize - c.offset[s];
            let mut m = 1u64 << i.min(63);
            for b in 0..i.min(63) {
                if rng.random_range(0..2) == 0 {
                    m |= 1 << b;
                }
            }
            masks.push(m);
            bases.push(c.offset[s] as u32);
        }
        (masks, bases)
    });
    Problem {
        n_tokens,
        n_head: c.n_head,
        n_head_kv: c.n_kv,
        head_dim: c.d,
        head_dim_v: c.dv,
        n_seq,
        n_ctx,
        q,
        k,
        v,
        q_pos,
        q_seq,
        kv_len,
        causal: c.causal,
        window: c.window,
        softcap: c.softcap,
        scale: 1.0 / (c.d as f32).sqrt(),
        q_seg,
        k_seg,
        tree,
    }
}

struct Uploaded {
    _bufs: Vec<DeviceBuffer>,
    out: DeviceBuffer,
    lse: DeviceBuffer,
    args: FlashArgs,
}

fn upload(gpu: &Gpu, p: &Problem, cfg: &FlashConfig, shared_kv_heads: bool) -> Uploaded {
    let q = if cfg.q_f32 {
        gpu.upload(&p.q).unwrap()
    } else {
        gpu.upload(&bits(&p.q, cfg.dtype)).unwrap()
    };
    let k = gpu.upload(&bits(&p.k, cfg.dtype)).unwrap();
    let v = gpu.upload(&bits(&p.v, cfg.dtype)).unwrap();
    let pos = gpu.upload(&p.q_pos).unwrap();
    let seq = gpu.upload(&p.q_seq).unwrap();
    let len = gpu.upload(&p.kv_len).unwrap();
    let elem = if cfg.out_f32 { 4 } else { 2 };
    let out = gpu
        .upload(&vec![0xffu8; p.n_tokens * p.n_head * p.head_dim_v * elem])
        .unwrap();
    let lse = gpu.upload(&vec![f32::NAN; p.n_tokens * p.n_head]).unwrap();
    let mut bufs = vec![q, k, v, pos, seq, len];
    let segments = match (&p.q_seg, &p.k_seg) {
        (Some(qs), Some(ks)) => {
            bufs.push(gpu.upload(qs).unwrap());
            bufs.push(gpu.upload(ks).unwrap());
            Some((bufs[6].ptr(), bufs[7].ptr()))
        }
        _ => None,
    };
    let tree = p.tree.as_ref().map(|(m, b)| {
        bufs.push(gpu.upload(m).unwrap());
        bufs.push(gpu.upload(b).unwrap());
        (bufs[bufs.len() - 2].ptr(), bufs[bufs.len() - 1].ptr())
    });
    let (d, dv, n) = (p.head_dim, p.head_dim_v, p.n_ctx);
    let args = FlashArgs {
        q: bufs[0].ptr(),
        k: bufs[1].ptr(),
        v: bufs[2].ptr(),
        out: out.ptr(),
        lse: lse.ptr(),
        n_tokens: p.n_tokens,
        n_head: p.n_head,
        n_head_kv: p.n_head_kv,
        n_ctx: n,
        q_stride: [p.n_head * d, d],
        k_stride: [
            p.n_head_kv * n * d,
            if shared_kv_heads { 0 } else { n * d },
            d,
        ],
        v_stride: [
            p.n_head_kv * n * dv,
            if shared_kv_heads { 0 } else { n * dv },
            dv,
        ],
        out_stride: [p.n_head * dv, dv],
        q_pos: bufs[3].ptr(),
        q_seq: bufs[4].ptr(),
        kv_len: bufs[5].ptr(),
        causal: p.causal,
        window: p.window,
        softcap: p.softcap,
        scale: p.scale,
        segments,
        tree,
        debug: 0,
        debug_steps: 0,
        int8_out: None,
        rope: None,
    };
    Uploaded {
        _bufs: bufs,
        out,
        lse,
        args,
    }
}

fn read_out(gpu: &Gpu, u: &Uploaded, cfg: &FlashConfig, n: usize) -> Vec<f32> {
    if cfg.out_f32 {
        let mut o = vec![0f32; n];
        gpu.read(&u.out, 0, &mut o).unwrap();
        o
    } else {
        let mut o = vec![0u16; n];
        gpu.read(&u.out, 0, &mut o).unwrap();
        o.iter()
            .map(|&b| match cfg.dtype {
                FlashDtype::F16 => f16::from_bits(b).to_f32(),
                FlashDtype::Bf16 => bf16::from_bits(b).to_f32(),
            })
            .collect()
    }
}

fn runs(p: &Problem) -> Vec<(usize, usize)> {
    let mut r: Vec<(usize, usize)> = Vec::new();
    for t in 0..p.n_tokens {
        match r.last_mut() {
            Some((first, count)) if p.q_seq[*first] == p.q_seq[t] => *count += 1,
            _ => r.push((t, 1)),
        }
    }
    r
}

/// Runs `c` and checks every row against the f64 reference.
fn check(gpu: &Arc<Gpu>, k: &FlashKernels, c: &Case, seed: u64) {
    let cfg = *k.config();
    let p = problem(c, cfg.dtype, seed);
    p.check().unwrap();
    let (want, want_lse) = reference_f64(&p);
    let u = upload(gpu, &p, &cfg, c.shared_kv_heads);
    let runs = runs(&p);
    let q = if c.per_token {
        Queries::PerToken
    } else {
        Queries::Runs(&runs)
    };
    let max_kv = p.n_ctx;
    let scratch = FlashScratch::new(gpu, k.scratch_bytes(&u.args, &q, max_kv).max(1)).unwrap();
    // Where the kernels can, the outputs in the GEMVs' int8 form too.
    let int8 = k.writes_int8(&q, p.n_head, p.n_head_kv).then(|| {
        let n = p.n_tokens * p.n_head * p.head_dim_v;
        (gpu.alloc(n).unwrap(), gpu.alloc(n / 32 * 16).unwrap())
    });
    let mut args = u.args;
    args.int8_out = int8.as_ref().map(|(l, s)| (l.ptr(), s.ptr()));
    // Twice on one scratch, the output poisoned (all-ones bits, NaN) in between: the second run
    // must find the split counters re-armed by the first, as a replayed graph does.
    for _ in 0..2 {
        gpu.write(&u.out, 0, &vec![0xffu8; u.out.bytes()]).unwrap();
        gpu.write(&u.lse, 0, &vec![0xffu8; u.lse.bytes()]).unwrap();
        if let Some((l, s)) = &int8 {
            gpu.write(l, 0, &vec![0x55u8; l.bytes()]).unwrap();
            gpu.write(s, 0, &vec![0xffu8; s.bytes()]).unwrap();
        }
        k.run(gpu, &args, q, max_kv, &scratch).unwrap();
    }
    gpu.sync().unwrap();
    let got = read_out(gpu, &u, &cfg, want.len());
    if let Some((l, s)) = &int8 {
        let mut levels = vec![0i8; got.len()];
        let mut sums = vec![0f32; got.len() / 8];
        gpu.read(l, 0, &mut levels).unwrap();
        gpu.read(s, 0, &mut sums).unwrap();
        common::check_act_quant(&format!("{cfg:?} {c:?} int8"), &got, &levels, &sums);
    }
    let mut lse = vec![0f32; want_lse.len()];
    gpu.read(&u.lse, 0, &mut lse).unwrap();

    let what = format!("{cfg:?} {c:?}");
    let dv = p.head_dim_v;
    let (mut visible_got, mut visible_want) = (Vec::new(), Vec::new());
    for row in 0..p.n_tokens * p.n_head {
        let g = &got[row * dv..(row + 1) * dv];
        let w = &want[row * dv..(row + 1) * dv];
        assert!(
            g.iter().all(|x| x.is_finite()),
            "{what}: row {row} not finite"
        );
        if want_lse[row] == f64::NEG_INFINITY {
            assert!(
                g.iter().all(|&x| x == 0.0) && lse[row] == f32::NEG_INFINITY,
                "{what}: fully masked row {row} gave {:?}.. lse {}",
                &g[..4],
                lse[row]
            );
            continue;
        }
        let e = (lse[row] as f64 - want_lse[row]).abs();
        assert!(
            e <= 2e-3 * (1.0 + want_lse[row].abs()),
            "{what}: row {row} lse {} vs {}",
            lse[row],
            want_lse[row]
        );
        visible_got.extend_from_slice(g);
        visible_want.extend_from_slice(w);
    }
    // P is rounded to the element type for the P·V product, as in every FlashAttention.
    let tol = match (cfg.dtype, cfg.out_f32) {
        (FlashDtype::F16, true) => 4e-3,
        (FlashDtype::F16, false) => 6e-3,
        (FlashDtype::Bf16, _) => 2.5e-2,
    };
    if !visible_want.is_empty() {
        let e = common::rel_err(&visible_got, &visible_want);
        assert!(e <= tol, "{what}: relative error {e:.2e} > {tol:.0e}");
    }
}

fn kernels(gpu: &Gpu, dtype: FlashDtype, d: usize, dv: usize, f32_io: bool) -> FlashKernels {
    let cfg = FlashConfig::new(dtype, d, dv);
    FlashKernels::new(gpu, if f32_io { cfg.f32_io() } else { cfg }).unwrap()
}

#[test]
fn prefill_every_head_size_and_group() {
    let Some(gpu) = common::gpu() else { return };
    let mut seed = 1;
    for d in [64, 128, 256] {
        let k = kernels(&gpu, FlashDtype::F16, d, d, true);
        for group in [1, 2, 4, 8, 16] {
            for causal in [true, false] {
                let mut c = Case::new(d, 2 * group, 2, &[37, 1, 100], &[0, 5, 29]);
                c.causal = causal;
                check(&gpu, &k, &c, seed);
                seed += 1;
            }
        }
    }
}

/// More KV heads than one band holds (wgmma prefill bands a quarter of the heads, at least
/// four), causal runs long enough for several runs of tile lengths, the last of them one band:
/// every tile of every head is handed out once, whatever the order.
#[test]
fn prefill_in_length_runs_and_head_bands() {
    let Some(gpu) = common::gpu() else { return };
    let mut seed = 950;
    for d in [64, 128, 256] {
        let k = kernels(&gpu, FlashDtype::Bf16, d, d, false);
        for n_kv in [8, 12] {
            for causal in [true, false] {
                let mut c = Case::new(d, 2 * n_kv, n_kv, &[520, 130], &[0, 40]);
                c.causal = causal;
                check(&gpu, &k, &c, seed);
                seed += 1;
            }
        }
    }
}

/// The engine's prefill: f16 queries, f32 output.
#[test]
fn prefill_with_f16_queries_and_f32_output() {
    let Some(gpu) = common::gpu() else { return };
    let mut seed = 850;
    for d in [32, 64, 128, 256] {
        let cfg = FlashConfig::new(FlashDtype::F16, d, d).f32_out();
        let k = FlashKernels::new(&gpu, cfg).unwrap();
        for group in [1, 4, 8] {
            let c = Case::new(d, 2 * group, 2, &[150, 3], &[0, 70]);
            check(&gpu, &k, &c, seed);
            seed += 1;
        }
    }
}

/// Groups wider than a tile's rows: each token's query heads span one or more whole tiles,
/// or end part-way into the second (192 heads, 128-row tiles), the last tile of a run partly
/// filled.
#[test]
fn wide_groups_at_head_size_256() {
    let Some(gpu) = common::gpu() else { return };
    let k = kernels(&gpu, FlashDtype::F16, 256, 256, true);
    let mut seed = 800;
    for group in [32, 96, 192] {
        for per_token in [false, true] {
            let mut c = Case::new(256, group, 1, &[9, 2], &[100, 40]);
            c.per_token = per_token;
            check(&gpu, &k, &c, seed);
            seed += 1;
        }
    }
}

#[test]
fn scores_that_outgrow_the_running_maxima() {
    let Some(gpu) = common::gpu() else { return };
    for (dtype, d, f32_io) in [
        (FlashDtype::Bf16, 64, false),
        (FlashDtype::Bf16, 128, false),
        (FlashDtype::F16, 128, true),
        (FlashDtype::F16, 256, true),
        (FlashDtype::F16, 32, true),
    ] {
        let k = kernels(&gpu, dtype, d, d, f32_io);
        for causal in [true, false] {
            let mut c = Case::new(d, 8, 2, &[300, 77], &[0, 1000]);
            c.causal = causal;
            c.growing_keys = true;
            check(&gpu, &k, &c, 1100 + d as u64);
        }
        // Decode, split over the keys.
        let mut c = Case::new(d, 8, 2, &[1, 1], &[3000, 700]);
        c.per_token = true;
        c.growing_keys = true;
        check(&gpu, &k, &c, 1200 + d as u64);
    }
}

#[test]
fn small_head_sizes() {
    let Some(gpu) = common::gpu() else { return };
    for d in [16, 32] {
        let k = kernels(&gpu, FlashDtype::F16, d, d, true);
        for group in [1, 4] {
            for per_token in [false, true] {
                let mut c = Case::new(d, 2 * group, 2, &[41, 2], &[3, 90]);
                c.per_token = per_token;
                check(&gpu, &k, &c, 1000 + d as u64 + group as u64);
            }
        }
    }
}

#[test]
fn bf16_and_f16_storage() {
    let Some(gpu) = common::gpu() else { return };
    for (dtype, d) in [
        (FlashDtype::Bf16, 64),
        (FlashDtype::Bf16, 128),
        (FlashDtype::F16, 128),
        (FlashDtype::Bf16, 256),
    ] {
        let k = kernels(&gpu, dtype, d, d, false);
        for (i, group) in [1, 4, 16].into_iter().enumerate() {
            let c = Case::new(d, 4 * group, 4, &[130, 7], &[0, 64]);
            check(&gpu, &k, &c, 100 + i as u64);
            let mut c = c.clone();
            c.per_token = true;
            check(&gpu, &k, &c, 200 + i as u64);
        }
    }
}

/// The decode tests' kernels (f16, f32 queries and output) at every decode block size the head
/// size takes (`FlashConfig::with_decode_warps`), or at the one a chip config sets.
fn decode_builds(gpu: &Gpu, d: usize) -> Vec<FlashKernels> {
    let mut builds: Vec<FlashKernels> = Vec::new();
    for warps in [4, 8] {
        let cfg = FlashConfig::new(FlashDtype::F16, d, d)
            .f32_io()
            .with_decode_warps(warps);
        let k = FlashKernels::new(gpu, cfg).unwrap();
        let warps = k.config().decode_warps;
        if builds.iter().all(|b| b.config().decode_warps != warps) {
            builds.push(k);
        }
    }
    builds
}

#[test]
fn decode_with_split_kv() {
    let Some(gpu) = common::gpu() else { return };
    for (d, k) in [64, 128, 256]
        .into_iter()
        .flat_map(|d| decode_builds(&gpu, d).into_iter().map(move |k| (d, k)))
    {
        for group in [1, 4, 8, 16] {
            // One token per sequence after 1..3000 stored keys: few tiles, many splits.
            let mut c = Case::new(d, 8 * group, 8, &[1, 1, 1], &[2999, 0, 517]);
            c.per_token = true;
            check(&gpu, &k, &c, 300 + group as u64);
            // Several tokens of one sequence, each its own tile (short batches).
            let mut c = Case::new(d, 2 * group, 2, &[5], &[1000]);
            c.per_token = true;
            check(&gpu, &k, &c, 400 + group as u64);
        }
        // One long sequence on one KV head: dozens of splits, more than one merge round.
        let mut c = Case::new(d, 4, 1, &[1], &[20_000]);
        c.per_token = true;
        check(&gpu, &k, &c, 500);
        // The same on eight KV heads: fewer, longer splits, whose warps take the steps by turns.
        let mut c = Case::new(d, 32, 8, &[1], &[20_000]);
        c.per_token = true;
        check(&gpu, &k, &c, 600);
    }
}

/// One fused-RoPE decode shape: query heads over KV heads, head size, rotated dimensions,
/// style, QK-norm, and the stored keys before each sequence's token.
struct RopeCase {
    n_head: usize,
    n_kv: usize,
    d: usize,
    n_rot: usize,
    style: RopeStyle,
    qk_norm: bool,
    stored: Vec<usize>,
    window: Option<usize>,
}

/// Decode with the QK-norm, RoPE and KV store inside the attention kernel against the same
/// step as two launches (`qk_rope_store`, then attention), which the layer tests check
/// against their f64 references: same outputs and int8 form, same cache afterwards.
fn check_rope_fused(
    gpu: &Arc<Gpu>,
    layers: &LayerKernels,
    k: &FlashKernels,
    c: &RopeCase,
    seed: u64,
) {
    let (nh, hk, d) = (c.n_head, c.n_kv, c.d);
    let m = c.stored.len();
    let n_ctx = c.stored.iter().max().unwrap() + 64;
    let q = common::random(m * nh * d, 3.0, seed);
    let k_new = common::random(m * hk * d, 3.0, seed + 1);
    let v_new = common::random(m * hk * d, 3.0, seed + 2);
    let norms = common::random(2 * d, 2.0, seed + 3);
    let inv_freq = akunu_core::plan::inv_freq(c.n_rot, 10000.0, 1.0, None);
    let mut rng = StdRng::seed_from_u64(seed + 4);
    let cache: Vec<u16> = (0..2 * m * hk * n_ctx * d)
        .map(|_| f16::from_f32(rng.random_range(-2.0f32..2.0)).to_bits())
        .collect();
    let positions: Vec<u32> = c.stored.iter().map(|&s| s as u32).collect();
    let slots: Vec<u32> = (0..m as u32).rev().collect();
    let up = |x: &[f32]| gpu.upload(x).unwrap();
    let (kd, vd, nd, fd) = (up(&k_new), up(&v_new), up(&norms), up(&inv_freq));
    let pd = gpu.upload(&positions).unwrap();
    let sd = gpu.upload(&slots).unwrap();
    let half = m * hk * n_ctx * d;
    let norm = |i: usize| c.qk_norm.then(|| nd.at(4 * i * d));
    let scratch_for = |a: &FlashArgs| {
        FlashScratch::new(gpu, k.scratch_bytes(a, &Queries::PerToken, n_ctx).max(1)).unwrap()
    };
    // Each path: its cache, output and int8 form, read back after two runs (as graph replays).
    let mut results = Vec::new();
    for fused in [false, true] {
        let cache_d = gpu.upload(&cache).unwrap();
        let q_d = up(&q);
        let out = up(&vec![f32::NAN; m * nh * d]);
        let levels = gpu.alloc(m * nh * d).unwrap();
        let sums = gpu.alloc(m * nh * d / 32 * 16).unwrap();
        let args = FlashArgs {
            q: q_d.ptr(),
            k: cache_d.ptr(),
            v: cache_d.at(2 * half),
            out: out.ptr(),
            n_tokens: m,
            n_head: nh,
            n_head_kv: hk,
            n_ctx,
            q_stride: [nh * d, d],
            k_stride: [hk * n_ctx * d, n_ctx * d, d],
            v_stride: [hk * n_ctx * d, n_ctx * d, d],
            out_stride: [nh * d, d],
            q_pos: pd.ptr(),
            q_seq: sd.ptr(),
            causal: true,
            window: c.window,
            scale: 1.0 / (d as f32).sqrt(),
            int8_out: Some((levels.ptr(), sums.ptr())),
            rope: fused.then_some(FlashRope {
                k_new: kd.ptr(),
                v_new: vd.ptr(),
                q_norm: norm(0).unwrap_or(0),
                k_norm: norm(1).unwrap_or(0),
                eps: 1e-6,
                neox: c.style == RopeStyle::Neox,
                n_rot: c.n_rot,
                inv_freq: fd.ptr(),
            }),
            ..FlashArgs::default()
        };
        let scratch = scratch_for(&args);
        for _ in 0..2 {
            gpu.write(&q_d, 0, &q).unwrap();
            if !fused {
                layers
                    .qk_rope_store(
                        gpu,
                        &QkRopeStore {
                            q: q_d.ptr(),
                            q16: None,
                            k: kd.ptr(),
                            v: vd.ptr(),
                            m,
                            n_head: nh,
                            n_head_kv: hk,
                            head_dim: d,
                            head_dim_v: d,
                            q_norm: norm(0),
                            k_norm: norm(1),
                            eps: 1e-6,
                            style: c.style,
                            n_rot: c.n_rot,
                            inv_freq: fd.ptr(),
                            positions: pd.ptr(),
                            slots: sd.ptr(),
                            k_cache: args.k,
                            v_cache: args.v,
                            n_ctx,
                        },
                    )
                    .unwrap();
            }
            k.run(gpu, &args, Queries::PerToken, n_ctx, &scratch)
                .unwrap();
        }
        gpu.sync().unwrap();
        let mut o = vec![0f32; m * nh * d];
        gpu.read(&out, 0, &mut o).unwrap();
        let mut l = vec![0i8; o.len()];
        let mut s = vec![0f32; o.len() / 8];
        gpu.read(&levels, 0, &mut l).unwrap();
        gpu.read(&sums, 0, &mut s).unwrap();
        common::check_act_quant(&format!("fused {fused} int8"), &o, &l, &s);
        let mut kv = vec![0u16; cache.len()];
        gpu.read(&cache_d, 0, &mut kv).unwrap();
        results.push((o, kv));
    }
    let what = format!(
        "{nh}/{hk} heads of {d}, rot {} {:?}, norm {}, stored {:?}, window {:?}",
        c.n_rot, c.style, c.qk_norm, c.stored, c.window
    );
    let (want, got) = (&results[0], &results[1]);
    let want_o: Vec<f64> = want.0.iter().map(|&x| x as f64).collect();
    let e = common::rel_err(&got.0, &want_o);
    assert!(e <= 2e-3, "{what}: output differs by {e:.2e}");
    // The cache: the tokens' rows within f16 rounding of each other, every other bit as it was.
    for (i, (&a, &b)) in got.1.iter().zip(&want.1).enumerate() {
        let (x, y) = (f16::from_bits(a).to_f32(), f16::from_bits(b).to_f32());
        let pos = i / d % n_ctx;
        let row_of_token = positions
            .iter()
            .zip(&slots)
            .any(|(&p, &s)| pos == p as usize && i % half / (hk * n_ctx * d) == s as usize);
        if row_of_token {
            assert!(
                (x - y).abs() <= 2e-3 * (1.0 + y.abs()),
                "{what}: cache {i}: {x} vs {y}"
            );
        } else {
            assert_eq!(a, b, "{what}: cache element {i} changed");
        }
    }
}

#[test]
fn decode_with_rope_and_kv_store_fused() {
    let Some(gpu) = common::gpu() else { return };
    let layers = LayerKernels::new(&gpu).unwrap();
    let mut seed = 7000;
    for (d, k) in [64, 128, 256]
        .into_iter()
        .flat_map(|d| decode_builds(&gpu, d).into_iter().map(move |k| (d, k)))
    {
        for (group, style, qk_norm, n_rot) in [
            (1, RopeStyle::Neox, true, d),
            (4, RopeStyle::Normal, false, d),
            (8, RopeStyle::Neox, false, d / 2),
            (16, RopeStyle::Normal, true, d / 4),
        ] {
            for window in [None, Some(700)] {
                let c = RopeCase {
                    n_head: 2 * group,
                    n_kv: 2,
                    d,
                    n_rot,
                    style,
                    qk_norm,
                    // Empty, inside a first step, on step and split edges, long.
                    stored: vec![0, 5, 63, 64, 1000, 2999],
                    window,
                };
                check_rope_fused(&gpu, &layers, &k, &c, seed);
                seed += 10;
            }
        }
        // Long splits, whose warps take the steps by turns: the new key lands in one of them.
        let c = RopeCase {
            n_head: 32,
            n_kv: 8,
            d,
            n_rot: d,
            style: RopeStyle::Normal,
            qk_norm: true,
            stored: vec![20_000, 3],
            window: None,
        };
        check_rope_fused(&gpu, &layers, &k, &c, seed);
        seed += 10;
    }
}

#[test]
fn kv_heads_sharing_one_cache_row() {
    // Prefill past a whole step (128 keys, 64 at head size 256), so wgmma prefill (Hopper)
    // copies whole tiles, here with cp.async since a zero head stride rules out its tensor maps.
    let Some(gpu) = common::gpu() else { return };
    for d in [64, 128, 256] {
        let k = kernels(&gpu, FlashDtype::Bf16, d, d, false);
        for causal in [true, false] {
            let mut c = Case::new(d, 8, 2, &[300, 45], &[0, 200]);
            c.causal = causal;
            c.shared_kv_heads = true;
            check(&gpu, &k, &c, 300 + d as u64 + u64::from(causal));
        }
    }
}

#[test]
fn windows_softcap_and_odd_head_sizes() {
    let Some(gpu) = common::gpu() else { return };
    let k = kernels(&gpu, FlashDtype::F16, 128, 128, true);
    for (i, window) in [1, 7, 64, 300].into_iter().enumerate() {
        for per_token in [false, true] {
            let tokens: &[usize] = if per_token { &[1, 1] } else { &[90, 3] };
            let mut c = Case::new(128, 8, 2, tokens, &[500, 20]);
            c.window = Some(window);
            c.softcap = (i % 2 == 1).then_some(30.0);
            c.per_token = per_token;
            check(&gpu, &k, &c, 500 + i as u64);
        }
    }
    // Gemma's shapes: head size 256, a window and soft-capping, prefill past several steps.
    let k = kernels(&gpu, FlashDtype::F16, 256, 256, true);
    for (i, window) in [64, 300].into_iter().enumerate() {
        let mut c = Case::new(256, 8, 2, &[400, 70], &[0, 150]);
        c.window = Some(window);
        c.softcap = Some(30.0);
        check(&gpu, &k, &c, 510 + i as u64);
    }
    let k = kernels(&gpu, FlashDtype::F16, 192, 128, true);
    let mut c = Case::new(192, 8, 4, &[33, 1], &[10, 70]);
    c.dv = 128;
    c.softcap = Some(50.0);
    check(&gpu, &k, &c, 600);
}

#[test]
fn segments_tree_masks_and_fully_masked_rows() {
    let Some(gpu) = common::gpu() else { return };
    let k = kernels(&gpu, FlashDtype::F16, 128, 128, true);
    for (i, per_token) in [false, true].into_iter().enumerate() {
        let mut c = Case::new(128, 8, 2, &[150, 40], &[0, 300]);
        c.segments = true;
        c.per_token = per_token;
        check(&gpu, &k, &c, 700 + i as u64);

        let mut c = Case::new(128, 16, 4, &[6, 9], &[200, 33]);
        c.tree = true;
        c.per_token = per_token;
        check(&gpu, &k, &c, 710 + i as u64);

        let mut c = Case::new(128, 4, 4, &[20, 1], &[0, 80]);
        c.masked_rows = true;
        c.per_token = per_token;
        check(&gpu, &k, &c, 720 + i as u64);
    }
    // A window of one key: each query sees only itself, and some rows see nothing.
    let mut c = Case::new(128, 4, 1, &[3], &[0]);
    c.causal = false;
    c.window = Some(1);
    c.masked_rows = true;
    check(&gpu, &k, &c, 730);
}

#[test]
fn debug_dump_matches_reference_states() {
    let Some(gpu) = common::gpu() else { return };
    let cfg = FlashConfig::new(FlashDtype::F16, 128, 128).with_debug();
    let k = FlashKernels::new(&gpu, cfg).unwrap();
    // One decode token of a group of 4 heads over 150 keys: block 0 holds rows 0..4, query
    // heads 0..4 of token 0.
    let mut c = Case::new(128, 4, 1, &[1], &[149]);
    c.per_token = true;
    c.softcap = Some(20.0);
    let p = problem(&c, cfg.dtype, 800);
    let mut u = upload(&gpu, &p, &cfg, false);
    let bn = cfg.keys_per_step(true);
    let steps = 150usize.div_ceil(bn);
    let dbg = gpu
        .upload(&vec![f32::NAN; steps * cfg.debug_step_floats(true)])
        .unwrap();
    u.args.debug = dbg.ptr();
    u.args.debug_steps = steps;
    let scratch = FlashScratch::new(&gpu, 1 << 20).unwrap();
    k.run(&gpu, &u.args, Queries::PerToken, bn, &scratch)
        .unwrap();
    gpu.sync().unwrap();
    let mut d = vec![0f32; steps * cfg.debug_step_floats(true)];
    gpu.read(&dbg, 0, &mut d).unwrap();
    let close =
        |a: f32, b: f32, tol: f32| (a == b) || (a - b).abs() <= tol * (1.0 + b.abs().max(a.abs()));
    for head in 0..4 {
        let want = intermediates(&p, 0, head, bn);
        assert_eq!(want.len(), steps);
        for (s, w) in want.iter().enumerate() {
            let at = s * cfg.debug_step_floats(true);
            let scores = &d[at + head * bn..at + (head + 1) * bn];
            let probs = &d[at + 16 * bn + head * bn..at + 16 * bn + (head + 1) * bn];
            let mx = d[at + 32 * bn + head];
            let sum = d[at + 32 * bn + 16 + head];
            let out = &d[at + 32 * bn + 32 + head * 128..at + 32 * bn + 32 + (head + 1) * 128];
            let here = format!("head {head} step {s}");
            // The last step is partial: keys past the stored ones are masked.
            for j in 0..bn {
                let (ws, wp) = w
                    .scores
                    .get(j)
                    .map_or((f32::NEG_INFINITY, 0.0), |&x| (x, w.probs[j]));
                assert!(
                    close(scores[j], ws, 1e-4),
                    "{here}: score {j}: {} vs {ws}",
                    scores[j]
                );
                assert!(
                    close(probs[j], wp, 1e-4),
                    "{here}: prob {j}: {} vs {wp}",
                    probs[j]
                );
            }
            assert!(
                close(mx, w.row_max, 1e-4),
                "{here}: max {mx} vs {}",
                w.row_max
            );
            assert!(
                close(sum, w.row_sum, 1e-3),
                "{here}: sum {sum} vs {}",
                w.row_sum
            );
            let e = common::rel_err(out, &w.out.iter().map(|&x| x as f64).collect::<Vec<_>>());
            assert!(e <= 5e-3, "{here}: partial output relative error {e:.2e}");
        }
    }
}

#[test]
fn bad_arguments_are_errors() {
    let Some(gpu) = common::gpu() else { return };
    let k = kernels(&gpu, FlashDtype::F16, 128, 128, false);
    let cfg = *k.config();
    let c = Case::new(128, 4, 2, &[3], &[0]);
    let p = problem(&c, cfg.dtype, 900);
    let u = upload(&gpu, &p, &cfg, false);
    let scratch = FlashScratch::new(&gpu, 1 << 16).unwrap();
    let run = |a: &FlashArgs| k.run(&gpu, a, Queries::PerToken, 8, &scratch);
    let mut a = u.args;
    a.n_head = 3;
    assert!(run(&a).is_err(), "3 heads over 2 KV heads");
    a.n_head = 1;
    assert!(run(&a).is_err(), "1 head over 2 KV heads");
    assert_eq!(
        k.scratch_bytes(&a, &Queries::Runs(&[(0, 3)]), 8),
        0,
        "scratch for 1 head over 2 KV heads"
    );
    let mut a = u.args;
    a.k_stride[2] = 100;
    assert!(run(&a).is_err(), "unaligned key rows");
    let mut a = u.args;
    a.window = Some(0);
    assert!(run(&a).is_err(), "empty window");
    let mut a = u.args;
    a.softcap = Some(f32::NAN);
    assert!(run(&a).is_err(), "NaN soft-cap");
    let a = u.args;
    assert!(
        k.run(&gpu, &a, Queries::Runs(&[(2, 5)]), 8, &scratch)
            .is_err(),
        "run past the tokens"
    );
    assert!(
        FlashKernels::new(
            &gpu,
            FlashConfig {
                head_dim: 72,
                ..cfg
            }
        )
        .is_err(),
        "head size 72"
    );
    let mut a = u.args;
    a.rope = Some(FlashRope {
        k_new: a.k,
        v_new: a.v,
        q_norm: 0,
        k_norm: 0,
        eps: 1e-6,
        neox: false,
        n_rot: 128,
        inv_freq: a.q_pos,
    });
    assert!(run(&a).is_err(), "RoPE in attention with f16 queries");
    run(&u.args).unwrap();
    // f32 queries are read 16 bytes at a time.
    let k32 = kernels(&gpu, FlashDtype::F16, 128, 128, true);
    let up32 = upload(&gpu, &p, k32.config(), false);
    let run32 = |a: &FlashArgs| k32.run(&gpu, a, Queries::PerToken, 8, &scratch);
    let mut a = up32.args;
    a.q += 4;
    assert!(run32(&a).is_err(), "f32 query rows off 16-byte boundaries");
    let mut a = up32.args;
    a.q_stride[1] = 130;
    assert!(run32(&a).is_err(), "f32 query head stride of 130");
    run32(&up32.args).unwrap();
    gpu.sync().unwrap();
}
