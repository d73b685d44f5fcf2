//! The device's argmax and sampler against the CPU: argmax and greedy sampling must pick the
//! CPU's token exactly; penalties must change the logits to the bit as the CPU's do; a sampled
//! token must always be one the CPU's filter chain keeps, and many draws must follow the
//! probabilities that chain gives (chi-square), whichever path serves the settings: the
//! per-block top-k lists, the exact path's histogram launches, or the exact path in one block
//! (when those launches are left out, or too many equal logits crowd the cut).

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use akunu_core::sampling::{Sampler, SamplerParams};
use akunu_cuda::sample::{Chain, SampleKernels, SamplerState, FAST_TOP_K};
use akunu_cuda::{DeviceBuffer, Gpu};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const NO_TOKEN: u32 = u32::MAX;

#[test]
fn sample_modules_compile() {
    if !akunu_cuda::compile::nvrtc_present() {
        eprintln!("skipped: no NVRTC");
        return;
    }
    for (file, defines) in akunu_cuda::sample::modules() {
        let key = akunu_cuda::compile::ModuleKey::new(file, "sm_90a", &defines);
        if let Err(e) = akunu_cuda::compile::compile(&key) {
            panic!("{e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64) -> SamplerParams {
    SamplerParams {
        temperature,
        top_k,
        top_p,
        min_p,
        repeat_penalty: 1.0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        penalty_last_n: 0,
        seed,
    }
}

fn penalised(mut p: SamplerParams, last_n: usize) -> SamplerParams {
    p.repeat_penalty = 1.3;
    p.frequency_penalty = 0.25;
    p.presence_penalty = 0.4;
    p.penalty_last_n = last_n;
    p
}

/// `m` rows of `n` logits uploaded into a buffer, starting `offset` floats in (an offset of 1
/// makes every row misaligned for 16-byte loads).
fn upload_rows(gpu: &Gpu, rows: &[f32], offset: usize) -> DeviceBuffer {
    let mut padded = vec![0.0f32; offset];
    padded.extend_from_slice(rows);
    gpu.upload(&padded).unwrap()
}

fn poisoned_tokens(gpu: &Gpu, m: usize) -> DeviceBuffer {
    gpu.upload(&vec![NO_TOKEN; m]).unwrap()
}

fn read_tokens(gpu: &Gpu, buf: &DeviceBuffer, m: usize) -> Vec<u32> {
    let mut out = vec![0u32; m];
    gpu.read(buf, 0, &mut out).unwrap();
    out
}

/// The CPU's greedy choice for one row.
fn cpu_greedy(row: &[f32]) -> u32 {
    let mut s = Sampler::new(SamplerParams::greedy(), row.len()).unwrap();
    s.sample(&mut row.to_vec())
}

/// `akunu_core::sampling::exp_nonpositive`, the weight of the top-p cut.
fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0;
    let underflows = x < -87.3;
    let x = if underflows { -87.3 } else { x };
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let poly = ((((1.987_569_1e-4_f32 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
        * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let er = (poly * r * r) + r + 1.0;
    let scaled = er * f32::from_bits(((n as i32 + 127) as u32) << 23);
    if underflows {
        0.0
    } else {
        scaled
    }
}

/// The CPU chain written out plainly (sort everything, cut, normalise in f64): the tokens it
/// keeps for `logits` (already penalised) and their probabilities.
fn reference(logits: &[f32], p: &SamplerParams) -> Vec<(u32, f64)> {
    let n = logits.len();
    let raw_max = logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if p.temperature <= 0.0 || raw_max == f32::NEG_INFINITY {
        let i = logits.iter().position(|&l| l == raw_max).unwrap_or(0);
        return vec![(i as u32, 1.0)];
    }
    let max = raw_max.min(f32::MAX);
    let top_k = if p.top_k > 0 && p.top_k < n {
        p.top_k
    } else {
        0
    };
    let top_p = (p.top_p < 1.0).then_some(p.top_p);
    let bar = if p.min_p > 0.0 {
        max + p.min_p.ln()
    } else {
        f32::NEG_INFINITY
    };
    let tail = ((n as f32).ln() + 17.0) * p.temperature.max(1.0);
    let mut floor = max - tail;
    if top_p.is_none() {
        floor = floor.max(bar);
    }
    let floor = floor.max(f32::MIN);
    let mut c: Vec<(f32, u32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (l.min(f32::MAX), i as u32))
        .filter(|&(l, _)| l >= floor)
        .collect();
    c.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
    if top_k > 0 {
        c.truncate(top_k);
    }
    if let Some(tp) = top_p {
        let w: Vec<f64> = c
            .iter()
            .map(|&(l, _)| f64::from(exp_nonpositive(l - max)))
            .collect();
        let target = f64::from(tp) * w.iter().sum::<f64>();
        let mut cum = 0.0;
        let mut kept = c.len();
        for (i, wi) in w.iter().enumerate() {
            cum += wi;
            if cum >= target {
                kept = i + 1;
                break;
            }
        }
        c.truncate(kept);
    }
    let keep = 1 + c[1..].iter().take_while(|(l, _)| *l >= bar).count();
    c.truncate(keep);
    let w: Vec<f64> = c
        .iter()
        .map(|&(l, _)| f64::from(exp_nonpositive((l - max) / p.temperature)))
        .collect();
    let total: f64 = w.iter().sum();
    c.iter()
        .zip(&w)
        .filter(|(_, &w)| w > 0.0)
        .map(|(&(_, id), &w)| (id, w / total))
        .collect()
}

/// Chi-square of `draws` against `probs`, bins pooled to an expectation of at least 5; returns
/// (statistic, critical value at p ≈ 1e-6). Draws outside `probs` fail the caller's check
/// before this is asked.
fn chi_square(draws: &[u32], probs: &[(u32, f64)]) -> (f64, f64) {
    let mut counts: HashMap<u32, usize> = HashMap::new();
    for &t in draws {
        *counts.entry(t).or_default() += 1;
    }
    let total = draws.len() as f64;
    let mut sorted = probs.to_vec();
    sorted.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
    let mut bins: Vec<(f64, f64)> = Vec::new();
    let (mut exp, mut obs) = (0.0, 0.0);
    for &(id, pr) in &sorted {
        exp += pr * total;
        obs += *counts.get(&id).unwrap_or(&0) as f64;
        if exp >= 5.0 {
            bins.push((exp, obs));
            exp = 0.0;
            obs = 0.0;
        }
    }
    if exp > 0.0 {
        match bins.last_mut() {
            Some(last) => {
                last.0 += exp;
                last.1 += obs;
            }
            None => bins.push((exp, obs)),
        }
    }
    let stat: f64 = bins.iter().map(|&(e, o)| (o - e) * (o - e) / e).sum();
    let df = (bins.len().max(2) - 1) as f64;
    // Wilson–Hilferty: the chi-square quantile from the normal one (z = 4.75, p ≈ 1e-6).
    let z = 4.75;
    let a = 2.0 / (9.0 * df);
    let crit = df * (1.0 - a + z * a.sqrt()).powi(3);
    (stat, crit)
}

/// Asserts every draw is a token the reference keeps and the draws follow its probabilities.
fn check_draws(what: &str, draws: &[u32], probs: &[(u32, f64)]) {
    let kept: HashMap<u32, f64> = probs.iter().copied().collect();
    for &t in draws {
        assert!(
            kept.contains_key(&t),
            "{what}: drew token {t}, which the CPU chain removes ({} kept)",
            probs.len()
        );
    }
    if probs.len() > 1 {
        let (stat, crit) = chi_square(draws, probs);
        assert!(
            stat < crit,
            "{what}: chi-square {stat:.1} over {crit:.1} ({} tokens kept, {} draws)",
            probs.len(),
            draws.len()
        );
    }
}

/// Random logits in [-scale, scale) with a few raised spikes, so the top of the distribution
/// has structure.
fn logits_with_spikes(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut l = common::random(n, scale, seed);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5151);
    for _ in 0..(n / 200).clamp(1, 8) {
        let i = rng.random_range(0..n);
        l[i] += scale * 0.8;
    }
    l
}

fn history(len: usize, n: usize, seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    // Repeats: most tokens come from a small set, so counts above 1 occur.
    (0..len)
        .map(|_| {
            if rng.random_bool(0.7) {
                rng.random_range(0..n.min(24)) as u32
            } else {
                rng.random_range(0..n) as u32
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// argmax

#[test]
fn argmax_matches_cpu_greedy() {
    let Some(gpu) = common::gpu() else { return };
    let k = SampleKernels::new(&gpu).unwrap();
    // (n, m, offset): 70 rows take the one-block-per-row path; offset 1 misaligns every row.
    let cases = [
        (1, 1, 0),
        (1, 3, 0),
        (31, 1, 0),
        (31, 5, 0),
        (1000, 1, 0),
        (1000, 3, 1),
        (1000, 70, 0),
        (4099, 2, 0),
        (262_144, 1, 0),
        (262_144, 2, 1),
    ];
    for (case, &(n, m, offset)) in cases.iter().enumerate() {
        let mut rows = common::random(n * m, 4.0, 100 + case as u64);
        let mut rng = StdRng::seed_from_u64(case as u64);
        for r in 0..m {
            let row = &mut rows[r * n..(r + 1) * n];
            match r % 3 {
                // Ties for the maximum: the lowest index must win.
                0 if n > 2 => {
                    let a = rng.random_range(0..n - 1);
                    let b = rng.random_range(a + 1..n);
                    row[a] = 9.0;
                    row[b] = 9.0;
                }
                // Every logit equal: index 0.
                1 => row.iter_mut().for_each(|l| *l = -1.5),
                _ => {}
            }
        }
        let buf = upload_rows(&gpu, &rows, offset);
        let out = poisoned_tokens(&gpu, m);
        k.argmax(&gpu, buf.at(offset * 4), m, n, out.ptr(), None)
            .unwrap();
        let got = read_tokens(&gpu, &out, m);
        for r in 0..m {
            let want = cpu_greedy(&rows[r * n..(r + 1) * n]);
            assert_eq!(got[r], want, "n {n}, m {m}, offset {offset}, row {r}");
        }
        // A second launch reuses the tickets the first one reset.
        let out2 = poisoned_tokens(&gpu, m);
        k.argmax(&gpu, buf.at(offset * 4), m, n, out2.ptr(), None)
            .unwrap();
        assert_eq!(
            read_tokens(&gpu, &out2, m),
            got,
            "n {n}, m {m}: second launch"
        );
    }
}

/// A decode chain's device state for the tests: position 41 (a second position 7 beside it,
/// which must not move), 3 tokens already chosen, room for 8.
struct TestChain {
    positions: DeviceBuffer,
    out: DeviceBuffer,
    count: DeviceBuffer,
}

impl TestChain {
    fn new(gpu: &Gpu) -> TestChain {
        TestChain {
            positions: gpu.upload(&[41u32, 7]).unwrap(),
            out: gpu.upload(&[u32::MAX; 8]).unwrap(),
            count: gpu.upload(&[3u32]).unwrap(),
        }
    }

    fn chain(&self) -> Chain {
        Chain {
            positions: self.positions.ptr(),
            out: self.out.ptr(),
            count: self.count.ptr(),
        }
    }

    /// Asserts the chain holds `want` after its first 3 tokens, and moved on by as many.
    fn check(&self, gpu: &Gpu, want: &[u32], what: &str) {
        let mut got = [0u32; 8];
        gpu.read(&self.out, 0, &mut got).unwrap();
        let end = 3 + want.len();
        assert_eq!(got[3..end], want[..], "{what}: the chain's tokens");
        assert!(
            got[..3].iter().chain(&got[end..]).all(|&t| t == u32::MAX),
            "{what}: tokens outside the chain's"
        );
        let mut c = [0u32];
        gpu.read(&self.count, 0, &mut c).unwrap();
        assert_eq!(c, [end as u32], "{what}: the chain's count");
        let mut p = [0u32; 2];
        gpu.read(&self.positions, 0, &mut p).unwrap();
        assert_eq!(p, [41 + want.len() as u32, 7], "{what}: the position");
    }
}

#[test]
fn argmax_advances_a_chain() {
    let Some(gpu) = common::gpu() else { return };
    let k = SampleKernels::new(&gpu).unwrap();
    // One block a row, and 128 blocks merged by the last.
    for n in [1000, 262_144] {
        let tc = TestChain::new(&gpu);
        let chain = tc.chain();
        let mut want = Vec::new();
        for step in 0..2u64 {
            let row = common::random(n, 4.0, 500 + step + n as u64);
            want.push(cpu_greedy(&row));
            let buf = upload_rows(&gpu, &row, 0);
            let out = poisoned_tokens(&gpu, 1);
            k.argmax(&gpu, buf.ptr(), 1, n, out.ptr(), Some(&chain))
                .unwrap();
            assert_eq!(read_tokens(&gpu, &out, 1), [want[step as usize]], "n {n}");
        }
        tc.check(&gpu, &want, &format!("n {n}"));
    }
    // A chain has one row.
    let buf = gpu.alloc(64).unwrap();
    let chain = Chain {
        positions: buf.ptr(),
        out: buf.ptr(),
        count: buf.ptr(),
    };
    assert!(k
        .argmax(&gpu, buf.ptr(), 2, 4, buf.ptr(), Some(&chain))
        .is_err());
}

/// The sampler in a chain (fast path, exact path with and without its launches, penalties):
/// each step's token is the one an unchained launch draws at the same step, and it also lands
/// in the chain, whose count and position move on.
#[test]
fn sample_advances_a_chain() {
    let Some(gpu) = common::gpu() else { return };
    let k = SampleKernels::new(&gpu).unwrap();
    let n = 50_000;
    let settings = [
        (params(0.8, 40, 0.95, 0.05, 11), Some(false)),
        (params(1.0, 0, 0.9, 0.0, 12), Some(true)),
        (params(1.0, 0, 0.9, 0.0, 13), Some(false)),
        (penalised(params(0.7, 20, 1.0, 0.0, 14), 16), None),
    ];
    for (case, (p, launches)) in settings.into_iter().enumerate() {
        let hist = history(40, n, case as u64);
        let mut chained = SamplerState::new(&gpu, 1, 64).unwrap();
        let mut single = SamplerState::new(&gpu, 1, 64).unwrap();
        for st in [&mut chained, &mut single] {
            st.set_params_at(0, &p, &hist, 1000 + case as u64).unwrap();
        }
        let exact = launches.unwrap_or_else(|| chained.needs_exact_launches(1, n));
        let tc = TestChain::new(&gpu);
        let chain = tc.chain();
        let mut want = Vec::new();
        for step in 0..3u64 {
            let row = logits_with_spikes(n, 3.0, 900 + step + 10 * case as u64);
            let (a, b) = (upload_rows(&gpu, &row, 0), upload_rows(&gpu, &row, 0));
            let (out_a, out_b) = (poisoned_tokens(&gpu, 1), poisoned_tokens(&gpu, 1));
            k.sample_with(&gpu, a.ptr(), 1, n, &single, out_a.ptr(), exact)
                .unwrap();
            k.sample_chain(&gpu, b.ptr(), n, &chained, out_b.ptr(), exact, &chain)
                .unwrap();
            let t = read_tokens(&gpu, &out_a, 1)[0];
            assert!((t as usize) < n, "case {case} step {step}");
            assert_eq!(read_tokens(&gpu, &out_b, 1), [t], "case {case} step {step}");
            want.push(t);
        }
        tc.check(&gpu, &want, &format!("case {case}"));
    }
    // A chain has one row, so a chained sample cannot name more; and no null pointers.
    let st = SamplerState::new(&gpu, 1, 0).unwrap();
    let buf = gpu.alloc(64).unwrap();
    let null = Chain {
        positions: 0,
        out: buf.ptr(),
        count: buf.ptr(),
    };
    assert!(k
        .sample_chain(&gpu, buf.ptr(), 4, &st, buf.ptr(), false, &null)
        .is_err());
}

#[test]
fn argmax_and_sample_reject_bad_shapes() {
    let Some(gpu) = common::gpu() else { return };
    let k = SampleKernels::new(&gpu).unwrap();
    let buf = gpu.alloc(64).unwrap();
    assert!(k.argmax(&gpu, buf.ptr(), 1, 0, buf.ptr(), None).is_err());
    let mut st = SamplerState::new(&gpu, 2, 16).unwrap();
    assert!(k.sample(&gpu, buf.ptr(), 3, 4, &st, buf.ptr()).is_err());
    assert!(k.sample(&gpu, buf.ptr(), 1, 0, &st, buf.ptr()).is_err());
    assert!(st.set_params(2, &SamplerParams::greedy(), &[]).is_err());
    assert!(st
        .set_params(0, &penalised(params(1.0, 0, 1.0, 0.0, 1), 17), &[])
        .is_err());
    assert!(st.set_params(0, &params(1.0, 0, 1.5, 0.0, 1), &[]).is_err());
    assert!(SamplerState::new(&gpu, 1, akunu_cuda::sample::MAX_WINDOW + 1).is_err());
    assert!(SamplerState::new(&gpu, 0, 16).is_err());
}

// ---------------------------------------------------------------------------------------------
// Sampler: exact choices

/// Temperature 0 and top-k 1 both pick the CPU's argmax, on every row, for every vocabulary
/// size; rows 0.. m take different settings in one launch.
#[test]
fn greedy_and_top1_pick_the_argmax() {
    let Some(gpu) = common::gpu() else { return };
    let k = SampleKernels::new(&gpu).unwrap();
    for (case, &n) in [1usize, 31, 1000, 4097, 262_144].iter().enumerate() {
        let m = 4;
        let mut rows = common::random(n * m, 3.0, 7 + case as u64);
        if n > 2 {
            // A tie for the maximum in row 1.
            rows[n + n / 3] = 5.0;
            rows[n + n / 2] = 5.0;
        }
        let buf = upload_rows(&gpu, &rows, 0);
        let mut st = SamplerState::new(&gpu, m, 0).unwrap();
        st.set_params(0, &params(0.0, 40, 0.95, 0.05, 1), &[])
            .unwrap();
        st.set_params(1, &params(-1.0, 0, 1.0, 0.0, 2), &[])
            .unwrap();
        st.set_params(2, &params(0.8, 1, 0.95, 0.05, 3), &[])
            .unwrap();
        st.set_params(3, &params(1.7, 1, 1.0, 0.0, 4), &[]).unwrap();
        for step in 0..3 {
            let out = poisoned_tokens(&gpu, m);
            k.sample(&gpu, buf.ptr(), m, n, &st, out.ptr()).unwrap();
            let got = read_tokens(&gpu, &out, m);
            for r in 0..m {
                let want = cpu_greedy(&rows[r * n..(r + 1) * n]);
                assert_eq!(got[r], want, "n {n}, row {r}, step {step}");
            }
        }
    }
}

/// Penalties change the logits to the bit as the CPU's do, and a greedy chain of tokens (the
/// same logits each step, the window filled by the sampler itself and wrapping around) is the
/// CPU's chain.
#[test]
fn penalties_match_the_cpu() {
    let Some(gpu) = common::gpu() else { return };
    let k = SampleKernels::new(&gpu).unwrap();
    for &(n, last_n, offset) in &[
        (1000usize, 64usize, 0usize),
        (3001, 8, 1),
        (262_144, 200, 0),
    ] {
        let base = logits_with_spikes(n, 4.0, n as u64);
        let hist = history(150, n, 11 + n as u64);
        let p = penalised(params(0.0, 40, 0.95, 0.05, 9), last_n);
        let mut cpu = Sampler::new(p.clone(), n).unwrap();
        for &t in &hist {
            cpu.accept(t);
        }
        let mut st = SamplerState::new(&gpu, 1, 256).unwrap();
        st.set_params(0, &p, &hist).unwrap();

        // One step: the penalised logits, bit for bit, and the token.
        let buf = upload_rows(&gpu, &base, offset);
        let out = poisoned_tokens(&gpu, 1);
        k.sample(&gpu, buf.at(offset * 4), 1, n, &st, out.ptr())
            .unwrap();
        let mut gpu_logits = vec![0.0f32; n];
        gpu.read(&buf, offset * 4, &mut gpu_logits).unwrap();
        let mut cpu_logits = base.clone();
        cpu.apply_penalties(&mut cpu_logits);
        let changed = (0..n).filter(|&i| base[i] != cpu_logits[i]).count();
        assert!(changed >= 3, "the history must touch several tokens");
        for i in 0..n {
            assert_eq!(
                gpu_logits[i].to_bits(),
                cpu_logits[i].to_bits(),
                "n {n}: logit {i} penalised to {} on the GPU, {} on the CPU",
                gpu_logits[i],
                cpu_logits[i]
            );
        }
        let mut first = base.clone();
        let want = cpu.sample(&mut first);
        cpu.accept(want);
        assert_eq!(read_tokens(&gpu, &out, 1)[0], want, "n {n}: first token");

        // The chain.
        let mut chain_gpu = vec![want];
        let mut chain_cpu = vec![want];
        for _ in 0..40 {
            gpu.write(&buf, offset * 4, &base).unwrap();
            k.sample(&gpu, buf.at(offset * 4), 1, n, &st, out.ptr())
                .unwrap();
            chain_gpu.push(read_tokens(&gpu, &out, 1)[0]);
            let mut l = base.clone();
            let t = cpu.sample(&mut l);
            cpu.accept(t);
            chain_cpu.push(t);
        }
        assert_eq!(chain_gpu, chain_cpu, "n {n}, window {last_n}");
        let distinct: std::collections::HashSet<_> = chain_cpu.iter().collect();
        assert!(
            distinct.len() > 3,
            "penalties should move the argmax around"
        );
    }
}

/// Same seed, same tokens; another seed, other tokens.
#[test]
fn same_seed_same_tokens() {
    let Some(gpu) = common::gpu() else { return };
    let k = SampleKernels::new(&gpu).unwrap();
    let n = 1000;
    let m = 3;
    let row = common::random(n, 1.0, 5);
    let rows: Vec<f32> = (0..m).flat_map(|_| row.iter().copied()).collect();
    let buf = upload_rows(&gpu, &rows, 0);
    let mut st = SamplerState::new(&gpu, m, 0).unwrap();
    let run = |st: &mut SamplerState| {
        // Rows 0 and 1 share a seed; row 2 has its own. Row 1 takes the exact path.
        st.set_params(0, &params(1.0, 100, 0.95, 0.0, 42), &[])
            .unwrap();
        st.set_params(1, &params(1.0, 0, 1.0, 0.0, 42), &[])
            .unwrap();
        st.set_params(2, &params(1.0, 100, 0.95, 0.0, 43), &[])
            .unwrap();
        let out = poisoned_tokens(&gpu, m);
        let mut seqs = vec![Vec::new(); m];
        for _ in 0..64 {
            k.sample(&gpu, buf.ptr(), m, n, st, out.ptr()).unwrap();
            for (r, t) in read_tokens(&gpu, &out, m).into_iter().enumerate() {
                seqs[r].push(t);
            }
        }
        seqs
    };
    let a = run(&mut st);
    let b = run(&mut st);
    assert_eq!(a, b, "the same seeds must give the same tokens");
    assert_ne!(a[0], a[2], "different seeds should give different tokens");
    let distinct: std::collections::HashSet<_> = a[0].iter().collect();
    assert!(
        distinct.len() > 20,
        "each step must draw anew: {distinct:?}"
    );
}

/// Infinite logits: +inf tokens are the only candidates (drawn uniformly); a row of -inf
/// gives its first token.
#[test]
fn infinities() {
    let Some(gpu) = common::gpu() else { return };
    let k = SampleKernels::new(&gpu).unwrap();
    let n = 5000;
    let m = 64;
    let mut row = common::random(n, 2.0, 8);
    row[17] = f32::INFINITY;
    row[4321] = f32::INFINITY;
    row[3] = f32::NEG_INFINITY;
    row[4999] = f32::NEG_INFINITY;
    let rows: Vec<f32> = (0..m).flat_map(|_| row.iter().copied()).collect();
    let buf = upload_rows(&gpu, &rows, 0);
    let mut st = SamplerState::new(&gpu, m, 0).unwrap();
    for r in 0..m {
        let p = if r % 2 == 0 {
            params(0.9, 40, 0.95, 0.05, r as u64)
        } else {
            params(1.0, 0, 1.0, 0.0, r as u64)
        };
        st.set_params(r, &p, &[]).unwrap();
    }
    let out = poisoned_tokens(&gpu, m);
    let mut seen = HashMap::new();
    for _ in 0..8 {
        k.sample(&gpu, buf.ptr(), m, n, &st, out.ptr()).unwrap();
        for t in read_tokens(&gpu, &out, m) {
            assert!(t == 17 || t == 4321, "drew {t}, not an infinite logit");
            *seen.entry(t).or_insert(0) += 1;
        }
    }
    assert_eq!(
        seen.len(),
        2,
        "both infinite tokens should be drawn: {seen:?}"
    );

    let neg = vec![f32::NEG_INFINITY; 777];
    let buf = upload_rows(&gpu, &neg, 0);
    st.set_params(0, &params(0.8, 40, 0.95, 0.05, 1), &[])
        .unwrap();
    let out = poisoned_tokens(&gpu, 1);
    k.sample(&gpu, buf.ptr(), 1, 777, &st, out.ptr()).unwrap();
    assert_eq!(read_tokens(&gpu, &out, 1)[0], 0);
}

// ---------------------------------------------------------------------------------------------
// Sampler: distributions

/// Samples with the exact path's launches as `sample` picks them (None) or forced.
#[allow(clippy::too_many_arguments)]
fn sample(
    gpu: &Gpu,
    k: &SampleKernels,
    logits: u64,
    m: usize,
    n: usize,
    st: &SamplerState,
    out: u64,
    exact_launches: Option<bool>,
) {
    match exact_launches {
        None => k.sample(gpu, logits, m, n, st, out),
        Some(e) => k.sample_with(gpu, logits, m, n, st, out, e),
    }
    .unwrap()
}

/// Draws `rows * iters` tokens from one row of logits replicated over `rows` rows (each row its
/// own seed, each launch a new step). With `history`, the row's penalty window is reset to it
/// and the logits re-uploaded before every launch, so every draw sees the same penalised
/// logits.
#[allow(clippy::too_many_arguments)]
fn gpu_draws(
    gpu: &Arc<Gpu>,
    k: &SampleKernels,
    row: &[f32],
    p: &SamplerParams,
    history: Option<&[u32]>,
    rows: usize,
    iters: usize,
    exact_launches: Option<bool>,
) -> Vec<u32> {
    let n = row.len();
    let all: Vec<f32> = (0..rows).flat_map(|_| row.iter().copied()).collect();
    let buf = upload_rows(gpu, &all, 0);
    let mut st = SamplerState::new(gpu, rows, 256).unwrap();
    let set_all = |st: &mut SamplerState, iter: usize| {
        for r in 0..rows {
            let mut pr = p.clone();
            pr.seed = p.seed.wrapping_add((iter * rows + r) as u64 * 0x9e37_79b9);
            st.set_params(r, &pr, history.unwrap_or(&[])).unwrap();
        }
    };
    set_all(&mut st, 0);
    let out = poisoned_tokens(gpu, rows);
    let mut draws = Vec::with_capacity(rows * iters);
    for iter in 0..iters {
        if history.is_some() && iter > 0 {
            gpu.write(&buf, 0, &all).unwrap();
            set_all(&mut st, iter);
        }
        gpu.write(&out, 0, &vec![NO_TOKEN; rows]).unwrap();
        sample(gpu, k, buf.ptr(), rows, n, &st, out.ptr(), exact_launches);
        let got = read_tokens(gpu, &out, rows);
        assert!(
            got.iter().all(|&t| (t as usize) < n),
            "a row was not written"
        );
        draws.extend(got);
    }
    draws
}

/// Launches per path in the draw tests: `full`, or two under compute-sanitizer
/// ([`common::sanitizing`]). The chi-square check holds at any count (bins pooled to five
/// expected draws), with less power.
fn draw_launches(full: usize) -> usize {
    if common::sanitizing() {
        full.min(2)
    } else {
        full
    }
}

/// Draws from the CPU sampler itself, each with its own seed, to check the reference.
fn cpu_draws(row: &[f32], p: &SamplerParams, history: &[u32], count: usize) -> Vec<u32> {
    (0..count)
        .map(|i| {
            let mut pr = p.clone();
            pr.seed = i as u64 * 7919 + 1;
            let mut s = Sampler::new(pr, row.len()).unwrap();
            for &t in history {
                s.accept(t);
            }
            s.sample(&mut row.to_vec())
        })
        .collect()
}

/// Draws of one setting from the GPU sampler follow the CPU chain's distribution (the CPU
/// sampler's own draws checked against the same reference first), on every launch path. One test
/// per setting, so each stays short enough for compute-sanitizer; `case` seeds its logits and
/// history.
fn draws_follow_the_cpu_chain(
    what: &str,
    case: u64,
    n: usize,
    scale: f32,
    p: SamplerParams,
    with_history: bool,
) {
    let Some(gpu) = common::gpu() else { return };
    let k = SampleKernels::new(&gpu).unwrap();
    let row = logits_with_spikes(n, scale, 1000 + case);
    let hist = if with_history {
        // The spikes and the top tokens in the window, so the penalties matter.
        let mut h = history(100, n, case);
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap());
        h.extend(order[..6].iter().map(|&i| i as u32));
        h
    } else {
        Vec::new()
    };
    let mut penalised_row = row.clone();
    let mut cpu = Sampler::new(p.clone(), n).unwrap();
    for &t in &hist {
        cpu.accept(t);
    }
    cpu.apply_penalties(&mut penalised_row);
    let probs = reference(&penalised_row, &p);
    assert!(!probs.is_empty());

    let cpu_check = cpu_draws(&row, &p, &hist, 3000);
    check_draws(
        &format!("{what} (CPU sampler vs reference)"),
        &cpu_check,
        &probs,
    );

    // Automatic launches, and both forced choices: the exact path in one block, and the
    // exact launches made for rows that do not need them.
    for launches in [None, Some(false), Some(true)] {
        let draws = gpu_draws(
            &gpu,
            &k,
            &row,
            &p,
            with_history.then_some(&hist[..]),
            500,
            draw_launches(40),
            launches,
        );
        let what = format!("{what}, exact launches {launches:?}");
        check_draws(&what, &draws, &probs);
        eprintln!(
            "{what}: {} tokens kept, {} draws ok",
            probs.len(),
            draws.len()
        );
    }
}

#[test]
fn draws_defaults() {
    draws_follow_the_cpu_chain(
        "defaults",
        0,
        4096,
        6.0,
        params(0.8, 40, 0.95, 0.05, 1),
        false,
    );
}

#[test]
fn draws_top_k_hot() {
    draws_follow_the_cpu_chain(
        "top-k 7, hot",
        1,
        3001,
        3.0,
        params(2.0, 7, 1.0, 0.0, 2),
        false,
    );
}

#[test]
fn draws_top_p_alone() {
    draws_follow_the_cpu_chain(
        "top-p 0.9 alone",
        2,
        4096,
        4.0,
        params(1.0, 0, 0.9, 0.0, 3),
        false,
    );
}

#[test]
fn draws_min_p_alone() {
    draws_follow_the_cpu_chain(
        "min-p alone",
        3,
        2999,
        3.0,
        params(1.5, 0, 1.0, 0.02, 4),
        false,
    );
}

#[test]
fn draws_wide_top_k_and_top_p() {
    const {
        assert!(
            300 > FAST_TOP_K,
            "the top-k 300 case must take the exact path"
        )
    };
    draws_follow_the_cpu_chain(
        "top-k 300 + top-p",
        4,
        4096,
        3.0,
        params(0.7, 300, 0.97, 0.0, 5),
        false,
    );
}

#[test]
fn draws_top_k_and_min_p() {
    draws_follow_the_cpu_chain(
        "top-k 128 + min-p",
        5,
        5000,
        2.0,
        params(1.0, 128, 1.0, 0.1, 6),
        false,
    );
}

#[test]
fn draws_flat_top_p() {
    draws_follow_the_cpu_chain(
        "flat, top-p 0.5",
        6,
        1000,
        0.05,
        params(1.0, 0, 0.5, 0.0, 7),
        false,
    );
}

#[test]
fn draws_with_penalties() {
    let p = penalised(params(1.0, 20, 0.9, 0.0, 8), 48);
    draws_follow_the_cpu_chain("penalties", 7, 2048, 3.0, p, true);
}

/// Equal logits crowd the cut: ties go to the lowest ids, as on the CPU, on every path (the
/// exact launches gather too many tokens and fall back to one block). One test per setting.
fn ties_at_the_cut(what: &str, p: SamplerParams) {
    let Some(gpu) = common::gpu() else { return };
    let k = SampleKernels::new(&gpu).unwrap();
    let row = vec![0.25f32; 20_000];
    let probs = reference(&row, &p);
    for launches in [None, Some(false)] {
        let draws = gpu_draws(&gpu, &k, &row, &p, None, 200, draw_launches(25), launches);
        check_draws(
            &format!("{what}, exact launches {launches:?}"),
            &draws,
            &probs,
        );
    }
}

#[test]
fn ties_at_the_top_p_cut() {
    ties_at_the_cut("top-p 0.5", params(1.0, 0, 0.5, 0.0, 1));
}

#[test]
fn ties_at_the_wide_top_k_cut() {
    ties_at_the_cut("top-k 300", params(1.0, 300, 1.0, 0.0, 2));
}

#[test]
fn ties_at_the_top_k_cut() {
    ties_at_the_cut("top-k 40", params(1.0, 40, 1.0, 0.0, 3));
}

#[test]
fn ties_at_the_top_k_and_top_p_cut() {
    ties_at_the_cut("top-k 1000 + top-p 0.3", params(0.5, 1000, 0.3, 0.0, 4));
}

/// A full-size vocabulary: rows with different settings in one launch, each draw a token the
/// CPU chain keeps; the per-row histories differ, so each row's penalties differ.
#[test]
fn large_vocabulary_rows() {
    let Some(gpu) = common::gpu() else { return };
    let k = SampleKernels::new(&gpu).unwrap();
    let n = 262_144;
    let settings = [
        params(0.0, 40, 0.95, 0.05, 1),
        params(0.8, 40, 0.95, 0.05, 2),
        params(1.0, 0, 0.9, 0.0, 3),
        params(0.9, 500, 0.95, 0.02, 4),
        penalised(params(1.0, 64, 1.0, 0.05, 5), 128),
        params(1.0, 0, 1.0, 0.1, 6),
    ];
    let m = settings.len();
    let rows: Vec<f32> = (0..m)
        .flat_map(|r| logits_with_spikes(n, 8.0, 77 + r as u64))
        .collect();
    let hists: Vec<Vec<u32>> = (0..m).map(|r| history(300, n, 500 + r as u64)).collect();
    let buf = upload_rows(&gpu, &rows, 0);
    let mut st = SamplerState::new(&gpu, m, 256).unwrap();
    let probs: Vec<HashMap<u32, f64>> = (0..m)
        .map(|r| {
            let mut s = Sampler::new(settings[r].clone(), n).unwrap();
            for &t in &hists[r] {
                s.accept(t);
            }
            let mut l = rows[r * n..(r + 1) * n].to_vec();
            s.apply_penalties(&mut l);
            reference(&l, &settings[r]).into_iter().collect()
        })
        .collect();
    let out = poisoned_tokens(&gpu, m);
    for launches in [None, Some(false)] {
        for step in 0..12 {
            gpu.write(&buf, 0, &rows).unwrap();
            for r in 0..m {
                let mut p = settings[r].clone();
                p.seed += step * 1000;
                st.set_params(r, &p, &hists[r]).unwrap();
            }
            gpu.write(&out, 0, &vec![NO_TOKEN; m]).unwrap();
            sample(&gpu, &k, buf.ptr(), m, n, &st, out.ptr(), launches);
            for (r, t) in read_tokens(&gpu, &out, m).into_iter().enumerate() {
                assert!(
                    probs[r].contains_key(&t),
                    "row {r}, step {step}, exact launches {launches:?}: drew {t}, which the CPU \
                     chain removes ({} kept)",
                    probs[r].len()
                );
            }
        }
    }
}
