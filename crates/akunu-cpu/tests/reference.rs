//! The engine against llama.cpp, on data from `scripts/ref/engine_fixtures.py`
//! (`$AKUNU_REFDATA/engine`):
//! - small synthetic models of every supported family (llama with and without Llama 3.1 RoPE
//!   factors, qwen2, qwen3, gemma, gemma2, gemma3 with a window shorter than the sequence):
//!   logits at every position, evaluated in one pass, in odd-sized chunks and token by token;
//! - the default model: greedy continuations and teacher-forced top-1 over an English passage.
//!
//! Tolerances come from the manifest; they are a few times llama.cpp's own spread between its
//! flash-attention and plain attention paths on the same file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use akunu_core::session::Logits;
use akunu_core::{Model, Session};
use akunu_cpu::{CpuBackend, CpuOptions};
use serde_json::Value;

fn engine_dir() -> Option<PathBuf> {
    akunu_testutil::refdata("engine")
}

fn manifest(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("manifest.json")).expect("engine manifest");
    serde_json::from_str(&text).expect("manifest is JSON")
}

fn session(
    model: &Arc<Model>,
    n_ctx: usize,
    max_batch: usize,
    threads: usize,
) -> Session<CpuBackend> {
    let backend = CpuBackend::new(
        model.clone(),
        CpuOptions {
            n_ctx,
            n_slots: 2,
            max_batch,
            threads,
        },
    )
    .expect("backend");
    Session::new(backend, model.config.n_vocab)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an id list")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("a number list")
        .iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

struct Diff {
    rms_rel: f64,
    max_abs: f64,
    top1_disagree: usize,
}

/// Compares logits row by row with the manifest's metrics (see its `llama_cpp.metrics`).
fn compare(ours: &[f32], reference: &[f32], n_vocab: usize, margin_floor: f64) -> Diff {
    assert_eq!(ours.len(), reference.len());
    let (mut err2, mut var2, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
    let mut top1_disagree = 0;
    for (a, b) in ours.chunks(n_vocab).zip(reference.chunks(n_vocab)) {
        let mean = b.iter().map(|&x| x as f64).sum::<f64>() / n_vocab as f64;
        for (&x, &r) in a.iter().zip(b) {
            let d = (x - r) as f64;
            err2 += d * d;
            var2 += (r as f64 - mean).powi(2);
            max_abs = max_abs.max(d.abs());
        }
        let (best, margin) = top2(b);
        if margin > margin_floor && argmax(a) != best {
            top1_disagree += 1;
        }
    }
    Diff {
        rms_rel: (err2 / var2).sqrt(),
        max_abs,
        top1_disagree,
    }
}

fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// The argmax and its lead over the runner-up.
fn top2(x: &[f32]) -> (usize, f64) {
    let best = argmax(x);
    let second = x
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != best)
        .map(|(_, &v)| v)
        .fold(f32::NEG_INFINITY, f32::max);
    (best, (x[best] - second) as f64)
}

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).expect("reference logits");
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// All positions' logits, evaluated with passes of at most `chunk` tokens.
fn all_logits(s: &mut Session<CpuBackend>, slot: usize, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let n_vocab = s.n_vocab();
    let mut out = vec![0.0f32; tokens.len() * n_vocab];
    s.clear(slot).unwrap();
    for (i, part) in tokens.chunks(chunk).enumerate() {
        let start = i * chunk;
        s.eval_all(slot, part, chunk, |j, row| {
            out[(start + j) * n_vocab..(start + j + 1) * n_vocab].copy_from_slice(row);
        })
        .expect("eval");
    }
    out
}

#[test]
fn tiny_models_match_llama_cpp() {
    let Some(dir) = engine_dir() else { return };
    let m = manifest(&dir);
    let tiny = m["tiny"].as_array().expect("tiny models");
    assert!(tiny.len() >= 8, "expected every family in the manifest");
    for t in tiny {
        let name = t["name"].as_str().unwrap();
        let model = Arc::new(Model::load(dir.join(t["model"].as_str().unwrap())).expect(name));
        assert_eq!(
            model.arch.family.name(),
            t["arch"].as_str().unwrap(),
            "{name}"
        );
        let tokens = ids(&t["tokens"]);
        let n_vocab = model.config.n_vocab;
        assert_eq!(n_vocab as u64, t["n_vocab"].as_u64().unwrap());
        let reference = read_f32(&dir.join(t["logits"].as_str().unwrap()));
        let tol = &t["tolerance"];
        let (tol_rms, tol_max) = (
            tol["rms_rel"].as_f64().unwrap(),
            tol["max_abs"].as_f64().unwrap(),
        );
        let mut s = session(&model, tokens.len() + 8, 64, 2);
        // One pass, odd chunks (chunked prefill onto a filled cache), and token by token (the
        // decode path), on both slots.
        for (slot, chunk) in [(0, tokens.len()), (1, 7), (0, 1)] {
            let ours = all_logits(&mut s, slot, &tokens, chunk);
            let d = compare(&ours, &reference, n_vocab, 0.25);
            eprintln!(
                "{name} chunk {chunk}: rms_rel {:.4} (tol {tol_rms:.4}), max_abs {:.4} (tol {tol_max:.4}), top-1 disagreements {}",
                d.rms_rel, d.max_abs, d.top1_disagree
            );
            assert!(
                d.rms_rel <= tol_rms,
                "{name} chunk {chunk}: rms_rel {}",
                d.rms_rel
            );
            assert!(
                d.max_abs <= tol_max,
                "{name} chunk {chunk}: max_abs {}",
                d.max_abs
            );
            assert_eq!(d.top1_disagree, 0, "{name} chunk {chunk}");
        }
    }
}

