//! The continuous-batching scheduler on the CPU backend, over the small synthetic models of
//! `scripts/ref/tiny_models.py` (`$AKUNU_REFDATA/engine/tiny`): sequences that share passes
//! get exactly the tokens they get alone, cancelled sequences free their slot, finished ones
//! leave their tokens for prefix reuse, and every refusal happens at submission.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use akunu_core::batch::{Listener, Scheduler, SeqEvent, SeqRequest, SeqSummary, SubmitError};
use akunu_core::generate::{generate, GenerateParams, StopReason};
use akunu_core::sampling::SamplerParams;
use akunu_core::{Model, Session};
use akunu_cpu::{CpuBackend, CpuOptions};

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
) -> Session<CpuBackend> {
    let backend = CpuBackend::new(
        model.clone(),
        CpuOptions {
            n_ctx,
            n_slots,
            max_batch,
            threads: 2,
        },
    )
    .expect("backend");
    Session::new(backend, model.config.n_vocab)
}

/// Pseudo-random ordinary token ids (past the specials and byte tokens).
fn tokens(model: &Model, len: usize, seed: u64) -> Vec<u32> {
    let n_vocab = model.config.n_vocab as u64;
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (300 + (state >> 33) % (n_vocab - 300)) as u32
        })
        .collect()
}

fn params(max_tokens: usize, sampler: SamplerParams) -> GenerateParams {
    GenerateParams {
        max_tokens: Some(max_tokens),
        sampler,
        stop: Vec::new(),
        ignore_eos: true,
    }
}

/// Records a sequence's events; `cancel` makes it report that its receiver left.
#[derive(Clone, Default)]
struct Recorder {
    events: Arc<Mutex<Vec<SeqEvent>>>,
    cancel: Arc<AtomicBool>,
}

