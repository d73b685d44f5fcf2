//! The sampler against a plain f64 reference of llama.cpp's chain (full sort, explicit softmax):
//! exact where the result is determined, chi-square over many draws where it is random.

use std::collections::HashMap;

use akunu_core::sampling::{Sampler, SamplerParams, SamplingError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplerParams {
    SamplerParams {
        temperature,
        top_k,
        top_p,
        min_p,
        repeat_penalty: 1.0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        penalty_last_n: 0,
        seed: 0x5eed,
    }
}

/// Roughly normal logits with standard deviation `scale`.
fn random_logits(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            (rng.random::<f32>() + rng.random::<f32>() + rng.random::<f32>() - 1.5) * 2.0 * scale
        })
        .collect()
}

// ---------------------------------------------------------------- the f64 reference

/// Logits after the penalties, from the last `penalty_last_n` tokens of `history`.
fn ref_penalised(logits: &[f32], history: &[u32], p: &SamplerParams) -> Vec<f64> {
    let mut out: Vec<f64> = logits.iter().map(|&l| f64::from(l)).collect();
    if p.penalty_last_n == 0 {
        return out;
    }
    let window = &history[history.len().saturating_sub(p.penalty_last_n)..];
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in window {
        *counts.entry(t).or_default() += 1;
    }
    for (&t, &c) in &counts {
        let l = &mut out[t as usize];
        if *l <= 0.0 {
            *l *= f64::from(p.repeat_penalty);
        } else {
            *l /= f64::from(p.repeat_penalty);
        }
        *l -= f64::from(c) * f64::from(p.frequency_penalty) + f64::from(p.presence_penalty);
    }
    out
}

/// Token ids by logit descending, ties to the lower id, without NaN or `-inf`.
fn ref_order(l: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..l.len()).filter(|&i| l[i] > f64::NEG_INFINITY).collect();
    order.sort_by(|&a, &b| l[b].partial_cmp(&l[a]).unwrap().then(a.cmp(&b)));
    order
}

/// The probability of every token under the whole chain; the temperature is applied where
/// `temp_first` says, so a wrong order can be shown to fail the test.
fn ref_probs_with(
    logits: &[f32],
    history: &[u32],
    p: &SamplerParams,
    temp_first: bool,
) -> Vec<f64> {
    let mut l = ref_penalised(logits, history, p);
    let mut order = ref_order(&l);
    let mut probs = vec![0.0; logits.len()];
    if p.temperature <= 0.0 {
        probs[order[0]] = 1.0;
        return probs;
    }
    let t = f64::from(p.temperature);
    if temp_first {
        l.iter_mut().for_each(|x| *x /= t);
    }
    if p.top_k > 0 {
        order.truncate(p.top_k);
    }
    if p.top_p < 1.0 {
        let max = l[order[0]];
        let w: Vec<f64> = order.iter().map(|&i| (l[i] - max).exp()).collect();
        let sum: f64 = w.iter().sum();
        let mut cum = 0.0;
        let mut keep = order.len();
        for (j, wj) in w.iter().enumerate() {
            cum += wj / sum;
            if cum >= f64::from(p.top_p) {
                keep = j + 1;
                break;
            }
        }
        order.truncate(keep);
    }
    if p.min_p > 0.0 {
        let bar = l[order[0]] + f64::from(p.min_p).ln();
        order.retain(|&i| l[i] >= bar);
    }
    let max = l[order[0]];
    let scale = if temp_first { 1.0 } else { t };
    let w: Vec<f64> = order
        .iter()
        .map(|&i| ((l[i] - max) / scale).exp())
        .collect();
    let sum: f64 = w.iter().sum();
    for (&i, wi) in order.iter().zip(w) {
        probs[i] = wi / sum;
    }
    probs
}

fn ref_probs(logits: &[f32], history: &[u32], p: &SamplerParams) -> Vec<f64> {
    ref_probs_with(logits, history, p, false)
}

// ---------------------------------------------------------------- statistics

fn draw_counts(logits: &[f32], history: &[u32], p: &SamplerParams, draws: usize) -> Vec<usize> {
    let mut sampler = Sampler::new(p.clone(), logits.len()).unwrap();
    for &t in history {
        sampler.accept(t);
    }
    let mut counts = vec![0; logits.len()];
    let mut row = logits.to_vec();
    for _ in 0..draws {
        row.copy_from_slice(logits);
        counts[sampler.sample(&mut row) as usize] += 1;
    }
    counts
}