#[test]
fn default_model_greedy_matches_llama_cpp() {
    let (Some(dir), Some(path)) = (engine_dir(), akunu_testutil::model()) else {
        return;
    };
    let m = manifest(&dir);
    let model = Arc::new(Model::load(&path).expect("default model"));
    let mut s = session(&model, 512, 512, 2);
    let mut identical_32 = 0;
    let cases = m["greedy"].as_array().expect("greedy cases");
    for case in cases {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["ids"]);
        let margins = f32s(&case["margin"]);
        s.clear(0).unwrap();
        let mut logits = s.eval(0, &prompt, Logits::Last).unwrap().to_vec();
        let mut got = Vec::new();
        for _ in 0..want.len() {
            let tok = argmax(&logits) as u32;
            got.push(tok);
            logits.copy_from_slice(s.eval(0, &[tok], Logits::Last).unwrap());
        }
        let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        eprintln!(
            "{:?}: {same} of {} greedy tokens identical",
            case["prompt"].as_str().unwrap_or(""),
            want.len()
        );
        if same >= 32 {
            identical_32 += 1;
        }
        // Free-running continuations may fork where float rounding decides a near tie (llama.cpp
        // forks from itself there too); before the first such step they must be identical.
        let near_tie = case["tolerance"]["exact_until_margin_below"]
            .as_f64()
            .unwrap();
        let first_tie = margins
            .iter()
            .position(|&m| (m as f64) < near_tie)
            .unwrap_or(want.len());
        assert!(
            same >= first_tie,
            "diverged at step {same}, before llama.cpp's first near tie (step {first_tie}, margin < {near_tie})"
        );
    }
    eprintln!(
        "{identical_32} of {} prompts identical for 32+ tokens",
        cases.len()
    );
    assert!(identical_32 >= 1, "no prompt agrees for 32 tokens");
}

#[test]
fn default_model_teacher_forced_top1_matches_llama_cpp() {
    let (Some(dir), Some(path)) = (engine_dir(), akunu_testutil::model()) else {
        return;
    };
    let m = manifest(&dir);
    let top1 = &m["top1"];
    let model = Arc::new(Model::load(&path).expect("default model"));
    let tokens = ids(&top1["ids"]);
    let want = ids(&top1["argmax"]);
    let want_logit = f32s(&top1["logit"]);
    let margins = f32s(&top1["margin"]);
    let tol_logit = top1["tolerance"]["max_abs_logit"].as_f64().unwrap();
    let mut s = session(&model, tokens.len(), 128, 2);
    let mut agree = 0;
    let mut max_abs_logit = 0.0f64;
    s.eval_all(0, &tokens, 128, |i, row| {
        let best = argmax(row);
        if best as u32 == want[i] {
            agree += 1;
        } else {
            assert!(
                margins[i] < 0.5,
                "position {i}: top-1 {best} vs llama.cpp's {} which led by {}",
                want[i],
                margins[i]
            );
        }
        max_abs_logit = max_abs_logit.max((row[want[i] as usize] - want_logit[i]).abs() as f64);
    })
    .unwrap();
    let rate = agree as f64 / tokens.len() as f64;
    // llama.cpp does not agree with itself beyond float rounding either: its flash-attention
    // and plain attention paths pick different tokens at a few near-tie positions of this
    // small model. Agreement may fall short of that by at most 3 points.
    let own = 1.0
        - top1["fa_off"]["argmax_differs_at"]
            .as_array()
            .unwrap()
            .len() as f64
            / tokens.len() as f64;
    eprintln!("teacher-forced top-1 agreement {rate:.4} (llama.cpp with itself: {own:.4}), max |Δlogit| of llama.cpp's top-1 {max_abs_logit:.4}");
    assert!(rate >= own - 0.03, "top-1 agreement {rate}");
    assert!(max_abs_logit <= tol_logit, "max |Δlogit| {max_abs_logit}");
}