impl Listener for Recorder {
    fn send(&mut self, event: SeqEvent) -> bool {
        self.events.lock().unwrap().push(event);
        !self.cancel.load(Ordering::Relaxed)
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

impl Recorder {
    fn tokens(&self) -> Vec<u32> {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .flat_map(|e| match e {
                SeqEvent::Delta { tokens, .. } => tokens.iter().map(|t| t.id).collect(),
                _ => Vec::new(),
            })
            .collect()
    }

    fn text(&self) -> String {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .filter_map(|e| match e {
                SeqEvent::Delta { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    fn summary(&self) -> Option<SeqSummary> {
        let events = self.events.lock().unwrap();
        events.iter().find_map(|e| match e {
            SeqEvent::Finished(s) => Some(s.clone()),
            SeqEvent::Failed(why) => panic!("sequence failed: {why}"),
            _ => None,
        })
    }
}

fn run_until_idle<B: akunu_core::Backend>(s: &mut Scheduler<'_, B>) -> usize {
    let mut passes = 0;
    while !s.is_idle() {
        s.step();
        passes += 1;
        assert!(passes < 10_000, "the scheduler does not finish");
    }
    passes
}

/// What `generate` alone gives for a prompt, in a fresh single-slot session.
fn alone(
    model: &Arc<Model>,
    prompt: &[u32],
    p: &GenerateParams,
    max_batch: usize,
) -> (Vec<u32>, String) {
    let mut s = session(model, 256, 1, max_batch);
    let mut text = String::new();
    let out = generate(&mut s, 0, &model.tokenizer, prompt, p, |t| {
        text.push_str(t);
        true
    })
    .expect("generate");
    (out.tokens, text)
}

#[test]
fn batched_sequences_get_the_tokens_they_get_alone() {
    for name in ["llama", "qwen3", "gemma3_swa8"] {
        let Some(model) = tiny(name) else { return };
        // Prompts of several lengths, one longer than a pass so it is prefilled in chunks
        // beside the others' decoding; greedy and seeded sampling.
        let cases: Vec<(Vec<u32>, GenerateParams)> = (0..7)
            .map(|i| {
                let len = [3, 17, 40, 9, 1, 70, 25][i];
                let sampler = if i % 2 == 0 {
                    SamplerParams::greedy()
                } else {
                    SamplerParams {
                        seed: 1000 + i as u64,
                        ..SamplerParams::default()
                    }
                };
                (tokens(&model, len, i as u64 + 1), params(12 + i, sampler))
            })
            .collect();
        let mut sched = Scheduler::new(session(&model, 256, 4, 32), &model.tokenizer).unwrap();
        let recorders: Vec<Recorder> = cases.iter().map(|_| Recorder::default()).collect();
        for ((prompt, p), r) in cases.iter().zip(&recorders) {
            sched
                .submit(
                    SeqRequest {
                        prompt: prompt.clone(),
                        params: p.clone(),
                        logprobs: None,
                    },
                    Box::new(r.clone()),
                )
                .unwrap();
        }
        let passes = run_until_idle(&mut sched);
        let solo_passes: usize = cases
            .iter()
            .map(|(pr, p)| pr.len().div_ceil(32) + p.max_tokens.unwrap())
            .sum();
        assert!(passes < solo_passes, "{name}: {passes} passes, no batching");
        for (i, ((prompt, p), r)) in cases.iter().zip(&recorders).enumerate() {
            let (want, want_text) = alone(&model, prompt, p, 32);
            assert_eq!(
                r.tokens(),
                want,
                "{name}: sequence {i} differs from its solo run"
            );
            assert_eq!(r.text(), want_text, "{name}: sequence {i} text");
            let s = r.summary().expect("finished");
            assert_eq!(s.reason, StopReason::MaxTokens);
            assert_eq!(s.completion_tokens, want.len());
            assert_eq!(s.prompt_tokens, prompt.len());
        }
    }
}

#[test]
fn cancelled_sequences_free_their_slot() {
    let Some(model) = tiny("qwen3") else { return };
    let mut sched = Scheduler::new(session(&model, 256, 1, 32), &model.tokenizer).unwrap();
    let (a, b) = (Recorder::default(), Recorder::default());
    let req = |seed| SeqRequest {
        prompt: tokens(&model, 8, seed),
        params: params(200, SamplerParams::greedy()),
        logprobs: None,
    };
    sched.submit(req(1), Box::new(a.clone())).unwrap();
    sched.submit(req(2), Box::new(b.clone())).unwrap();
    for _ in 0..5 {
        sched.step();
    }
    assert_eq!((sched.active(), sched.waiting()), (1, 1));
    assert!(!a.tokens().is_empty() && b.tokens().is_empty());
    a.cancel.store(true, Ordering::Relaxed);
    sched.step();
    assert_eq!(
        (sched.active(), sched.waiting()),
        (1, 0),
        "b takes the freed slot"
    );
    run_until_idle(&mut sched);
    assert_eq!(b.summary().unwrap().completion_tokens, 200);
    assert!(
        a.summary().is_none(),
        "a cancelled sequence gets no summary"
    );
}

#[test]
fn a_finished_sequence_leaves_its_prefix_for_the_next() {
    let Some(model) = tiny("llama") else { return };
    let mut sched = Scheduler::new(session(&model, 256, 2, 32), &model.tokenizer).unwrap();
    let system = tokens(&model, 30, 7);
    let with = |tail: u64| [system.clone(), tokens(&model, 5, tail)].concat();
    let first = Recorder::default();
    let p = params(4, SamplerParams::greedy());
    sched
        .submit(
            SeqRequest {
                prompt: with(1),
                params: p.clone(),
                logprobs: None,
            },
            Box::new(first.clone()),
        )
        .unwrap();
    run_until_idle(&mut sched);
    assert_eq!(first.summary().unwrap().reused, 0);
    let second = Recorder::default();
    let prompt = with(2);
    sched
        .submit(
            SeqRequest {
                prompt: prompt.clone(),
                params: p.clone(),
                logprobs: None,
            },
            Box::new(second.clone()),
        )
        .unwrap();
    run_until_idle(&mut sched);
    assert_eq!(
        second.summary().unwrap().reused,
        30,
        "the shared system prompt is reused"
    );
    assert_eq!(second.tokens(), alone(&model, &prompt, &p, 32).0);
}

#[test]
fn refusals_happen_at_submission() {
    let Some(model) = tiny("llama") else { return };
    let mut sched = Scheduler::new(session(&model, 64, 2, 16), &model.tokenizer).unwrap();
    let submit = |s: &mut Scheduler<'_, CpuBackend>, prompt: Vec<u32>, max: usize, lp| {
        s.submit(
            SeqRequest {
                prompt,
                params: params(max, SamplerParams::greedy()),
                logprobs: lp,
            },
            Box::new(Recorder::default()),
        )
    };
    assert_eq!(
        submit(&mut sched, vec![], 4, None),
        Err(SubmitError::EmptyPrompt)
    );
    assert_eq!(
        submit(&mut sched, tokens(&model, 64, 1), 1, None),
        Err(SubmitError::PromptTooLong {
            prompt: 64,
            n_ctx: 64
        })
    );
    assert_eq!(
        submit(&mut sched, tokens(&model, 60, 1), 5, None),
        Err(SubmitError::ContextExceeded {
            prompt: 60,
            max_tokens: 5,
            n_ctx: 64
        })
    );
    assert_eq!(
        submit(&mut sched, tokens(&model, 60, 1), usize::MAX, None),
        Err(SubmitError::ContextExceeded {
            prompt: 60,
            max_tokens: usize::MAX,
            n_ctx: 64
        })
    );
    let n_vocab = model.config.n_vocab;
    assert_eq!(
        submit(&mut sched, vec![1, n_vocab as u32], 4, None),
        Err(SubmitError::BadToken {
            id: n_vocab as u32,
            n_vocab
        })
    );
    assert_eq!(
        submit(&mut sched, vec![1, 2], 4, Some(21)),
        Err(SubmitError::TooManyLogprobs(21))
    );
    assert!(sched.is_idle(), "nothing refused was queued");
    assert!(
        Scheduler::new(session(&model, 64, 4, 2), &model.tokenizer).is_err(),
        "4 slots need a batch of 4"
    );
}

#[test]
fn a_sequence_stops_when_the_context_is_full() {
    let Some(model) = tiny("gemma2") else { return };
    let mut sched = Scheduler::new(session(&model, 32, 1, 16), &model.tokenizer).unwrap();
    let r = Recorder::default();
    let mut p = params(0, SamplerParams::greedy());
    p.max_tokens = None;
    sched
        .submit(
            SeqRequest {
                prompt: tokens(&model, 20, 3),
                params: p,
                logprobs: None,
            },
            Box::new(r.clone()),
        )
        .unwrap();
    run_until_idle(&mut sched);
    let s = r.summary().unwrap();
    assert_eq!(s.reason, StopReason::ContextFull);
    // Prompt and completion fill the context exactly: 20 + 12 = 32.
    assert_eq!(s.completion_tokens, 12);
}

#[test]
fn zero_max_tokens_and_logprobs() {
    let Some(model) = tiny("qwen2") else { return };
    let mut sched = Scheduler::new(session(&model, 128, 2, 16), &model.tokenizer).unwrap();
    let (none, lp) = (Recorder::default(), Recorder::default());
    sched
        .submit(
            SeqRequest {
                prompt: tokens(&model, 5, 1),
                params: params(0, SamplerParams::greedy()),
                logprobs: None,
            },
            Box::new(none.clone()),
        )
        .unwrap();
    sched
        .submit(
            SeqRequest {
                prompt: tokens(&model, 5, 2),
                params: params(6, SamplerParams::greedy()),
                logprobs: Some(3),
            },
            Box::new(lp.clone()),
        )
        .unwrap();
    run_until_idle(&mut sched);
    let s = none.summary().unwrap();
    assert_eq!((s.reason, s.completion_tokens), (StopReason::MaxTokens, 0));
    let events = lp.events.lock().unwrap();
    let mut n = 0;
    for e in events.iter() {
        if let SeqEvent::Delta { tokens, .. } = e {
            for t in tokens {
                let l = t.logprob.as_ref().expect("logprobs were asked for");
                assert_eq!(l.top.len(), 3);
                // Greedy picks the most likely token, so it heads the list.
                assert_eq!(l.top[0].0, t.id);
                assert_eq!(l.top[0].1, l.logprob);
                assert!(l.top.windows(2).all(|w| w[0].1 >= w[1].1));
                assert!(l.logprob <= 0.0);
                n += 1;
            }
        }
    }
    assert_eq!(n, 6);
}
