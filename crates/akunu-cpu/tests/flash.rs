//! `akunu_cpu::flash`: the f32 fast path and the per-tile intermediates against the f64
//! reference, over every head size, grouped-query ratio and mask the GPU kernels support, on
//! random inputs (never zeros) with some large rows so that softmaxes are peaky. The reference
//! itself is checked on cases small enough to work out by hand, and the comparison is shown to
//! catch a wrong mask, scale or softcap.
//!
//! Cached keys and values past `kv_len` are NaN: reading one anywhere would show.

use akunu_cpu::flash::{self, Problem};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// `(head_dim, head_dim_v)`.
const DIMS: [(usize, usize); 4] = [(64, 64), (128, 128), (256, 256), (192, 128)];
/// Query heads per key/value head.
const RATIOS: [usize; 5] = [1, 2, 4, 8, 16];

/// Relative L2 error of the output over a whole problem.
const REL_L2: f64 = 1e-5;
/// Largest error of one output value (values are within ±2, a few within ±8).
const MAX_ABS: f64 = 5e-5;
/// Largest error of one log-sum-exp.
const LSE_ABS: f64 = 1e-4;

struct Shape<'a> {
    /// `(head_dim, head_dim_v)`.
    dims: (usize, usize),
    /// Query heads per key/value head.
    ratio: usize,
    n_ctx: usize,
    /// Per sequence.
    kv_len: &'a [u32],
    /// `(sequence, position)` of each query token.
    tokens: &'a [(u32, u32)],
}

/// Normal-ish in [-2, 2]: the sum of four uniforms on [-0.5, 0.5].
fn normalish(rng: &mut StdRng) -> f32 {
    (0..4).map(|_| rng.random_range(-0.5f32..0.5)).sum()
}

/// `n` random rows, one in 8 stretched by `stretch`. For a cache (`Some((shape, heads))`),
/// the rows at or past their sequence's `kv_len` are NaN instead.
fn rows(
    rng: &mut StdRng,
    n: usize,
    width: usize,
    stretch: f32,
    cache: Option<(&Shape, usize)>,
) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n * width).map(|_| normalish(rng)).collect();
    for (i, row) in x.chunks_mut(width).enumerate() {
        let past_end = cache.is_some_and(|(sh, heads)| {
            let (s, j) = (i / (heads * sh.n_ctx), i % sh.n_ctx);
            j >= sh.kv_len[s] as usize
        });
        if past_end {
            row.fill(f32::NAN);
        } else if rng.random_ratio(1, 8) {
            row.iter_mut().for_each(|x| *x *= stretch);
        }
    }
    x
}

/// A problem without masks (set them on the result), with scale `1/sqrt(head_dim)`.
fn build(seed: u64, sh: &Shape) -> Problem {
    let mut rng = StdRng::seed_from_u64(seed);
    let (d, dv) = sh.dims;
    let n_head_kv = if sh.ratio >= 8 { 1 } else { 2 };
    let n_head = sh.ratio * n_head_kv;
    let (n_tokens, n_seq) = (sh.tokens.len(), sh.kv_len.len());
    let n_keys = n_seq * n_head_kv * sh.n_ctx;
    Problem {
        n_tokens,
        n_head,
        n_head_kv,
        head_dim: d,
        head_dim_v: dv,
        n_seq,
        n_ctx: sh.n_ctx,
        q: rows(&mut rng, n_tokens * n_head, d, 8.0, None),
        k: rows(&mut rng, n_keys, d, 3.0, Some((sh, n_head_kv))),
        v: rows(&mut rng, n_keys, dv, 4.0, Some((sh, n_head_kv))),
        q_pos: sh.tokens.iter().map(|&(_, pos)| pos).collect(),
        q_seq: sh.tokens.iter().map(|&(s, _)| s).collect(),
        kv_len: sh.kv_len.to_vec(),
        causal: false,
        window: None,
        softcap: None,
        scale: 1.0 / (d as f32).sqrt(),
        q_seg: None,
        k_seg: None,
        tree: None,
    }
}

/// `n` tokens of sequence `seq` at positions `from..from + n`.
fn chunk(seq: u32, from: u32, n: u32) -> Vec<(u32, u32)> {
    (from..from + n).map(|pos| (seq, pos)).collect()
}

