//! Sessions over the CPU backend on the small synthetic models of `scripts/ref/tiny_models.py`
//! (`$AKUNU_REFDATA/engine/tiny`): rollback and prefix reuse, independent slots, batched
//! decode, chunked prefill, thread counts, refusals that leave the session as it was, and the
//! decode loop's stopping rules and seeding.
//!
//! Logits are compared bit for bit: a token's arithmetic does not depend on the thread count,
//! on how a prompt is split into passes or on what else shares a pass (see also
//! `batch_invariance.rs`).

use std::sync::Arc;

use akunu_core::generate::{generate, GenerateOutput, GenerateParams, StopReason};
use akunu_core::sampling::SamplerParams;
use akunu_core::session::Logits;
use akunu_core::{Backend, Batch, EngineError, Model, Part, Session};
use akunu_cpu::{CpuBackend, CpuOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Models that cover both RoPE styles, GQA and MQA, QK-norm, sliding windows shorter than the
/// sequences used here, and attention and logit soft-capping.
const MODELS: [&str; 4] = ["llama", "qwen3", "gemma3_swa8", "gemma2"];

fn tiny(name: &str) -> Option<Arc<Model>> {
    let dir = akunu_testutil::refdata("engine")?;
    let path = dir.join("tiny").join(format!("{name}.gguf"));
    Some(Arc::new(
        Model::load(&path).unwrap_or_else(|e| panic!("{name}: {e}")),
    ))
}

fn session(
    model: &Arc<Model>,
    n_ctx: usize,
    n_slots: usize,
    max_batch: usize,
    threads: usize,
) -> Session<CpuBackend> {
    let backend = CpuBackend::new(
        model.clone(),
        CpuOptions {
            n_ctx,
            n_slots,
            max_batch,
            threads,
        },
    )
    .expect("backend");
    Session::new(backend, model.config.n_vocab)
}

/// Random ids of ordinary tokens (past the specials and byte tokens of the tiny vocabularies).
fn random_tokens(model: &Model, len: usize, seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n_vocab = model.config.n_vocab as u32;
    (0..len).map(|_| rng.random_range(260..n_vocab)).collect()
}

fn last(s: &mut Session<CpuBackend>, slot: usize, tokens: &[u32]) -> Vec<f32> {
    s.eval(slot, tokens, Logits::Last).expect("eval").to_vec()
}

// ---------------------------------------------------------------------------------------------
// Rollback and prefix reuse

#[test]
fn rollback_then_continue_matches_a_fresh_session() {
    for name in MODELS {
        let Some(model) = tiny(name) else { return };
        let a = random_tokens(&model, 21, 1);
        let b = random_tokens(&model, 13, 2);
        let mut c = random_tokens(&model, 9, 3);
        c[0] = if b[0] == 300 { 301 } else { 300 };

        let mut s = session(&model, 64, 1, 64, 2);
        s.eval(0, &[a.clone(), b.clone()].concat(), Logits::None)
            .unwrap();
        assert_eq!(s.tokens(0).len(), a.len() + b.len());
        s.truncate(0, a.len()).unwrap();
        assert_eq!(s.tokens(0), &a[..]);
        let rolled = last(&mut s, 0, &c);
        assert_eq!(s.tokens(0), &[a.clone(), c.clone()].concat()[..]);

        // The same tokens without the detour, in the same passes and in one.
        let mut fresh = session(&model, 64, 1, 64, 2);
        fresh.eval(0, &a, Logits::None).unwrap();
        let want = last(&mut fresh, 0, &c);
        assert!(
            rolled == want,
            "{name}: rollback differs from a fresh session"
        );
        let mut one = session(&model, 64, 1, 64, 2);
        let want = last(&mut one, 0, &[a.clone(), c.clone()].concat());
        assert!(
            rolled == want,
            "{name}: rollback differs from one pass over A+C"
        );
    }
}

#[test]
fn rollback_in_token_by_token_decode_is_exact() {
    // Speculative decoding's pattern: decode, reject the last k tokens, decode others.
    for name in MODELS {
        let Some(model) = tiny(name) else { return };
        let prompt = random_tokens(&model, 11, 4);
        let draft = random_tokens(&model, 6, 5);
        let accepted = random_tokens(&model, 6, 6);
        let mut s = session(&model, 64, 1, 1, 2);
        s.eval(0, &prompt, Logits::None).unwrap();
        for &t in &draft {
            s.eval(0, &[t], Logits::Last).unwrap();
        }
        s.truncate(0, prompt.len() + 2).unwrap();
        let mut got = Vec::new();
        for &t in &accepted {
            got.push(last(&mut s, 0, &[t]));
        }
        let mut fresh = session(&model, 64, 1, 1, 2);
        fresh.eval(0, &prompt, Logits::None).unwrap();
        fresh.eval(0, &draft[..2], Logits::None).unwrap();
        for (i, &t) in accepted.iter().enumerate() {
            let want = last(&mut fresh, 0, &[t]);
            assert_eq!(got[i], want, "{name}: step {i} after rollback");
        }
    }
}

#[test]
fn reuse_prefix_keeps_the_shared_prefix_and_the_last_prompt_token_for_evaluation() {
    let Some(model) = tiny("qwen3") else { return };
    let a = random_tokens(&model, 15, 7);
    let mut b = random_tokens(&model, 8, 8);
    let mut c = random_tokens(&model, 5, 9);
    b[0] = 400;
    c[0] = 401;
    let ab = [a.clone(), b.clone()].concat();
    let ac = [a.clone(), c.clone()].concat();
    let mut s = session(&model, 64, 2, 64, 2);

    // An empty slot shares nothing.
    assert_eq!(s.reuse_prefix(0, &ab).unwrap(), 0);
    s.eval(0, &ab, Logits::None).unwrap();

    // A diverging prompt keeps the common prefix only.
    assert_eq!(s.reuse_prefix(0, &ac).unwrap(), a.len());
    assert_eq!(s.tokens(0), &a[..]);
    let reused = last(&mut s, 0, &c);
    let mut fresh = session(&model, 64, 1, 64, 2);
    fresh.eval(0, &a, Logits::None).unwrap();
    let want = last(&mut fresh, 0, &c);
    assert!(reused == want, "logits after reuse differ");

    // A prompt equal to the cached tokens, or a prefix of them, gives back its last token so
    // the caller gets fresh logits for it.
    assert_eq!(s.reuse_prefix(0, &ac).unwrap(), ac.len() - 1);
    assert_eq!(s.tokens(0), &ac[..ac.len() - 1]);
    s.eval(0, &ac[ac.len() - 1..], Logits::Last).unwrap();
    assert_eq!(s.reuse_prefix(0, &a).unwrap(), a.len() - 1);
    assert_eq!(s.tokens(0), &a[..a.len() - 1]);

    // A longer prompt that extends the cache keeps all of it.
    s.eval(0, &a[a.len() - 1..], Logits::None).unwrap();
    assert_eq!(s.reuse_prefix(0, &ab).unwrap(), a.len());
    assert_eq!(s.tokens(0), &a[..]);

    // Other slots are untouched, and a missing slot is refused.
    assert!(s.tokens(1).is_empty());
    assert!(matches!(
        s.reuse_prefix(2, &a),
        Err(EngineError::BadSlot {
            slot: 2,
            n_slots: 2
        })
    ));
    assert_eq!(s.tokens(0), &a[..]);
}

// ---------------------------------------------------------------------------------------------
// Slots, batched decode, chunking, threads

#[test]
fn slots_are_independent() {
    for name in MODELS {
        let Some(model) = tiny(name) else { return };
        let x = random_tokens(&model, 30, 10);
        let y = random_tokens(&model, 30, 11);
        // Both sequences alone, each on slot 0 of its own session.
        let alone = |seq: &[u32]| {
            let mut s = session(&model, 64, 1, 64, 2);
            let mut out = vec![last(&mut s, 0, &seq[..12])];
            out.extend(seq[12..].iter().map(|&t| last(&mut s, 0, &[t])));
            out
        };
        let (want_x, want_y) = (alone(&x), alone(&y));
        // Interleaved on slots 0 and 1 of one session: prefill, then alternate decode steps.
        let mut s = session(&model, 64, 2, 64, 2);
        let mut got_x = vec![last(&mut s, 0, &x[..12])];
        let mut got_y = vec![last(&mut s, 1, &y[..12])];
        for i in 12..30 {
            got_y.push(last(&mut s, 1, &[y[i]]));
            got_x.push(last(&mut s, 0, &[x[i]]));
        }
        assert_eq!(s.tokens(0), &x[..]);
        assert_eq!(s.tokens(1), &y[..]);
        for i in 0..want_x.len() {
            assert_eq!(got_x[i], want_x[i], "{name}: slot 0 step {i}");
            assert_eq!(got_y[i], want_y[i], "{name}: slot 1 step {i}");
        }
        // Clearing one slot leaves the other's cache intact.
        s.clear(1).unwrap();
        s.eval(1, &x[..5], Logits::None).unwrap();
        s.truncate(0, 29).unwrap();
        let again = last(&mut s, 0, &x[29..]);
        assert_eq!(
            again,
            want_x[want_x.len() - 1],
            "{name}: slot 0 after reusing slot 1"
        );
    }
}

#[test]
fn decode_many_matches_one_token_per_slot() {
    for name in MODELS {
        let Some(model) = tiny(name) else { return };
        let n_vocab = model.config.n_vocab;
        let prompts = [
            random_tokens(&model, 5, 12),
            random_tokens(&model, 17, 13),
            random_tokens(&model, 40, 14),
        ];
        let mut batched = session(&model, 64, 3, 8, 2);
        let mut single = session(&model, 64, 3, 8, 2);
        let mut next = Vec::new();
        for (slot, p) in prompts.iter().enumerate() {
            batched.eval(slot, p, Logits::None).unwrap();
            next.push(last(&mut single, slot, p));
        }
        let mut toks: Vec<u32> = next.iter().map(|l| argmax(l)).collect();
        for step in 0..6 {
            // Slots in a shuffled order: logits come back in the order asked.
            let order = [[0usize, 1, 2], [2, 0, 1], [1, 2, 0]][step % 3];
            let steps: Vec<(usize, u32)> = order.iter().map(|&s| (s, toks[s])).collect();
            let got = batched.decode_many(&steps).unwrap().to_vec();
            assert_eq!(got.len(), 3 * n_vocab);
            for (k, &slot) in order.iter().enumerate() {
                let want = last(&mut single, slot, &[toks[slot]]);
                let row = &got[k * n_vocab..(k + 1) * n_vocab];
                assert!(row == want, "{name}: step {step} slot {slot}");
                toks[slot] = argmax(&want);
            }
        }
        for slot in 0..3 {
            assert_eq!(
                batched.tokens(slot),
                single.tokens(slot),
                "{name}: slot {slot}"
            );
        }
    }
}

#[test]
fn decode_many_refuses_bad_steps_without_changing_any_slot() {
    let Some(model) = tiny("llama") else { return };
    let n_vocab = model.config.n_vocab as u32;
    let mut s = session(&model, 8, 3, 2, 2);
    s.eval(0, &[300; 3], Logits::None).unwrap();
    s.eval(1, &[301; 8], Logits::None).unwrap();
    let before: Vec<Vec<u32>> = (0..3).map(|i| s.tokens(i).to_vec()).collect();
    let bad: [(&[(usize, u32)], &str); 6] = [
        (&[], "no steps"),
        (&[(0, 300), (2, 300), (1, 300)], "more steps than the batch"),
        (&[(0, 300), (0, 301)], "a slot twice"),
        (&[(0, 300), (1, 300)], "a full slot"),
        (&[(2, 300), (0, n_vocab)], "a bad token"),
        (&[(0, 300), (3, 300)], "a missing slot"),
    ];
    for (steps, what) in bad {
        let err = s.decode_many(steps).expect_err(what);
        match what {
            "a full slot" => assert!(
                matches!(err, EngineError::ContextFull { slot: 1, .. }),
                "{err}"
            ),
            "a bad token" => assert!(matches!(err, EngineError::BadToken { .. }), "{err}"),
            "a missing slot" => {
                assert!(matches!(err, EngineError::BadSlot { slot: 3, .. }), "{err}")
            }
            _ => assert!(matches!(err, EngineError::BadBatch(_)), "{what}: {err}"),
        }
        for (i, b) in before.iter().enumerate() {
            assert_eq!(s.tokens(i), &b[..], "{what}: slot {i} changed");
        }
    }
    // The session still works.
    assert_eq!(
        s.decode_many(&[(2, 302), (0, 303)]).unwrap().len(),
        2 * n_vocab as usize
    );
}

/// A step whose draws do not match its parts, or ask for a device draw of a backend without
/// one, is refused before any work; with every token left to the caller it gives `step`'s
/// logits.
#[test]
fn step_drawing_refuses_draws_it_cannot_make() {
    let Some(model) = tiny("llama") else { return };
    let mut s = session(&model, 16, 2, 4, 2);
    let mut reference = session(&model, 16, 2, 4, 2);
    for sess in [&mut s, &mut reference] {
        sess.eval(0, &[300, 301], Logits::None).unwrap();
        sess.eval(1, &[302], Logits::None).unwrap();
    }
    let parts = |a: &'static [u32], b: &'static [u32]| {
        [
            Part {
                slot: 0,
                tokens: a,
                logits: true,
            },
            Part {
                slot: 1,
                tokens: b,
                logits: false,
            },
        ]
    };
    let params = SamplerParams::default();
    let before: Vec<Vec<u32>> = (0..2).map(|i| s.tokens(i).to_vec()).collect();
    for (draws, what) in [
        (&[][..], "no draw for the part asking for logits"),
        (&[None, None][..], "a draw for a part asking for none"),
        (&[Some(&params)][..], "a device draw on the CPU"),
    ] {
        let err = s
            .step_drawing(&parts(&[303], &[304]), draws)
            .expect_err(what);
        assert!(matches!(err, EngineError::BadBatch(_)), "{what}: {err}");
        for (i, b) in before.iter().enumerate() {
            assert_eq!(s.tokens(i), &b[..], "{what}: slot {i} changed");
        }
    }
    let drawn = s.step_drawing(&parts(&[303], &[304]), &[None]).unwrap();
    assert_eq!(drawn.tokens, vec![None]);
    let logits = drawn.logits.to_vec();
    assert_eq!(
        logits,
        reference.step(&parts(&[303], &[304])).unwrap().to_vec()
    );
    assert_eq!(s.tokens(0), &[300, 301, 303]);
    assert!(s.eval_drawn(0, &[305], &params).is_none());
    assert_eq!(s.tokens(0), &[300, 301, 303]);
}

fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32
}