/// Pearson's statistic over `bins` (sets of tokens), with bins expecting fewer than 5 draws
/// pooled; infinite when a token of probability 0 was drawn. Returns (statistic, degrees of
/// freedom).
fn chi_square(counts: &[usize], probs: &[f64], bins: &[Vec<usize>]) -> (f64, usize) {
    let n: usize = counts.iter().sum();
    if counts.iter().zip(probs).any(|(&c, &p)| c > 0 && p == 0.0) {
        return (f64::INFINITY, 1);
    }
    let mut cells = Vec::new();
    let (mut pooled_obs, mut pooled_exp) = (0.0, 0.0);
    for bin in bins {
        let obs: f64 = bin.iter().map(|&i| counts[i] as f64).sum();
        let exp: f64 = bin.iter().map(|&i| probs[i]).sum::<f64>() * n as f64;
        if exp >= 5.0 {
            cells.push((obs, exp));
        } else {
            pooled_obs += obs;
            pooled_exp += exp;
        }
    }
    if pooled_exp > 0.0 {
        cells.push((pooled_obs, pooled_exp));
    }
    let stat = cells.iter().map(|(o, e)| (o - e) * (o - e) / e).sum();
    (stat, cells.len().saturating_sub(1).max(1))
}

/// The chi-square quantile at about 1 - 3e-7 (Wilson–Hilferty, z = 5): a correct sampler
/// exceeds it essentially never.
fn chi_square_bound(df: usize) -> f64 {
    let d = df as f64;
    let a = 2.0 / (9.0 * d);
    d * (1.0 - a + 5.0 * a.sqrt()).powi(3)
}

fn single_bins(n: usize) -> Vec<Vec<usize>> {
    (0..n).map(|i| vec![i]).collect()
}

/// About `k` groups of consecutive tokens in reference order holding similar mass.
fn mass_bins(probs: &[f64], k: usize) -> Vec<Vec<usize>> {
    let l: Vec<f64> = probs
        .iter()
        .map(|&p| if p > 0.0 { p } else { f64::NEG_INFINITY })
        .collect();
    let mut bins = vec![Vec::new()];
    let mut mass = 0.0;
    for i in ref_order(&l) {
        bins.last_mut().unwrap().push(i);
        mass += probs[i];
        if mass >= 1.0 / k as f64 {
            bins.push(Vec::new());
            mass = 0.0;
        }
    }
    bins.retain(|b| !b.is_empty());
    bins
}

/// Draws `draws` tokens and checks them against the reference: every drawn token survives the
/// reference chain, every token the reference gives 0.2% shows up, and the frequencies pass
/// the chi-square bound.
fn check_distribution(
    label: &str,
    logits: &[f32],
    history: &[u32],
    p: &SamplerParams,
    draws: usize,
    bins: Option<usize>,
) -> Vec<usize> {
    let probs = ref_probs(logits, history, p);
    let counts = draw_counts(logits, history, p, draws);
    for (i, (&c, &q)) in counts.iter().zip(&probs).enumerate() {
        assert!(
            c == 0 || q > 0.0,
            "{label}: drew token {i} {c} times, reference p = 0"
        );
        assert!(
            q < 0.002 || c > 0,
            "{label}: never drew token {i} of p = {q}"
        );
    }
    let bins = bins.map_or_else(|| single_bins(logits.len()), |k| mass_bins(&probs, k));
    let (stat, df) = chi_square(&counts, &probs, &bins);
    assert!(
        stat < chi_square_bound(df),
        "{label}: chi-square {stat:.1} over {df} degrees of freedom (bound {:.1})",
        chi_square_bound(df)
    );
    counts
}

// ---------------------------------------------------------------- drawn distributions

#[test]
fn draws_follow_the_reference_distribution() {
    let mut rng = StdRng::seed_from_u64(1);
    let cases = [
        ("llama.cpp defaults", 64, 3.0, params(0.8, 40, 0.95, 0.05)),
        ("top-p only, hot", 100, 2.0, params(1.5, 0, 0.9, 0.0)),
        ("top-k and min-p", 80, 2.0, params(0.6, 10, 1.0, 0.1)),
        ("plain softmax", 40, 1.5, params(1.0, 0, 1.0, 0.0)),
        ("all filters, cold", 200, 2.5, params(0.5, 50, 0.8, 0.02)),
    ];
    for (label, n, scale, p) in cases {
        let logits = random_logits(&mut rng, n, scale);
        check_distribution(label, &logits, &[], &p, 20_000, None);
    }
}

