//! A sequence's logits do not depend on what shares its forward passes: a server batches many
//! users' tokens into one pass (decode tokens of several slots beside a prompt chunk of another),
//! and greedy output must be exactly what each user gets alone. On the small synthetic models of
//! `scripts/ref/tiny_models.py` (`$AKUNU_REFDATA/engine/tiny`), which cover every family and the
//! Q4_0, Q4_K, Q5_0, Q6_K, Q8_0, F16 and F32 weights, compared bit for bit.

use std::sync::Arc;

use akunu_core::session::Logits;
use akunu_core::{Backend, Batch, Model, Session};
use akunu_cpu::{CpuBackend, CpuOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MODELS: [&str; 8] = [
    "llama",
    "llama31",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_swa8",
];

fn tiny(name: &str) -> Option<Arc<Model>> {
    let dir = akunu_testutil::refdata("engine")?;
    let path = dir.join("tiny").join(format!("{name}.gguf"));
    Some(Arc::new(
        Model::load(&path).unwrap_or_else(|e| panic!("{name}: {e}")),
    ))
}

fn backend(model: &Arc<Model>, n_slots: usize, max_batch: usize) -> CpuBackend {
    let opts = CpuOptions {
        n_ctx: 96,
        n_slots,
        max_batch,
        threads: 2,
    };
    CpuBackend::new(model.clone(), opts).expect("backend")
}

/// Random ids of ordinary tokens (past the specials and byte tokens of the tiny vocabularies).
fn random_tokens(model: &Model, len: usize, seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n_vocab = model.config.n_vocab as u32;
    (0..len).map(|_| rng.random_range(260..n_vocab)).collect()
}

/// What one slot adds to a pass: `tokens` from position `start`, with the logits after the last
/// one if `logits`.
struct Part<'a> {
    slot: u32,
    start: u32,
    tokens: &'a [u32],
    logits: bool,
}

/// One forward pass over `parts`, in order; the logits of the parts that ask for them, in order.
fn forward(b: &mut CpuBackend, parts: &[Part]) -> Vec<Vec<f32>> {
    let (mut tokens, mut positions, mut slots, mut outputs) = (vec![], vec![], vec![], vec![]);
    for p in parts {
        tokens.extend_from_slice(p.tokens);
        positions.extend(p.start..p.start + p.tokens.len() as u32);
        slots.resize(tokens.len(), p.slot);
        if p.logits {
            outputs.push(tokens.len() as u32 - 1);
        }
    }
    b.forward(&Batch {
        tokens: &tokens,
        positions: &positions,
        slots: &slots,
        outputs: &outputs,
    })
    .expect("forward");
    if outputs.is_empty() {
        return Vec::new();
    }
    let logits = b.logits().expect("logits");
    let n_vocab = logits.len() / outputs.len();
    logits.chunks(n_vocab).map(<[f32]>::to_vec).collect()
}

fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32
}