#[test]
fn chunked_prefill_gives_the_same_logits() {
    for name in MODELS {
        let Some(model) = tiny(name) else { return };
        let n_vocab = model.config.n_vocab;
        let prompt = random_tokens(&model, 70, 15);
        let all = |max_batch: usize| {
            let mut out = Vec::new();
            session(&model, 80, 1, max_batch, 2)
                .eval_all(0, &prompt, max_batch, |_, row| out.extend_from_slice(row))
                .unwrap();
            out
        };
        let whole = all(70);
        let whole_last = &whole[69 * n_vocab..];
        for max_batch in [1, 3, 5, 9, 64] {
            let got = last(&mut session(&model, 80, 1, max_batch, 2), 0, &prompt);
            assert!(got == whole_last, "{name}: max_batch {max_batch}");
        }
        for max_batch in [1, 5] {
            let got = all(max_batch);
            for (i, (a, b)) in got.chunks(n_vocab).zip(whole.chunks(n_vocab)).enumerate() {
                assert!(a == b, "{name}: passes of {max_batch}, position {i}");
            }
        }
    }
}

#[test]
fn thread_counts_give_identical_logits() {
    // Threads split a product's output rows and attention's (token, head) pairs; each value
    // is still computed by one thread in one order, so the count must not change a bit.
    for name in MODELS {
        let Some(model) = tiny(name) else { return };
        let prompt = random_tokens(&model, 40, 16);
        let run = |threads| {
            let mut s = session(&model, 64, 1, 64, threads);
            let mut out = last(&mut s, 0, &prompt);
            out.extend(last(&mut s, 0, &[300]));
            out
        };
        let one = run(1);
        for threads in [2, 3] {
            assert!(
                run(threads) == one,
                "{name}: {threads} threads differ from 1"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Refusals

#[test]
fn context_overflow_is_refused_and_leaves_the_slot_unchanged() {
    let Some(model) = tiny("gemma3_swa8") else {
        return;
    };
    let tokens = random_tokens(&model, 20, 17);
    let mut s = session(&model, 16, 2, 4, 2);
    s.eval(0, &tokens[..10], Logits::None).unwrap();
    let err = s.eval(0, &tokens[10..17], Logits::Last).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::ContextFull {
                slot: 0,
                have: 10,
                adding: 7,
                n_ctx: 16
            }
        ),
        "{err}"
    );
    assert_eq!(s.tokens(0), &tokens[..10]);
    // Filling exactly to the context works, one more token does not.
    let full = last(&mut s, 0, &tokens[10..16]);
    assert_eq!(s.tokens(0).len(), 16);
    assert!(matches!(
        s.eval(0, &tokens[16..17], Logits::Last),
        Err(EngineError::ContextFull {
            have: 16,
            adding: 1,
            ..
        })
    ));
    assert!(matches!(
        s.eval_all(0, &tokens[16..17], 4, |_, _| panic!("no logits expected")),
        Err(EngineError::ContextFull { .. })
    ));
    assert!(matches!(
        s.decode_many(&[(0, tokens[16])]),
        Err(EngineError::ContextFull { .. })
    ));
    assert_eq!(s.tokens(0), &tokens[..16]);
    // The failed calls did not disturb the cache: the last position evaluates as before.
    s.truncate(0, 15).unwrap();
    assert_eq!(last(&mut s, 0, &tokens[15..16]), full);
    // A prompt longer than the whole context is refused outright.
    assert!(matches!(
        s.eval(1, &tokens[..17], Logits::Last),
        Err(EngineError::ContextFull {
            have: 0,
            adding: 17,
            ..
        })
    ));
    assert!(s.tokens(1).is_empty());
}

#[test]
fn bad_tokens_slots_and_empty_input_are_refused() {
    let Some(model) = tiny("qwen3") else { return };
    let n_vocab = model.config.n_vocab;
    let prompt = random_tokens(&model, 6, 18);
    let mut s = session(&model, 32, 2, 8, 2);
    let want = last(&mut s, 0, &prompt);

    let err = s
        .eval(0, &[300, n_vocab as u32, 301], Logits::Last)
        .unwrap_err();
    assert!(
        matches!(err, EngineError::BadToken { id, n_vocab: n } if id == n_vocab as u32 && n == n_vocab),
        "{err}"
    );
    assert!(err.to_string().contains(&n_vocab.to_string()), "{err}");
    assert!(matches!(
        s.eval(0, &[u32::MAX], Logits::None),
        Err(EngineError::BadToken { id: u32::MAX, .. })
    ));
    assert!(matches!(
        s.eval_all(0, &[300, u32::MAX], 8, |_, _| panic!("no logits expected")),
        Err(EngineError::BadToken { .. })
    ));
    assert!(matches!(
        s.eval(2, &prompt, Logits::Last),
        Err(EngineError::BadSlot {
            slot: 2,
            n_slots: 2
        })
    ));
    assert!(matches!(
        s.eval(usize::MAX, &prompt, Logits::Last),
        Err(EngineError::BadSlot { .. })
    ));
    assert!(matches!(
        s.truncate(5, 0),
        Err(EngineError::BadSlot { slot: 5, .. })
    ));
    assert!(matches!(s.clear(2), Err(EngineError::BadSlot { .. })));
    assert!(s.tokens(7).is_empty());
    assert!(matches!(
        s.eval(0, &[], Logits::Last),
        Err(EngineError::BadBatch(_))
    ));
    assert!(matches!(
        s.eval(0, &[], Logits::None),
        Err(EngineError::BadBatch(_))
    ));

    // Nothing changed: the slot still holds the prompt and continues as a fresh one would.
    assert_eq!(s.tokens(0), &prompt[..]);
    assert!(s.tokens(1).is_empty());
    s.truncate(0, prompt.len() - 1).unwrap();
    assert_eq!(
        last(&mut s, 0, &prompt[prompt.len() - 1..]).len(),
        want.len()
    );
    // Truncating past the end is a no-op.
    s.truncate(0, 1000).unwrap();
    assert_eq!(s.tokens(0), &prompt[..]);
}

#[test]
fn backend_refuses_malformed_batches() {
    let Some(model) = tiny("llama") else { return };
    let n_vocab = model.config.n_vocab as u32;
    let opts = |n_ctx, n_slots, max_batch, threads| CpuOptions {
        n_ctx,
        n_slots,
        max_batch,
        threads,
    };
    for bad in [
        opts(0, 1, 1, 1),
        opts(8, 0, 1, 1),
        opts(8, 1, 0, 1),
        opts(8, 1, 1, 0),
    ] {
        assert!(CpuBackend::new(model.clone(), bad).is_err());
    }
    // A cache whose size overflows is refused, not allocated.
    assert!(CpuBackend::new(model.clone(), opts(usize::MAX / 2, 4, 1, 1)).is_err());

    let mut b = CpuBackend::new(model.clone(), opts(8, 2, 4, 2)).unwrap();
    let batch = |tokens, positions, slots, outputs| Batch {
        tokens,
        positions,
        slots,
        outputs,
    };
    // `&[n_vocab]` would be a temporary (`n_vocab` is not a constant): the batches borrow it.
    let bad_token = [n_vocab];
    let malformed = [
        ("empty", batch(&[], &[], &[], &[])),
        (
            "over max_batch",
            batch(&[300; 5], &[0, 1, 2, 3, 4], &[0; 5], &[4]),
        ),
        ("positions short", batch(&[300, 301], &[0], &[0, 0], &[1])),
        ("slots short", batch(&[300, 301], &[0, 1], &[0], &[1])),
        ("token", batch(&bad_token, &[0], &[0], &[0])),
        ("slot", batch(&[300], &[0], &[2], &[0])),
        ("position", batch(&[300], &[8], &[0], &[0])),
        (
            "outputs descending",
            batch(&[300, 301], &[0, 1], &[0, 0], &[1, 0]),
        ),
        (
            "outputs repeated",
            batch(&[300, 301], &[0, 1], &[0, 0], &[1, 1]),
        ),
        (
            "output out of range",
            batch(&[300, 301], &[0, 1], &[0, 0], &[2]),
        ),
    ];
    for (what, bad) in malformed {
        let err = b.forward(&bad).expect_err(what);
        match what {
            "token" => assert!(matches!(err, EngineError::BadToken { .. }), "{err}"),
            "slot" => assert!(matches!(err, EngineError::BadSlot { slot: 2, .. }), "{err}"),
            _ => assert!(matches!(err, EngineError::BadBatch(_)), "{what}: {err}"),
        }
    }
    // A valid batch still runs afterwards; no outputs gives no logits.
    b.forward(&batch(&[300, 301], &[0, 1], &[0, 0], &[0, 1]))
        .unwrap();
    assert_eq!(b.logits().unwrap().len(), 2 * n_vocab as usize);
    b.forward(&batch(&[302], &[2], &[0], &[])).unwrap();
    assert!(b.logits().unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------------
// The decode loop

fn params(max_tokens: Option<usize>, sampler: SamplerParams, stop: &[String]) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampler,
        stop: stop.to_vec(),
        // Random weights can pick the end-of-sequence token at any time.
        ignore_eos: true,
    }
}

/// Generates on a cleared slot and returns the output with every piece of text passed on.
fn run(
    s: &mut Session<CpuBackend>,
    model: &Model,
    prompt: &[u32],
    p: &GenerateParams,
) -> (GenerateOutput, Vec<String>) {
    s.clear(0).unwrap();
    let mut pieces = Vec::new();
    let out = generate(s, 0, &model.tokenizer, prompt, p, |t| {
        pieces.push(t.to_owned());
        true
    })
    .expect("generate");
    (out, pieces)
}

#[test]
fn generate_respects_max_tokens_and_stop_strings() {
    let Some(model) = tiny("llama") else { return };
    let prompt = random_tokens(&model, 8, 19);
    let mut s = session(&model, 128, 1, 16, 2);
    let greedy = params(Some(40), SamplerParams::greedy(), &[]);
    let (first, pieces) = run(&mut s, &model, &prompt, &greedy);
    assert_eq!(first.tokens.len(), 40);
    assert_eq!(first.reason, StopReason::MaxTokens);
    assert_eq!(first.prompt_tokens, prompt.len());
    // Every generated token went through the cache, the last one included.
    assert_eq!(
        s.tokens(0),
        &[prompt.clone(), first.tokens.clone()].concat()[..]
    );
    let text: String = pieces.concat();
    eprintln!("greedy continuation: {text:?}");

    // A limit of zero generates nothing.
    let (none, _) = run(
        &mut s,
        &model,
        &prompt,
        &params(Some(0), SamplerParams::greedy(), &[]),
    );
    assert!(none.tokens.is_empty());
    assert_eq!(none.reason, StopReason::MaxTokens);

    // A stop string taken from the middle of the continuation: generation ends at its first
    // occurrence and none of it reaches the caller.
    let chars: Vec<char> = text.chars().collect();
    let from = chars.len() / 2;
    let stop: String = chars[from..(from + 3).min(chars.len())].iter().collect();
    assert!(
        !stop.trim().is_empty(),
        "continuation too short for a stop string: {text:?}"
    );
    let at = text.find(&stop).unwrap();
    let (second, pieces2) = run(
        &mut s,
        &model,
        &prompt,
        &params(
            Some(40),
            SamplerParams::greedy(),
            std::slice::from_ref(&stop),
        ),
    );
    assert_eq!(
        second.reason,
        StopReason::StopString,
        "stop {stop:?} in {text:?}"
    );
    let seen: String = pieces2.concat();
    assert_eq!(seen, text[..at], "stop {stop:?}");
    assert!(!seen.contains(&stop));
    assert!(second.tokens.len() < first.tokens.len());
    assert_eq!(second.tokens[..], first.tokens[..second.tokens.len()]);

    // Generating again from the same prompt on the same slot reuses all but its last token,
    // which a pass of its own then evaluates to the same logits: the same continuation.
    let third = generate(&mut s, 0, &model.tokenizer, &prompt, &greedy, |_| true).unwrap();
    assert_eq!(third.reused, prompt.len() - 1);
    assert_eq!(third.tokens, first.tokens);
    assert_eq!(
        s.tokens(0),
        &[prompt.clone(), third.tokens.clone()].concat()[..]
    );

    // The caller can cancel.
    let mut calls = 0;
    s.clear(0).unwrap();
    let cancelled = generate(&mut s, 0, &model.tokenizer, &prompt, &greedy, |_| {
        calls += 1;
        calls < 3
    })
    .unwrap();
    assert_eq!(cancelled.reason, StopReason::Cancelled);
    assert_eq!(calls, 3);
    assert!(cancelled.tokens.len() < 40);

    // An empty prompt is an error, not a panic.
    assert!(generate(&mut s, 0, &model.tokenizer, &[], &greedy, |_| true).is_err());
}

#[test]
fn generate_stops_at_a_full_context() {
    let Some(model) = tiny("qwen3") else { return };
    let prompt = random_tokens(&model, 8, 20);
    let mut s = session(&model, 12, 1, 16, 2);
    let (out, _) = run(
        &mut s,
        &model,
        &prompt,
        &params(None, SamplerParams::greedy(), &[]),
    );
    assert_eq!(out.reason, StopReason::ContextFull);
    // Four tokens fill the cache; the fifth is sampled from the last position's logits.
    assert_eq!(out.tokens.len(), 12 - prompt.len() + 1);
    assert_eq!(s.tokens(0).len(), 12);
    // A prompt as long as the context leaves room for exactly one sampled token.
    let long = random_tokens(&model, 12, 21);
    let (out, _) = run(
        &mut s,
        &model,
        &long,
        &params(None, SamplerParams::greedy(), &[]),
    );
    assert_eq!((out.reason, out.tokens.len()), (StopReason::ContextFull, 1));
    // One longer than the context is refused.
    let longer = random_tokens(&model, 13, 22);
    s.clear(0).unwrap();
    let err = generate(
        &mut s,
        0,
        &model.tokenizer,
        &longer,
        &params(None, SamplerParams::greedy(), &[]),
        |_| true,
    )
    .unwrap_err();
    assert!(matches!(err, EngineError::ContextFull { .. }), "{err}");
}

#[test]
fn sampling_is_reproducible_per_seed() {
    // Random weights spread the logits by a few units, so at temperature 0.8 several tokens
    // stay in play at every step and different seeds part ways within a few tokens.
    let Some(model) = tiny("llama") else { return };
    let prompt = random_tokens(&model, 8, 23);
    let mut s = session(&model, 64, 1, 16, 2);
    let seeded = |seed| SamplerParams {
        temperature: 0.8,
        seed,
        ..SamplerParams::default()
    };
    let tokens = |s: &mut Session<CpuBackend>, seed| {
        run(s, &model, &prompt, &params(Some(24), seeded(seed), &[]))
            .0
            .tokens
    };
    let a = tokens(&mut s, 42);
    let b = tokens(&mut s, 42);
    assert_eq!(a, b, "the same seed gave different tokens");
    let others: Vec<Vec<u32>> = (1..=3).map(|seed| tokens(&mut s, seed)).collect();
    for (i, o) in others.iter().enumerate() {
        assert_ne!(&a, o, "seeds 42 and {} gave the same 24 tokens", i + 1);
    }
    let greedy = run(
        &mut s,
        &model,
        &prompt,
        &params(Some(24), SamplerParams::greedy(), &[]),
    )
    .0
    .tokens;
    assert_ne!(a, greedy, "temperature 0.8 sampled the greedy path");
}