#[test]
fn draws_follow_the_reference_with_penalties() {
    let mut rng = StdRng::seed_from_u64(2);
    let n = 50;
    let logits = random_logits(&mut rng, n, 2.0);
    let history: Vec<u32> = (0..40).map(|_| rng.random_range(0..n as u32 / 2)).collect();
    let p = SamplerParams {
        repeat_penalty: 1.3,
        frequency_penalty: 0.2,
        presence_penalty: 0.4,
        penalty_last_n: 16,
        ..params(1.2, 30, 0.97, 0.01)
    };
    check_distribution("penalties", &logits, &history, &p, 20_000, None);
}

/// Top-p without top-k over hundreds of survivors: its cut is found through the mass
/// histogram; tokens are grouped by reference rank into bins of equal mass.
#[test]
fn wide_top_p() {
    let mut rng = StdRng::seed_from_u64(3);
    let logits = random_logits(&mut rng, 1000, 0.7);
    let p = params(1.0, 0, 0.7, 0.0);
    let kept = ref_probs(&logits, &[], &p)
        .iter()
        .filter(|&&q| q > 0.0)
        .count();
    assert!(kept > 256, "the case must keep many tokens, kept {kept}");
    check_distribution("wide top-p", &logits, &[], &p, 6_000, Some(20));
}

/// Logits on a coarse grid: long runs of ties, which top-k and top-p must cut by id, inside a
/// histogram bucket as well as in the sorted top-k.
#[test]
fn tied_logits_are_cut_by_id() {
    let mut rng = StdRng::seed_from_u64(12);
    let logits: Vec<f32> = random_logits(&mut rng, 400, 1.5)
        .iter()
        .map(|l| (l * 2.0).round() / 2.0)
        .collect();
    for (label, p) in [
        ("ties, top-k", params(1.0, 25, 1.0, 0.0)),
        ("ties, top-k top-p", params(0.9, 60, 0.6, 0.0)),
        ("ties, top-p", params(1.1, 0, 0.5, 0.0)),
        ("ties, top-p min-p", params(1.0, 0, 0.8, 0.2)),
    ] {
        check_distribution(label, &logits, &[], &p, 6_000, Some(20));
    }
}

/// A top-k too large to keep sorted: selected on a copy, alone and under top-p.
#[test]
fn large_top_k() {
    let mut rng = StdRng::seed_from_u64(13);
    let logits = random_logits(&mut rng, 4600, 0.3);
    for (label, p) in [
        ("large top-k", params(1.0, 4300, 1.0, 0.0)),
        ("large top-k, top-p", params(1.0, 4200, 0.5, 0.0)),
    ] {
        check_distribution(label, &logits, &[], &p, 2_000, Some(10));
    }
}

/// The test has power: the same draws fail against the chain with the temperature applied
/// before the filters.
#[test]
fn distribution_check_rejects_a_wrong_order() {
    let mut rng = StdRng::seed_from_u64(4);
    let logits = random_logits(&mut rng, 64, 2.0);
    let p = params(0.7, 0, 0.9, 0.05);
    let counts = check_distribution("right order", &logits, &[], &p, 20_000, None);
    let wrong = ref_probs_with(&logits, &[], &p, true);
    let (stat, df) = chi_square(&counts, &wrong, &single_bins(logits.len()));
    assert!(
        stat > 10.0 * chi_square_bound(df),
        "chi-square {stat} over {df}"
    );
}

// ---------------------------------------------------------------- determined results

#[test]
fn greedy_is_the_argmax_after_penalties() {
    let mut rng = StdRng::seed_from_u64(5);
    for round in 0..200 {
        let n = 1000;
        let logits = random_logits(&mut rng, n, 3.0);
        let history: Vec<u32> = (0..100).map(|_| rng.random_range(0..n as u32)).collect();
        let p = SamplerParams {
            repeat_penalty: 1.0 + rng.random::<f32>(),
            frequency_penalty: rng.random::<f32>(),
            presence_penalty: rng.random::<f32>() - 0.5,
            penalty_last_n: 1 + round % 64,
            ..SamplerParams::greedy()
        };
        let expected = ref_order(&ref_penalised(&logits, &history, &p))[0] as u32;
        let mut sampler = Sampler::new(p, n).unwrap();
        assert!(sampler.is_greedy());
        history.iter().for_each(|&t| sampler.accept(t));
        assert_eq!(
            sampler.sample(&mut logits.clone()),
            expected,
            "round {round}"
        );
    }
}