/// Slot 0 decodes greedily alone, one token per pass; then again beside 15 other slots' decode
/// tokens and a 9-token prompt chunk of a 17th slot, at a different place in the batch at every
/// step. Its logits must not change by a bit.
#[test]
fn decode_logits_do_not_depend_on_the_rest_of_the_pass() {
    const STEPS: usize = 4;
    const OTHERS: usize = 15;
    const CHUNK: usize = 9;
    for name in MODELS {
        let Some(model) = tiny(name) else { return };
        let prompt = random_tokens(&model, 13, 1);

        let mut alone = backend(&model, 1, 16);
        let mut last = forward(
            &mut alone,
            &[Part {
                slot: 0,
                start: 0,
                tokens: &prompt,
                logits: true,
            }],
        )
        .remove(0);
        let mut want = Vec::new();
        let mut path = Vec::new();
        for step in 0..STEPS {
            let tok = argmax(&last);
            path.push(tok);
            let part = Part {
                slot: 0,
                start: (prompt.len() + step) as u32,
                tokens: &[tok],
                logits: true,
            };
            last = forward(&mut alone, &[part]).remove(0);
            want.push(last.clone());
        }

        // The prompt slot is the last one; the others decode from prompts of varied length.
        let long = OTHERS as u32 + 1;
        let mut mixed = backend(&model, OTHERS + 2, 48);
        forward(
            &mut mixed,
            &[Part {
                slot: 0,
                start: 0,
                tokens: &prompt,
                logits: false,
            }],
        );
        let others: Vec<Vec<u32>> = (1..=OTHERS)
            .map(|s| random_tokens(&model, 3 + 2 * s, 100 + s as u64))
            .collect();
        for (s, p) in others.iter().enumerate() {
            let part = Part {
                slot: s as u32 + 1,
                start: 0,
                tokens: p,
                logits: false,
            };
            forward(&mut mixed, &[part]);
        }
        let chunks = random_tokens(&model, CHUNK * STEPS, 7);
        let mut next: Vec<u32> = others.iter().map(|p| p[0]).collect();
        for (step, tok) in path.iter().enumerate() {
            let at = (5 * step + 3) % (OTHERS + 1);
            let mut parts: Vec<Part> = others
                .iter()
                .zip(&next)
                .enumerate()
                .map(|(s, (p, t))| Part {
                    slot: s as u32 + 1,
                    start: (p.len() + step) as u32,
                    tokens: std::slice::from_ref(t),
                    logits: true,
                })
                .collect();
            parts.insert(
                at,
                Part {
                    slot: 0,
                    start: (prompt.len() + step) as u32,
                    tokens: std::slice::from_ref(tok),
                    logits: true,
                },
            );
            parts.push(Part {
                slot: long,
                start: (CHUNK * step) as u32,
                tokens: &chunks[CHUNK * step..CHUNK * (step + 1)],
                logits: true,
            });
            let got = forward(&mut mixed, &parts);
            assert!(
                got[at] == want[step],
                "{name}: step {step}, slot 0 at row {at} of the pass differs from alone"
            );
            for (s, n) in next.iter_mut().enumerate() {
                *n = argmax(&got[if s < at { s } else { s + 1 }]);
            }
        }
    }
}

/// A prompt evaluated in one pass, in passes of 7 and token by token gives the same logits at
/// every position, and `Session::decode_many` over many slots the same as one slot at a time.
#[test]
fn logits_do_not_depend_on_chunking_or_batched_decode() {
    for name in MODELS {
        let Some(model) = tiny(name) else { return };
        let n_vocab = model.config.n_vocab;
        let prompt = random_tokens(&model, 45, 2);
        let all = |max_batch: usize| {
            let mut s = Session::new(backend(&model, 1, max_batch), n_vocab);
            let mut out = Vec::new();
            s.eval_all(0, &prompt, max_batch, |_, row| out.extend_from_slice(row))
                .unwrap();
            out
        };
        let whole = all(64);
        for max_batch in [7, 1] {
            let got = all(max_batch);
            for (i, (a, b)) in got.chunks(n_vocab).zip(whole.chunks(n_vocab)).enumerate() {
                assert!(a == b, "{name}: passes of {max_batch}, position {i}");
            }
        }

        let slots = 18;
        let prompts: Vec<Vec<u32>> = (0..slots)
            .map(|s| random_tokens(&model, 2 + s, 200 + s as u64))
            .collect();
        let mut batched = Session::new(backend(&model, slots, 32), n_vocab);
        let mut single = Session::new(backend(&model, slots, 32), n_vocab);
        let mut toks = Vec::new();
        for (slot, p) in prompts.iter().enumerate() {
            let last = batched.eval(slot, p, Logits::Last).unwrap().to_vec();
            single.eval(slot, p, Logits::None).unwrap();
            toks.push(argmax(&last));
        }
        for step in 0..3 {
            let steps: Vec<(usize, u32)> = (0..slots)
                .map(|i| (i * 7 + step) % slots)
                .map(|s| (s, toks[s]))
                .collect();
            let got = batched.decode_many(&steps).unwrap().to_vec();
            for (k, &(slot, tok)) in steps.iter().enumerate() {
                let want = single.eval(slot, &[tok], Logits::Last).unwrap();
                assert!(
                    &got[k * n_vocab..(k + 1) * n_vocab] == want,
                    "{name}: step {step}, slot {slot}"
                );
                toks[slot] = argmax(want);
            }
        }
    }
}