fn run(p: &Problem) -> (Vec<f32>, Vec<f32>) {
    let mut out = vec![f32::NAN; p.n_tokens * p.n_head * p.head_dim_v];
    let mut lse = vec![f32::NAN; p.n_tokens * p.n_head];
    flash::attention(p, &mut out, &mut lse).unwrap();
    (out, lse)
}

#[derive(Debug)]
struct Errors {
    rel_l2: f64,
    max_abs: f64,
    lse_abs: f64,
}

impl Errors {
    /// A NaN, or a -inf log-sum-exp on one side only, counts as an infinite error.
    fn of(got: &(Vec<f32>, Vec<f32>), want: &(Vec<f64>, Vec<f64>)) -> Errors {
        let (mut diff2, mut norm2, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
        for (&g, &w) in got.0.iter().zip(&want.0) {
            let e = (g as f64 - w).abs();
            let e = if e.is_nan() { f64::INFINITY } else { e };
            diff2 += e * e;
            norm2 += w * w;
            max_abs = max_abs.max(e);
        }
        let lse_abs = got.1.iter().zip(&want.1).fold(0.0f64, |m, (&g, &w)| {
            let e = match (g == f32::NEG_INFINITY, w == f64::NEG_INFINITY) {
                (true, true) => 0.0,
                (false, false) if !g.is_nan() => (g as f64 - w).abs(),
                _ => f64::INFINITY,
            };
            m.max(e)
        });
        let rel_l2 = if diff2 == 0.0 {
            0.0
        } else {
            (diff2 / norm2).sqrt()
        };
        Errors {
            rel_l2,
            max_abs,
            lse_abs,
        }
    }

    fn within_tolerance(&self) -> bool {
        self.rel_l2 <= REL_L2 && self.max_abs <= MAX_ABS && self.lse_abs <= LSE_ABS
    }
}

/// Compares the fast path with the reference, and checks that the rows with no visible key
/// are exact zeros with a log-sum-exp of -inf and that nothing is NaN. Returns how many rows
/// were fully masked.
fn assert_matches(what: &str, p: &Problem) -> usize {
    let want = flash::reference_f64(p);
    let got = run(p);
    let errors = Errors::of(&got, &want);
    assert!(errors.within_tolerance(), "{what}: {errors:?}");
    assert!(
        got.0.iter().all(|x| x.is_finite()),
        "{what}: non-finite output"
    );
    assert!(
        got.1
            .iter()
            .all(|&x| x.is_finite() || x == f32::NEG_INFINITY),
        "{what}: NaN or +inf log-sum-exp"
    );
    let dv = p.head_dim_v;
    let mut masked = 0;
    for (row, &w) in want.1.iter().enumerate() {
        if w == f64::NEG_INFINITY {
            masked += 1;
            assert_eq!(got.1[row], f32::NEG_INFINITY, "{what}: row {row}");
            assert!(
                got.0[row * dv..][..dv].iter().all(|&x| x == 0.0),
                "{what}: fully masked row {row} is not zero"
            );
        }
    }
    masked
}

#[test]
fn head_dims_and_gqa_ratios() {
    // 38 cached keys, then a chunk of 7 queries.
    let tokens = chunk(0, 38, 7);
    for (i, &dims) in DIMS.iter().enumerate() {
        for (r, &ratio) in RATIOS.iter().enumerate() {
            for causal in [false, true] {
                let sh = Shape {
                    dims,
                    ratio,
                    n_ctx: 48,
                    kv_len: &[45],
                    tokens: &tokens,
                };
                let mut p = build(100 + 10 * i as u64 + r as u64, &sh);
                p.causal = causal;
                assert_matches(&format!("dims {dims:?} ratio {ratio} causal {causal}"), &p);
            }
        }
    }
}

#[test]
fn odd_lengths() {
    for (i, &n) in [1u32, 7, 33, 100, 777].iter().enumerate() {
        let layouts = [
            ("prefill", chunk(0, 0, n)),
            ("decode", chunk(0, n - 1, 1)),
            ("chunk", chunk(0, n - n.min(5), n.min(5))),
        ];
        for (name, tokens) in &layouts {
            for causal in [false, true] {
                let sh = Shape {
                    dims: (64, 64),
                    ratio: 2,
                    n_ctx: n as usize + 3,
                    kv_len: &[n],
                    tokens,
                };
                let mut p = build(200 + i as u64, &sh);
                p.causal = causal;
                assert_matches(&format!("{n} keys, {name}, causal {causal}"), &p);
            }
        }
    }
}

#[test]
fn sliding_window() {
    // Queries at 60..100 over 100 keys: windows shorter and longer than a tile, and one
    // covering everything.
    let tokens = chunk(0, 60, 40);
    for (i, &w) in [1usize, 2, 7, 32, 33, 100, 1000].iter().enumerate() {
        for causal in [false, true] {
            let sh = Shape {
                dims: (128, 128),
                ratio: 4,
                n_ctx: 100,
                kv_len: &[100],
                tokens: &tokens,
            };
            let mut p = build(300 + i as u64, &sh);
            p.causal = causal;
            p.window = Some(w);
            assert_matches(&format!("window {w} causal {causal}"), &p);
        }
    }
}

#[test]
fn chunked_prefill_onto_a_cache() {
    for (i, &offset) in [0u32, 1, 31, 32, 33, 64].iter().enumerate() {
        for (c, &n) in [1u32, 5, 33].iter().enumerate() {
            let tokens = chunk(0, offset, n);
            for causal in [false, true] {
                let sh = Shape {
                    dims: (64, 64),
                    ratio: 4,
                    n_ctx: 128,
                    kv_len: &[offset + n],
                    tokens: &tokens,
                };
                let mut p = build(400 + 10 * i as u64 + c as u64, &sh);
                p.causal = causal;
                assert_matches(&format!("offset {offset} chunk {n} causal {causal}"), &p);
            }
        }
    }
}

/// Packs segments of the given lengths one after the other into each sequence's keys; every
/// key is also a query token of its own segment. Ids are negative too, as any i32 is valid.
fn packed(seed: u64, lens: &[&[u32]], causal: bool) -> Problem {
    let n_ctx = lens.iter().map(|l| l.iter().sum::<u32>()).max().unwrap() as usize + 2;
    let kv_len: Vec<u32> = lens.iter().map(|l| l.iter().sum()).collect();
    let tokens: Vec<(u32, u32)> = kv_len
        .iter()
        .enumerate()
        .flat_map(|(s, &n)| chunk(s as u32, 0, n))
        .collect();
    let sh = Shape {
        dims: (128, 128),
        ratio: 2,
        n_ctx,
        kv_len: &kv_len,
        tokens: &tokens,
    };
    let mut p = build(seed, &sh);
    let mut k_seg = vec![i32::MAX; lens.len() * n_ctx];
    for (s, l) in lens.iter().enumerate() {
        let ids = l.iter().enumerate().flat_map(|(i, &n)| {
            let id = 7 * i as i32 - 10;
            (0..n).map(move |_| id)
        });
        k_seg[s * n_ctx..]
            .iter_mut()
            .zip(ids)
            .for_each(|(k, id)| *k = id);
    }
    p.q_seg = Some(
        tokens
            .iter()
            .map(|&(s, pos)| k_seg[s as usize * n_ctx + pos as usize])
            .collect(),
    );
    p.k_seg = Some(k_seg);
    p.causal = causal;
    p
}

#[test]
fn segments() {
    let lens: [&[u32]; 2] = [&[5, 1, 30, 17, 40], &[64, 2, 9]];
    for causal in [false, true] {
        let p = packed(500, &lens, causal);
        assert_matches(&format!("packed, causal {causal}"), &p);
        // A token whose segment has no key sees nothing.
        let mut p = packed(501, &lens, causal);
        p.q_seg.as_mut().unwrap()[3] = 1000;
        let masked = assert_matches(&format!("orphan segment, causal {causal}"), &p);
        assert_eq!(masked, p.n_head);
    }
}

/// A speculative-decoding tree of `nodes` drafted tokens after `prefix` cached keys, then
/// `extra` more keys: node `i` sits at `prefix + i` and sees the prefix, itself and its
/// ancestors. One more token with every bit set shows the 64-key reach of the mask, and one
/// with its base past the cache sees all of it.
fn tree(seed: u64, prefix: u32, nodes: u32, extra: u32, causal: bool) -> Problem {
    let mut rng = StdRng::seed_from_u64(seed);
    let kv = prefix + nodes + extra;
    let mut tokens = chunk(0, prefix, nodes);
    tokens.extend([(0, kv - 1), (0, kv - 1)]);
    let sh = Shape {
        dims: (64, 64),
        ratio: 8,
        n_ctx: kv as usize,
        kv_len: &[kv],
        tokens: &tokens,
    };
    let mut p = build(seed, &sh);
    let mut mask = Vec::new();
    for i in 0..nodes as usize {
        let parent = if i == 0 {
            0
        } else {
            mask[rng.random_range(0..i)]
        };
        mask.push(parent | 1u64 << i);
    }
    mask.extend([u64::MAX, 0]);
    let mut base = vec![prefix; nodes as usize];
    base.extend([prefix, kv + 5]);
    p.tree = Some((mask, base));
    p.causal = causal;
    p
}

#[test]
fn tree_masks() {
    for (i, &prefix) in [0u32, 1, 37, 64].iter().enumerate() {
        for (n, &nodes) in [1u32, 7, 64].iter().enumerate() {
            for extra in [0, 70] {
                for causal in [false, true] {
                    let p = tree(600 + 10 * i as u64 + n as u64, prefix, nodes, extra, causal);
                    assert_matches(
                        &format!("prefix {prefix} nodes {nodes} extra {extra} causal {causal}"),
                        &p,
                    );
                }
            }
        }
    }
}

#[test]
fn softcap() {
    let tokens = chunk(0, 20, 30);
    for (i, &cap) in [1.0f32, 5.0, 30.0, 50.0].iter().enumerate() {
        for causal in [false, true] {
            let sh = Shape {
                dims: (128, 128),
                ratio: 2,
                n_ctx: 50,
                kv_len: &[50],
                tokens: &tokens,
            };
            let mut p = build(700 + i as u64, &sh);
            p.softcap = Some(cap);
            p.causal = causal;
            // Larger scores, so that the cap bends them.
            p.scale *= 4.0;
            assert_matches(&format!("softcap {cap} causal {causal}"), &p);
        }
    }
}

#[test]
fn single_token() {
    for (i, &dims) in DIMS.iter().enumerate() {
        for (r, &ratio) in [1usize, 16].iter().enumerate() {
            for &n in &[1u32, 7, 33, 100] {
                let tokens = chunk(0, n - 1, 1);
                let sh = Shape {
                    dims,
                    ratio,
                    n_ctx: n as usize,
                    kv_len: &[n],
                    tokens: &tokens,
                };
                let mut p = build(800 + 10 * i as u64 + r as u64, &sh);
                p.causal = true;
                assert_matches(&format!("dims {dims:?} ratio {ratio} {n} keys"), &p);
            }
        }
    }
}

#[test]
fn multiple_sequences() {
    // Sequences of 1, 57 and 100 keys and an empty one, their tokens interleaved: decodes,
    // a chunk of the long one, and a token of the empty one.
    let mut tokens = vec![(1, 56), (0, 0), (3, 0)];
    tokens.extend(chunk(2, 90, 10));
    tokens.push((1, 56));
    for window in [None, Some(20)] {
        for causal in [false, true] {
            let sh = Shape {
                dims: (128, 128),
                ratio: 4,
                n_ctx: 104,
                kv_len: &[1, 57, 100, 0],
                tokens: &tokens,
            };
            let mut p = build(900, &sh);
            p.causal = causal;
            p.window = window;
            let masked = assert_matches(&format!("window {window:?} causal {causal}"), &p);
            assert_eq!(
                masked, p.n_head,
                "only the empty sequence's token sees nothing"
            );
        }
    }
}

#[test]
fn fully_masked_rows() {
    // Tokens 0 and 1 see keys, each of the others is emptied by one mask.
    let tokens = [(0, 10), (0, 39), (1, 0), (0, 50), (0, 70), (0, 20), (0, 30)];
    let sh = Shape {
        dims: (64, 64),
        ratio: 4,
        n_ctx: 64,
        kv_len: &[40, 0],
        tokens: &tokens,
    };
    let mut p = build(1000, &sh);
    p.causal = true;
    // Token 3 (at 50) sees 46..=50 of keys 0..40: none. Token 4 (at 70): 66..=70, none.
    p.window = Some(5);
    let mut q_seg = vec![0; tokens.len()];
    q_seg[5] = 1;
    p.q_seg = Some(q_seg);
    p.k_seg = Some(vec![0; 2 * 64]);
    let mut mask = vec![u64::MAX; tokens.len()];
    mask[6] = 0;
    p.tree = Some((mask, vec![0; tokens.len()]));
    let masked = assert_matches("one mask per row", &p);
    assert_eq!(masked, 5 * p.n_head);
    // Every row masked: the reference output is all zeros.
    p.kv_len = vec![0, 0];
    let masked = assert_matches("all rows", &p);
    assert_eq!(masked, tokens.len() * p.n_head);
}

#[test]
fn sweep_of_combined_masks() {
    // Every value of every axis, in varying company.
    let kv_lens: [&[u32]; 3] = [&[100], &[33, 7], &[1, 64, 95]];
    let windows = [None, Some(1), Some(16), Some(40)];
    for i in 0..40usize {
        let kv_len = kv_lens[i % kv_lens.len()];
        let mut rng = StdRng::seed_from_u64(1100 + i as u64);
        let tokens: Vec<(u32, u32)> = (0..1 + i % 9)
            .map(|_| {
                let s = rng.random_range(0..kv_len.len());
                (s as u32, rng.random_range(0..kv_len[s] + 3))
            })
            .collect();
        let sh = Shape {
            dims: DIMS[i % DIMS.len()],
            ratio: RATIOS[i % RATIOS.len()],
            n_ctx: 100,
            kv_len,
            tokens: &tokens,
        };
        let mut p = build(1200 + i as u64, &sh);
        p.causal = i % 2 == 0;
        p.window = windows[i % windows.len()];
        p.softcap = [None, Some(30.0)][i / 2 % 2];
        if i % 3 == 0 {
            p.q_seg = Some((0..tokens.len()).map(|_| rng.random_range(0..3)).collect());
            p.k_seg = Some(
                (0..kv_len.len() * 100)
                    .map(|_| rng.random_range(0..3))
                    .collect(),
            );
        }
        if i % 5 < 2 {
            let mask = (0..tokens.len()).map(|_| rng.random()).collect();
            let base = tokens
                .iter()
                .map(|&(_, pos)| pos.saturating_sub(rng.random_range(0..70)))
                .collect();
            p.tree = Some((mask, base));
        }
        assert_matches(
            &format!("case {i}: {:?}", (p.causal, p.window, p.softcap)),
            &p,
        );
    }
}

#[test]
fn rows_do_not_depend_on_the_batch() {
    // A token's outputs are the same bits alone as among others, however rows are spread
    // over threads.
    let tokens = [(0, 99), (1, 20), (0, 50), (1, 63), (0, 3)];
    let sh = Shape {
        dims: (128, 128),
        ratio: 4,
        n_ctx: 100,
        kv_len: &[100, 64],
        tokens: &tokens,
    };
    let mut p = build(1800, &sh);
    p.causal = true;
    p.window = Some(40);
    p.softcap = Some(30.0);
    let (out, lse) = run(&p);
    let (d, dv, nh) = (p.head_dim, p.head_dim_v, p.n_head);
    for t in 0..p.n_tokens {
        let mut one = p.clone();
        one.n_tokens = 1;
        one.q = p.q[t * nh * d..][..nh * d].to_vec();
        one.q_pos = vec![p.q_pos[t]];
        one.q_seq = vec![p.q_seq[t]];
        let (o, l) = run(&one);
        assert_eq!(o, out[t * nh * dv..][..nh * dv], "token {t}");
        assert_eq!(l, lse[t * nh..][..nh], "token {t}");
    }
}

/// One token over six keys with a zero query: every score is 0, so the log-sum-exp is
/// `ln(visible keys)` and the output their values' mean.
#[test]
fn reference_counts_visible_keys() {
    let tokens = [(0, 3)];
    let sh = Shape {
        dims: (64, 64),
        ratio: 1,
        n_ctx: 8,
        kv_len: &[6],
        tokens: &tokens,
    };
    let base = {
        let mut p = build(1300, &sh);
        p.q.fill(0.0);
        p
    };
    type Edit = fn(&mut Problem);
    let cases: [(&str, Edit, &[usize]); 8] = [
        ("no mask", |_| {}, &[0, 1, 2, 3, 4, 5]),
        ("causal", |p| p.causal = true, &[0, 1, 2, 3]),
        ("window 2", |p| p.window = Some(2), &[2, 3, 4, 5]),
        (
            "causal window 2",
            |p| {
                p.causal = true;
                p.window = Some(2);
            },
            &[2, 3],
        ),
        (
            "segments",
            |p| {
                p.q_seg = Some(vec![1]);
                p.k_seg = Some(vec![1, 0, 1, 1, 0, 1, 1, 1]);
            },
            &[0, 2, 3, 5],
        ),
        (
            "tree",
            |p| p.tree = Some((vec![0b1001], vec![1])),
            &[0, 1, 4],
        ),
        (
            "tree past the cache",
            |p| p.tree = Some((vec![0], vec![9])),
            &[0, 1, 2, 3, 4, 5],
        ),
        ("kv_len 2", |p| p.kv_len = vec![2], &[0, 1]),
    ];
    let dv = base.head_dim_v;
    for (name, edit, keys) in cases {
        let mut p = base.clone();
        edit(&mut p);
        let (out, lse) = flash::reference_f64(&p);
        assert!(
            (lse[0] - (keys.len() as f64).ln()).abs() < 1e-12,
            "{name}: lse {}",
            lse[0]
        );
        // One query head per key/value head: head `h` reads key/value head `h`.
        for (h, out) in out.chunks(dv).enumerate() {
            let v = &p.v[h * p.n_ctx * dv..];
            for (c, &o) in out.iter().enumerate() {
                let sum: f64 = keys.iter().map(|&j| v[j * dv + c] as f64).sum();
                let mean = sum / keys.len() as f64;
                assert!(
                    (o - mean).abs() < 1e-12,
                    "{name}: head {h} dim {c}: {o} vs {mean}"
                );
            }
        }
        assert_matches(name, &p);
    }
}

#[test]
fn reference_on_one_key() {
    // A softmax over one score is 1: the output is the value, the log-sum-exp the score.
    let tokens = [(0, 0)];
    let sh = Shape {
        dims: (128, 64),
        ratio: 1,
        n_ctx: 1,
        kv_len: &[1],
        tokens: &tokens,
    };
    for softcap in [None, Some(2.0f32)] {
        let mut p = build(1400, &sh);
        p.softcap = softcap;
        // With one key per head and one query head per key head, the outputs are laid out as
        // the values.
        let (want_out, want_lse) = flash::reference_f64(&p);
        let (out, lse) = run(&p);
        assert!(want_out.iter().zip(&p.v).all(|(&o, &v)| o == v as f64));
        assert_eq!(out, p.v);
        let d = p.head_dim;
        for h in 0..p.n_head {
            let (q, k) = (&p.q[h * d..][..d], &p.k[h * d..][..d]);
            let x = q
                .iter()
                .zip(k)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>();
            let x = x * p.scale as f64;
            let x = softcap.map_or(x, |c| c as f64 * (x / c as f64).tanh());
            assert!(
                (want_lse[h] - x).abs() < 1e-12,
                "{softcap:?}: {} vs {x}",
                want_lse[h]
            );
            assert!(
                (lse[h] as f64 - x).abs() < 1e-5,
                "{softcap:?}: {} vs {x}",
                lse[h]
            );
        }
    }
}

#[test]
fn intermediates_agree_with_reference() {
    // The window, causality and the tree leave fully masked tiles before, between and after
    // the visible keys.
    let tokens = [(0, 90), (0, 40), (1, 5), (0, 99), (0, 0)];
    let sh = Shape {
        dims: (128, 64),
        ratio: 4,
        n_ctx: 100,
        kv_len: &[100, 0],
        tokens: &tokens,
    };
    let mut p = build(1500, &sh);
    p.causal = true;
    p.window = Some(50);
    p.softcap = Some(20.0);
    p.tree = Some((
        vec![u64::MAX, 0b1010_0000_0000_0001, u64::MAX, 0, 1],
        vec![80, 4, 0, 60, 0],
    ));
    let want = flash::reference_f64(&p);
    let fast = run(&p);
    let (d, dv) = (p.head_dim, p.head_dim_v);
    for t in 0..p.n_tokens {
        let kv_len = p.kv_len[p.q_seq[t] as usize] as usize;
        for h in 0..p.n_head {
            let row = t * p.n_head + h;
            let kv = (p.q_seq[t] as usize * p.n_head_kv + h / 4) * p.n_ctx;
            for tile in [1usize, 7, 32, 100] {
                let what = format!("token {t} head {h} tile {tile}");
                let states = flash::intermediates(&p, t, h, tile);
                assert_eq!(states.len(), kv_len.div_ceil(tile), "{what}");
                let mut prev_max = f32::NEG_INFINITY;
                for (i, st) in states.iter().enumerate() {
                    let keys = i * tile..((i + 1) * tile).min(kv_len);
                    assert_eq!(st.scores.len(), keys.len(), "{what}");
                    assert_eq!(st.probs.len(), keys.len(), "{what}");
                    assert_eq!(st.out.len(), dv, "{what}");
                    assert!(st.row_max >= prev_max, "{what}: max went down");
                    prev_max = st.row_max;
                    if st.row_max == f32::NEG_INFINITY {
                        assert_eq!(st.row_sum, 0.0, "{what}");
                        assert!(st.out.iter().all(|&x| x == 0.0), "{what}");
                    }
                    for (j, (&s, &pr)) in keys.zip(st.scores.iter().zip(&st.probs)) {
                        if s == f32::NEG_INFINITY {
                            assert_eq!(pr, 0.0, "{what}: key {j}");
                            continue;
                        }
                        let q = &p.q[row * d..][..d];
                        let k = &p.k[(kv + j) * d..][..d];
                        let x: f64 = q
                            .iter()
                            .zip(k)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * p.scale as f64;
                        let x = 20.0 * (x / 20.0).tanh();
                        assert!((s as f64 - x).abs() < 1e-5, "{what}: score {j}: {s} vs {x}");
                        let e = (s as f64 - st.row_max as f64).exp();
                        assert!(
                            (pr as f64 - e).abs() <= 1e-6 * e.max(1e-30),
                            "{what}: prob {j}: {pr} vs {e}"
                        );
                    }
                }
                let lse = want.1[row];
                let Some(last) = states.last() else {
                    assert_eq!(lse, f64::NEG_INFINITY, "{what}");
                    continue;
                };
                if lse == f64::NEG_INFINITY {
                    assert_eq!(
                        (last.row_max, last.row_sum),
                        (f32::NEG_INFINITY, 0.0),
                        "{what}"
                    );
                    continue;
                }
                let got_lse = last.row_max as f64 + (last.row_sum as f64).ln();
                assert!(
                    (got_lse - lse).abs() < LSE_ABS,
                    "{what}: lse {got_lse} vs {lse}"
                );
                let out = &want.0[row * dv..][..dv];
                let fast = &fast.0[row * dv..][..dv];
                for (c, &o) in last.out.iter().enumerate() {
                    let o = o / last.row_sum;
                    assert!(
                        (o as f64 - out[c]).abs() < MAX_ABS,
                        "{what}: dim {c}: {o} vs {}",
                        out[c]
                    );
                    assert!(
                        (o - fast[c]).abs() <= 1e-6 * (1.0 + fast[c].abs()),
                        "{what}: dim {c}: {o} vs fast {}",
                        fast[c]
                    );
                }
            }
        }
    }
}

#[test]
fn check_rejects_bad_problems() {
    let tokens = chunk(0, 3, 4);
    let sh = Shape {
        dims: (64, 32),
        ratio: 2,
        n_ctx: 8,
        kv_len: &[7],
        tokens: &tokens,
    };
    let good = build(1600, &sh);
    good.check().unwrap();
    type Edit = fn(&mut Problem);
    let bad: [(&str, Edit); 24] = [
        ("q length", |p| {
            p.q.pop();
        }),
        ("k length", |p| p.k.push(1.0)),
        ("v length", |p| p.head_dim_v = 64),
        ("q_pos length", |p| {
            p.q_pos.pop();
        }),
        ("q_seq length", |p| p.q_seq.push(0)),
        ("kv_len length", |p| p.kv_len.push(0)),
        ("q_seq out of range", |p| p.q_seq[2] = 1),
        ("kv_len over n_ctx", |p| p.kv_len[0] = 9),
        ("n_head not a multiple", |p| p.n_head_kv = 3),
        ("n_head_kv zero", |p| p.n_head_kv = 0),
        ("n_head zero", |p| p.n_head = 0),
        ("head_dim zero", |p| p.head_dim = 0),
        ("window zero", |p| p.window = Some(0)),
        ("softcap zero", |p| p.softcap = Some(0.0)),
        ("softcap NaN", |p| p.softcap = Some(f32::NAN)),
        ("scale infinite", |p| p.scale = f32::INFINITY),
        ("q_seg alone", |p| p.q_seg = Some(vec![0; 4])),
        ("k_seg alone", |p| p.k_seg = Some(vec![0; 8])),
        ("q_seg length", |p| {
            p.q_seg = Some(vec![0; 3]);
            p.k_seg = Some(vec![0; 8]);
        }),
        ("k_seg length", |p| {
            p.q_seg = Some(vec![0; 4]);
            p.k_seg = Some(vec![0; 7]);
        }),
        ("tree mask length", |p| {
            p.tree = Some((vec![0; 5], vec![0; 4]))
        }),
        ("tree base length", |p| {
            p.tree = Some((vec![0; 4], vec![0; 3]))
        }),
        ("n_seq zero", |p| p.n_seq = 0),
        ("size overflow", |p| p.n_ctx = usize::MAX / 2),
    ];
    for (name, edit) in bad {
        let mut p = good.clone();
        edit(&mut p);
        let err = p.check().expect_err(name);
        assert!(!err.is_empty(), "{name}");
        let mut out = vec![0.0; 4096];
        let mut lse = vec![0.0; 64];
        assert!(flash::attention(&p, &mut out, &mut lse).is_err(), "{name}");
    }
    let (mut out, mut lse) = run(&good);
    out.push(0.0);
    assert!(
        flash::attention(&good, &mut out, &mut lse).is_err(),
        "out length"
    );
    out.pop();
    lse.pop();
    assert!(
        flash::attention(&good, &mut out, &mut lse).is_err(),
        "lse length"
    );
}

/// The comparison has teeth: a reference computed with one thing changed is far from the fast
/// path on the original problem.
#[test]
fn wrong_answers_are_caught() {
    let mut p = packed(1700, &[&[20, 41, 30]], true);
    p.window = Some(24);
    p.softcap = Some(10.0);
    // Each token sees the keys before `base = pos - 16`, the one at `base`, itself and the
    // keys after it: only causality hides those.
    let n = p.n_tokens;
    p.tree = Some((
        vec![!0xfffe; n],
        p.q_pos.iter().map(|&pos| pos.saturating_sub(16)).collect(),
    ));
    for (t, &pos) in p.q_pos.iter().enumerate() {
        let (mask, base) = p.tree.as_mut().unwrap();
        mask[t] |= 1 << (pos - base[t]);
    }
    let got = run(&p);
    assert!(Errors::of(&got, &flash::reference_f64(&p)).within_tolerance());
    type Edit = fn(&mut Problem);
    let edits: [(&str, Edit); 9] = [
        ("not causal", |p| p.causal = false),
        ("window one shorter", |p| p.window = Some(23)),
        ("no window", |p| p.window = None),
        ("one key in another segment", |p| {
            p.k_seg.as_mut().unwrap()[30] += 1
        }),
        ("one tree bit", |p| p.tree.as_mut().unwrap().0[50] ^= 2),
        ("no softcap", |p| p.softcap = None),
        ("scale 1% off", |p| p.scale *= 1.01),
        ("kv heads swapped", |p| {
            let half = p.k.len() / 2;
            let (a, b) = p.k.split_at_mut(half);
            a.swap_with_slice(b);
        }),
        ("shorter cache", |p| p.kv_len[0] -= 1),
    ];
    for (name, edit) in edits {
        let mut wrong = p.clone();
        edit(&mut wrong);
        let errors = Errors::of(&got, &flash::reference_f64(&wrong));
        assert!(!errors.within_tolerance(), "{name}: {errors:?}");
    }
}