/// Settings that leave one token standing draw it every time.
#[test]
fn filters_that_leave_one_token() {
    let mut rng = StdRng::seed_from_u64(6);
    for round in 0..50 {
        let logits = random_logits(&mut rng, 300, 2.0);
        let argmax = ref_order(&ref_penalised(&logits, &[], &params(1.0, 0, 1.0, 0.0)))[0] as u32;
        for p in [
            params(0.9, 1, 1.0, 0.0),
            params(1.7, 0, 0.0, 0.0),
            params(0.5, 0, 1.0, 1.0),
            params(0.0, 40, 0.95, 0.05),
            params(-1.0, 0, 1.0, 0.0),
        ] {
            let mut sampler = Sampler::new(
                SamplerParams {
                    seed: round,
                    ..p.clone()
                },
                300,
            )
            .unwrap();
            for _ in 0..5 {
                assert_eq!(sampler.sample(&mut logits.clone()), argmax, "{p:?}");
            }
        }
    }
}

#[test]
fn ties_go_to_the_lowest_id() {
    let mut greedy = Sampler::new(SamplerParams::greedy(), 6).unwrap();
    assert_eq!(greedy.sample(&mut [0.5; 6]), 0);
    assert_eq!(greedy.sample(&mut [1.0, 3.0, 2.0, 3.0, 3.0, -1.0]), 1);

    let logits = [1.0, 3.0, 2.0, 3.0, 3.0, -1.0];
    let mut top1 = Sampler::new(params(1.0, 1, 1.0, 0.0), 6).unwrap();
    let mut top2 = Sampler::new(params(1.0, 2, 1.0, 0.0), 6).unwrap();
    let mut seen = [0usize; 6];
    for _ in 0..2000 {
        assert_eq!(top1.sample(&mut logits.clone()), 1);
        seen[top2.sample(&mut logits.clone()) as usize] += 1;
    }
    assert_eq!(seen[0] + seen[2] + seen[4] + seen[5], 0, "{seen:?}");
    assert!(seen[1].abs_diff(seen[3]) < 200, "{seen:?}");
}

#[test]
fn masked_and_nan_logits() {
    let n = 1000;
    let mut logits = vec![f32::NEG_INFINITY; n];
    logits[737] = -5.0;
    for p in [
        SamplerParams::default(),
        SamplerParams::greedy(),
        params(2.0, 0, 1.0, 0.0),
    ] {
        let mut sampler = Sampler::new(p, n).unwrap();
        for _ in 0..20 {
            assert_eq!(sampler.sample(&mut logits.clone()), 737);
        }
    }

    // Nothing to draw from: the first masked id, or 0.
    let mut sampler = Sampler::new(SamplerParams::default(), 4).unwrap();
    assert_eq!(
        sampler.sample(&mut [f32::NAN, f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY]),
        1
    );
    assert_eq!(sampler.sample(&mut [f32::NAN; 4]), 0);
    assert_eq!(sampler.sample(&mut []), 0);

    let mut rng = StdRng::seed_from_u64(7);
    let mut logits = random_logits(&mut rng, 200, 2.0);
    let nans: Vec<usize> = (0..200).step_by(7).collect();
    for &i in &nans {
        logits[i] = f32::NAN;
    }
    let mut greedy = Sampler::new(SamplerParams::greedy(), 200).unwrap();
    let mut clean = logits.clone();
    nans.iter().for_each(|&i| clean[i] = f32::NEG_INFINITY);
    let expected = ref_order(&ref_penalised(&clean, &[], &SamplerParams::greedy()))[0] as u32;
    assert_eq!(greedy.sample(&mut logits.clone()), expected);
    for p in [
        params(1.0, 0, 1.0, 0.0),
        params(0.8, 40, 0.95, 0.05),
        params(1.3, 0, 0.9, 0.0),
    ] {
        let label = format!("NaN {p:?}");
        let counts = check_distribution(&label, &clean, &[], &p, 5_000, None);
        let drawn = draw_counts(&logits, &[], &p, 5_000);
        assert_eq!(drawn, counts, "NaN must behave exactly as -inf");
    }
}

#[test]
fn infinite_logits_share_the_draw() {
    let mut logits = vec![0.0f32; 10];
    logits[3] = f32::INFINITY;
    logits[8] = f32::INFINITY;
    let counts = draw_counts(&logits, &[], &params(1.0, 0, 1.0, 0.0), 4000);
    assert_eq!(counts[3] + counts[8], 4000, "{counts:?}");
    assert!(counts[3].abs_diff(counts[8]) < 400, "{counts:?}");
    assert_eq!(
        Sampler::new(SamplerParams::greedy(), 10)
            .unwrap()
            .sample(&mut logits),
        3
    );
}

#[test]
fn huge_vocabulary() {
    let n = 262_144;
    let mut rng = StdRng::seed_from_u64(8);
    let mut logits = random_logits(&mut rng, n, 4.0);
    for _ in 0..1000 {
        logits[rng.random_range(0..n)] = f32::NEG_INFINITY;
    }
    let argmax = ref_order(&ref_penalised(&logits, &[], &SamplerParams::greedy()))[0] as u32;
    assert_eq!(
        Sampler::new(SamplerParams::greedy(), n)
            .unwrap()
            .sample(&mut logits.clone()),
        argmax
    );
    for p in [
        SamplerParams {
            seed: 9,
            ..SamplerParams::default()
        },
        params(1.0, 0, 0.9, 0.0),
        params(0.7, 0, 1.0, 0.02),
        params(1.0, 0, 1.0, 0.0),
    ] {
        let probs = ref_probs(&logits, &[], &p);
        let mut sampler = Sampler::new(p.clone(), n).unwrap();
        for _ in 0..10 {
            let token = sampler.sample(&mut logits.clone()) as usize;
            assert!(
                probs[token] > 0.0,
                "{p:?}: drew {token} outside the reference set"
            );
        }
    }
}

// ---------------------------------------------------------------- seeds and state

#[test]
fn seeds_are_reproducible() {
    let mut rng = StdRng::seed_from_u64(10);
    let logits = random_logits(&mut rng, 500, 1.0);
    let run = |seed: u64| -> Vec<u32> {
        let mut sampler = Sampler::new(
            SamplerParams {
                seed,
                ..params(1.0, 0, 1.0, 0.0)
            },
            500,
        )
        .unwrap();
        (0..200)
            .map(|_| sampler.sample(&mut logits.clone()))
            .collect()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));

    let mut sampler = Sampler::new(
        SamplerParams {
            seed: 1,
            ..params(1.0, 0, 1.0, 0.0)
        },
        500,
    )
    .unwrap();
    let first: Vec<u32> = (0..200)
        .map(|_| sampler.sample(&mut logits.clone()))
        .collect();
    sampler.reset();
    let again: Vec<u32> = (0..200)
        .map(|_| sampler.sample(&mut logits.clone()))
        .collect();
    assert_eq!(first, again);
    assert_eq!(first, run(1));

    assert_ne!(SamplerParams::default().seed, SamplerParams::default().seed);
}

#[test]
fn penalties_follow_the_formula() {
    let mut rng = StdRng::seed_from_u64(11);
    let n = 300;
    for round in 0..100 {
        let logits = random_logits(&mut rng, n, 3.0);
        let history: Vec<u32> = (0..rng.random_range(0..200))
            .map(|_| rng.random_range(0..60))
            .collect();
        let p = SamplerParams {
            repeat_penalty: 0.5 + 1.5 * rng.random::<f32>(),
            frequency_penalty: rng.random::<f32>() - 0.3,
            presence_penalty: rng.random::<f32>() - 0.3,
            penalty_last_n: rng.random_range(0..80),
            ..SamplerParams::default()
        };
        let mut sampler = Sampler::new(p.clone(), n).unwrap();
        history.iter().for_each(|&t| sampler.accept(t));
        let mut got = logits.clone();
        sampler.apply_penalties(&mut got);
        let expected = ref_penalised(&logits, &history, &p);
        for i in 0..n {
            let e = expected[i];
            assert!(
                (f64::from(got[i]) - e).abs() <= 1e-5 * e.abs().max(1.0),
                "round {round} token {i}: {} vs {e}",
                got[i]
            );
        }

        sampler.reset();
        let mut untouched = logits.clone();
        sampler.apply_penalties(&mut untouched);
        assert_eq!(untouched, logits, "reset empties the window");
    }

    // Tokens outside the row are ignored.
    let mut sampler = Sampler::new(
        SamplerParams {
            repeat_penalty: 2.0,
            ..SamplerParams::default()
        },
        4,
    )
    .unwrap();
    sampler.accept(1);
    sampler.accept(99);
    let mut row = [1.0, 1.0, -1.0, 1.0];
    sampler.apply_penalties(&mut row);
    assert_eq!(row, [1.0, 0.5, -1.0, 1.0]);
}

// ---------------------------------------------------------------- parameters

#[test]
fn defaults_are_llama_cpp_defaults() {
    let p = SamplerParams::default();
    assert_eq!(
        (p.temperature, p.top_k, p.top_p, p.min_p),
        (0.8, 40, 0.95, 0.05)
    );
    assert_eq!(
        (
            p.repeat_penalty,
            p.frequency_penalty,
            p.presence_penalty,
            p.penalty_last_n
        ),
        (1.0, 0.0, 0.0, 64)
    );
    assert!(p.validate().is_ok());
    assert!(SamplerParams::greedy().is_greedy());
}

#[test]
fn invalid_parameters_are_errors() {
    let base = SamplerParams::default();
    let bad: Vec<(&str, SamplerParams)> = vec![
        (
            "temperature",
            SamplerParams {
                temperature: f32::NAN,
                ..base.clone()
            },
        ),
        (
            "temperature",
            SamplerParams {
                temperature: f32::INFINITY,
                ..base.clone()
            },
        ),
        (
            "top_p",
            SamplerParams {
                top_p: -0.1,
                ..base.clone()
            },
        ),
        (
            "top_p",
            SamplerParams {
                top_p: 1.01,
                ..base.clone()
            },
        ),
        (
            "top_p",
            SamplerParams {
                top_p: f32::NAN,
                ..base.clone()
            },
        ),
        (
            "min_p",
            SamplerParams {
                min_p: -0.01,
                ..base.clone()
            },
        ),
        (
            "min_p",
            SamplerParams {
                min_p: 1.5,
                ..base.clone()
            },
        ),
        (
            "min_p",
            SamplerParams {
                min_p: f32::NAN,
                ..base.clone()
            },
        ),
        (
            "repeat_penalty",
            SamplerParams {
                repeat_penalty: 0.0,
                ..base.clone()
            },
        ),
        (
            "repeat_penalty",
            SamplerParams {
                repeat_penalty: -1.0,
                ..base.clone()
            },
        ),
        (
            "repeat_penalty",
            SamplerParams {
                repeat_penalty: f32::NAN,
                ..base.clone()
            },
        ),
        (
            "repeat_penalty",
            SamplerParams {
                repeat_penalty: f32::INFINITY,
                ..base.clone()
            },
        ),
        (
            "repeat_penalty",
            SamplerParams {
                repeat_penalty: 1e-40,
                ..base.clone()
            },
        ),
        (
            "frequency_penalty",
            SamplerParams {
                frequency_penalty: f32::NAN,
                ..base.clone()
            },
        ),
        (
            "presence_penalty",
            SamplerParams {
                presence_penalty: f32::NEG_INFINITY,
                ..base.clone()
            },
        ),
    ];
    for (param, p) in bad {
        let err = p.validate().unwrap_err();
        let named = match &err {
            SamplingError::NotFinite { param, .. } | SamplingError::OutOfRange { param, .. } => {
                *param
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(named, param, "{p:?}");
        // NaN values make the errors unequal to themselves; their messages compare.
        assert_eq!(
            Sampler::new(p, 10).unwrap_err().to_string(),
            err.to_string()
        );
        assert!(err.to_string().starts_with("sampling: "), "{err}");
    }

    for ok in [
        SamplerParams {
            temperature: -1.0,
            ..base.clone()
        },
        SamplerParams {
            top_p: 0.0,
            min_p: 1.0,
            ..base.clone()
        },
        SamplerParams {
            top_p: 1.0,
            min_p: 0.0,
            top_k: usize::MAX,
            ..base.clone()
        },
        SamplerParams {
            penalty_last_n: usize::MAX,
            frequency_penalty: -2.0,
            ..base.clone()
        },
    ] {
        assert!(Sampler::new(ok, 10).is_ok());
    }

    assert_eq!(
        Sampler::new(base.clone(), 0).unwrap_err(),
        SamplingError::EmptyVocabulary
    );
    if let Some(too_many) = (u32::MAX as usize).checked_add(2) {
        assert_eq!(
            Sampler::new(base, too_many).unwrap_err(),
            SamplingError::VocabularyTooLarge(too_many)
        );
    }
}
