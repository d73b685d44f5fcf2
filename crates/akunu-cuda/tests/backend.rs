//! The whole forward pass on the GPU against the CPU backend, on the tiny models of every
//! family (`$AKUNU_REFDATA/engine/tiny`) and on any models listed in `$AKUNU_GPU_MODELS`
//! (colon-separated paths: the default model, the synthetic benchmark models).
//!
//! The tiny models read random token ids. Listed models with a real vocabulary read English
//! text, tokenized by their own tokenizer, as they would in use: on random ids a real model can
//! sit where its logits are ill-conditioned. Gemma 3 270M's logits move by 0.14 to 0.28 of their
//! spread between exact arithmetic and ideal int8 activations on random ids, and by 0.02 to
//! 0.03 on text (`scripts/ref/f64_forward.py`; `docs/perf/2026-11-22-activation-blocks.md`),
//! so only text leaves a bound that tells a defect from rounding.
//!
//! Checked: the logits of a prompt and of batched decode steps (several slots in one pass)
//! within the error that int8-quantized activations allow (the same metric and bound as the
//! CPU backend's comparison with llama.cpp: RMS error over the spread of the logits); 32
//! teacher-forced decode steps choosing the CPU's token wherever the CPU's choice is not a near
//! tie; device-side greedy chains equal to the host loop on the GPU, token for token; sampled
//! chains equal to the host loop with the CPU sampler where the draw is certain, and to
//! themselves however a generation is cut into chains where it is not; the scheduler's draws
//! on the device equal the CPU sampler's where certain, and a seed's tokens in chains where
//! not; passes of
//! every size from 1 to past the GEMV limit; the kernel modules a backend lists beforehand are
//! the ones it loads.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use akunu_core::batch::{Listener, Scheduler, SeqEvent, SeqRequest};
use akunu_core::generate::{generate, GenerateParams};
use akunu_core::sampling::{Sampler, SamplerParams};
use akunu_core::session::Logits;
use akunu_core::{Backend, Batch, Draw, Model, Session};
use akunu_cpu::{CpuBackend, CpuOptions};
use akunu_cuda::backend::{CudaBackend, CudaOptions};
use akunu_cuda::compile::ModuleKey;
use akunu_tokenizer::EncodeOptions;

/// English prose for the listed models' prompts (several hundred tokens in any vocabulary).
const TEXT: &str = "The harbour town woke slowly that winter. Before the sun had cleared the \
hills, the baker on Quay Street had lit his ovens, and the smell of bread drifted down to the \
boats, where fishermen were mending nets and arguing about the weather. Nobody agreed on \
anything in that town except that the sea was older than their quarrels. Mara, who kept the \
lighthouse accounts, walked along the sea wall with a ledger under her arm. She counted the \
gulls out of habit, as her father had done, and wrote the number in the margin beside the \
tides. Some mornings there were forty; some mornings there were none, and those were the days \
when storms came in from the west. The school bell rang at eight. Children ran past the \
chandler's shop, past the church with its crooked spire, and up the hill to the old stone \
schoolhouse, where Mr. Ellis taught arithmetic, geography and, when he was in a good mood, \
the names of the stars. He believed that a child who could find the Pole Star would never be \
entirely lost, and he said so every autumn, to every class, in exactly the same words. By \
noon the market square was full: apples from the inland farms, wool, copper pans, and a man \
who sold maps of places he had certainly never visited.";

/// A model under test and the token ids its prompts are cut from.
struct TestModel {
    name: String,
    model: Arc<Model>,
    /// `TEXT` tokenized (after BOS where the tokenizer adds one) for models with a real
    /// vocabulary; `None`: random ids.
    text: Option<Vec<u32>>,
}

impl TestModel {
    /// `len` prompt tokens: the text's first token (BOS where the tokenizer adds one) and a
    /// window of the rest, or random ids.
    fn prompt(&self, len: usize, seed: u64) -> Vec<u32> {
        let Some(text) = &self.text else {
            return random_ids(&self.model, len, seed);
        };
        let start = 1 + seed as usize % (text.len() - len);
        std::iter::once(text[0])
            .chain(text[start..start + len - 1].iter().copied())
            .collect()
    }

    /// A token to feed at decode step `i` of slot `slot`.
    fn token(&self, slot: usize, i: usize) -> u32 {
        match &self.text {
            Some(text) => text[1 + (40 * slot + i) % (text.len() - 1)],
            None => 300 + i as u32 * 4 + slot as u32,
        }
    }
}

fn models() -> Vec<TestModel> {
    let mut out = Vec::new();
    if let Some(dir) = akunu_testutil::refdata("engine") {
        for name in ["llama", "qwen3", "gemma3_swa8", "gemma2"] {
            let path = dir.join("tiny").join(format!("{name}.gguf"));
            let m = Model::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            out.push(TestModel {
                name: name.to_string(),
                model: Arc::new(m),
                text: None,
            });
        }
    }
    if let Ok(list) = std::env::var("AKUNU_GPU_MODELS") {
        for p in list.split(':').filter(|p| !p.is_empty()) {
            let m = Model::load(p).unwrap_or_else(|e| panic!("{p}: {e}"));
            let opts = EncodeOptions {
                add_special: true,
                parse_special: false,
            };
            let ids = m.tokenizer.encode(TEXT, opts);
            // The synthetic benchmark models' vocabularies spell English byte by byte: random
            // ids exercise them better.
            let text = (ids.len() < TEXT.len() / 2).then_some(ids);
            out.push(TestModel {
                name: p.to_string(),
                model: Arc::new(m),
                text,
            });
        }
    }
    out
}

fn cpu(model: &Arc<Model>, n_ctx: usize, n_slots: usize) -> Session<CpuBackend> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let b = CpuBackend::new(
        model.clone(),
        CpuOptions {
            n_ctx,
            n_slots,
            max_batch: 64,
            threads,
        },
    )
    .unwrap();
    Session::new(b, model.config.n_vocab)
}

fn gpu(
    g: &Arc<akunu_cuda::Gpu>,
    model: &Arc<Model>,
    n_ctx: usize,
    n_slots: usize,
) -> Session<CudaBackend> {
    let b = CudaBackend::new(
        g.clone(),
        model.clone(),
        CudaOptions {
            n_ctx,
            n_slots,
            max_batch: 64,
        },
    )
    .unwrap();
    Session::new(b, model.config.n_vocab)
}

fn random_ids(model: &Model, len: usize, seed: u64) -> Vec<u32> {
    let n_vocab = model.config.n_vocab as u32;
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            260 + (s % (n_vocab as u64 - 260)) as u32
        })
        .collect()
}

/// RMS of `a - b` over the RMS spread of `b` around its mean; infinite on NaN.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mean = b.iter().map(|&x| x as f64).sum::<f64>() / b.len() as f64;
    let (mut err, mut var) = (0.0f64, 0.0f64);
    for (&x, &r) in a.iter().zip(b) {
        if !x.is_finite() {
            return f64::INFINITY;
        }
        err += (x as f64 - r as f64).powi(2);
        var += (r as f64 - mean).powi(2);
    }
    (err / var.max(1e-300)).sqrt()
}

/// The largest logit minus the second largest.
fn margin(x: &[f32]) -> f32 {
    let best = argmax(x) as usize;
    let second = x
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != best)
        .map(|(_, &v)| v)
        .fold(f32::NEG_INFINITY, f32::max);
    x[best] - second
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Error allowed between GPU and CPU logits: both quantize activations to int8, at different
/// points and with different summation orders. The CPU backend meets llama.cpp's logits on
/// these tiny models within 0.01 to 0.053 by the same metric.
const TOL: f64 = 6e-2;
/// Logit margins below which the two backends may rank the top two tokens differently.
const NEAR_TIE: f32 = 0.5;

#[test]
fn prompt_logits_match_the_cpu() {
    let Some(g) = common::gpu() else { return };
    for tm in models() {
        let (name, model) = (&tm.name, &tm.model);
        let mut c = cpu(model, 256, 1);
        let mut d = gpu(&g, model, 256, 1);
        for len in [1usize, 7, 16, 17, 64, 150] {
            let p = tm.prompt(len, len as u64);
            c.clear(0).unwrap();
            d.clear(0).unwrap();
            let a = c.eval(0, &p, Logits::Last).unwrap().to_vec();
            let b = d.eval(0, &p, Logits::Last).unwrap().to_vec();
            let e = rel(&b, &a);
            eprintln!("{name} prompt {len}: rel err {e:.2e}");
            assert!(e < TOL, "{name} prompt {len}: rel err {e}");
        }
    }
}

#[test]
fn batched_decode_matches_the_cpu() {
    let Some(g) = common::gpu() else { return };
    for tm in models() {
        let (name, model) = (&tm.name, &tm.model);
        let mut c = cpu(model, 128, 4);
        let mut d = gpu(&g, model, 128, 4);
        for slot in 0..4 {
            let p = tm.prompt(5 + 7 * slot, 100 + slot as u64);
            c.eval(slot, &p, Logits::None).unwrap();
            d.eval(slot, &p, Logits::None).unwrap();
        }
        for step in 0..3 {
            let steps: Vec<(usize, u32)> = (0..4).map(|s| (s, tm.token(s, step))).collect();
            let a = c.decode_many(&steps).unwrap().to_vec();
            let b = d.decode_many(&steps).unwrap().to_vec();
            let e = rel(&b, &a);
            assert!(e < TOL, "{name} batched step {step}: rel err {e}");
        }
    }
}

#[test]
fn decode_steps_choose_the_cpus_token_and_chains_equal_the_host_loop() {
    let Some(g) = common::gpu() else { return };
    for tm in models() {
        let (name, model) = (&tm.name, &tm.model);
        let mut c = cpu(model, 256, 1);
        let mut d = gpu(&g, model, 256, 1);
        let p = tm.prompt(12, 7);
        let mut la = c.eval(0, &p, Logits::Last).unwrap().to_vec();
        let mut lb = d.eval(0, &p, Logits::Last).unwrap().to_vec();
        let mut checked = 0;
        for step in 0..32 {
            let want = argmax(&la);
            if margin(&la) > NEAR_TIE {
                assert_eq!(argmax(&lb), want, "{name} step {step}: top-1 differs");
                checked += 1;
            }
            la = c.eval(0, &[want], Logits::Last).unwrap().to_vec();
            lb = d.eval(0, &[want], Logits::Last).unwrap().to_vec();
        }
        eprintln!("{name}: top-1 equal on {checked} of 32 steps without a near tie");

        // The device-side chain gives the same tokens as the host loop on the same backend.
        let mut host = gpu(&g, model, 256, 1);
        let mut l = host.eval(0, &p, Logits::Last).unwrap().to_vec();
        let mut looped = Vec::new();
        for _ in 0..32 {
            let t = argmax(&l);
            looped.push(t);
            l = host.eval(0, &[t], Logits::Last).unwrap().to_vec();
        }
        let mut d2 = gpu(&g, model, 256, 1);
        let first = argmax(d2.eval(0, &p, Logits::Last).unwrap());
        let mut chained = vec![first];
        let mut next = first;
        for len in [4usize, 27] {
            let out = d2.greedy_chain(0, next, len).unwrap().unwrap();
            next = *out.last().unwrap();
            chained.extend(out);
        }
        assert_eq!(chained, looped, "{name}: chain differs from the step loop");
        assert_eq!(d2.tokens(0).len(), p.len() + 31);
    }
}

/// Parameters whose draws are not certain, on each of the sampler's paths: the defaults with a
/// repeat penalty (per-block top-k lists), and top-p alone (the exact path's launches).
fn real_draws(seed: u64) -> [(&'static str, SamplerParams); 2] {
    [
        (
            "fast path",
            SamplerParams {
                seed,
                repeat_penalty: 1.2,
                ..SamplerParams::default()
            },
        ),
        (
            "exact path",
            SamplerParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 0.9,
                min_p: 0.0,
                penalty_last_n: 0,
                seed: seed + 1,
                ..SamplerParams::default()
            },
        ),
    ]
}

/// A session on the GPU that reads `prompt`, then takes `first` and sampled chains of `lens`
/// tokens with `params`: `first` and every chain's tokens.
fn sampled_chains(
    g: &Arc<akunu_cuda::Gpu>,
    model: &Arc<Model>,
    prompt: &[u32],
    first: u32,
    params: &SamplerParams,
    lens: &[usize],
) -> Vec<u32> {
    let mut d = gpu(g, model, 256, 1);
    d.eval(0, prompt, Logits::Last).unwrap();
    let mut out = vec![first];
    for &len in lens {
        let next = *out.last().unwrap();
        out.extend(d.sampled_chain(0, next, len, params).unwrap().unwrap());
    }
    assert_eq!(d.tokens(0).len(), prompt.len() + out.len() - 1);
    out
}

/// Sampled chains: where the draw is certain (top-k 1, with penalties) they give the host
/// loop's tokens, drawn by the CPU sampler from the same backend's logits; with real draws
/// (the fast path, and the exact path's launches) a seed gives the same tokens however the
/// generation is cut into chains.
#[test]
fn sampled_chains_follow_the_cpu_sampler_and_their_seed() {
    let Some(g) = common::gpu() else { return };
    // Under compute-sanitizer one family: the chains' launches are the same for every model.
    let families = if common::sanitizing() { 1 } else { usize::MAX };
    for tm in models().into_iter().take(families) {
        let (name, model) = (&tm.name, &tm.model);
        let p = tm.prompt(12, 9);
        let certain = SamplerParams {
            temperature: 0.7,
            top_k: 1,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.3,
            frequency_penalty: 0.2,
            presence_penalty: 0.1,
            penalty_last_n: 16,
            seed: 3,
        };
        let mut host = gpu(&g, model, 256, 1);
        let mut sampler = Sampler::new(certain.clone(), model.config.n_vocab).unwrap();
        for &t in &p {
            sampler.accept(t);
        }
        let mut l = host.eval(0, &p, Logits::Last).unwrap().to_vec();
        let mut looped = Vec::new();
        for _ in 0..32 {
            let t = sampler.sample(&mut l);
            sampler.accept(t);
            looped.push(t);
            l = host.eval(0, &[t], Logits::Last).unwrap().to_vec();
        }
        let chained = sampled_chains(&g, model, &p, looped[0], &certain, &[4, 27]);
        assert_eq!(
            chained, looped,
            "{name}: certain draws differ from the host loop"
        );

        for (what, params) in real_draws(21) {
            let a = sampled_chains(&g, model, &p, looped[0], &params, &[4, 27]);
            let b = sampled_chains(&g, model, &p, looped[0], &params, &[31]);
            let c = sampled_chains(&g, model, &p, looped[0], &params, &[1, 9, 21]);
            assert_eq!(a, b, "{name} {what}: chains of 4 + 27 against 31");
            assert_eq!(a, c, "{name} {what}: chains of 1 + 9 + 21 against 31");
            let distinct: HashSet<u32> = a.iter().copied().collect();
            eprintln!(
                "{name} {what}: {} distinct of {} tokens",
                distinct.len(),
                a.len()
            );
        }
    }
}

/// Keeps a sequence's tokens.
#[derive(Clone, Default)]
struct Kept(Arc<Mutex<Vec<u32>>>);

impl Listener for Kept {
    fn send(&mut self, event: SeqEvent) -> bool {
        match event {
            SeqEvent::Delta { tokens, .. } => {
                self.0.lock().unwrap().extend(tokens.iter().map(|t| t.id));
            }
            SeqEvent::Failed(why) => panic!("a sequence failed: {why}"),
            SeqEvent::Finished(_) => {}
        }
        true
    }

    fn cancelled(&self) -> bool {
        false
    }
}

/// `requests` (prompt, parameters, log-probabilities) submitted together to a scheduler over a
/// GPU session with a slot each; each one's tokens.
fn scheduled(
    g: &Arc<akunu_cuda::Gpu>,
    model: &Arc<Model>,
    requests: &[(Vec<u32>, SamplerParams, Option<usize>)],
    max_tokens: usize,
) -> Vec<Vec<u32>> {
    let session = gpu(g, model, 256, requests.len());
    let mut sched = Scheduler::new(session, &model.tokenizer).unwrap();
    let kept: Vec<Kept> = requests.iter().map(|_| Kept::default()).collect();
    for ((prompt, sampler, logprobs), k) in requests.iter().zip(&kept) {
        let request = SeqRequest {
            prompt: prompt.clone(),
            params: GenerateParams {
                max_tokens: Some(max_tokens),
                sampler: sampler.clone(),
                stop: Vec::new(),
                ignore_eos: true,
            },
            logprobs: *logprobs,
        };
        sched.submit(request, Box::new(k.clone())).unwrap();
    }
    while !sched.is_idle() {
        sched.step();
    }
    kept.iter().map(|k| k.0.lock().unwrap().clone()).collect()
}

/// The scheduler draws its sequences' tokens on the device (their logits never read back)
/// unless a sequence reports log-probabilities. Where the draw is certain (top-k 1, with and
/// without penalties), the device's tokens are the CPU sampler's from the same logits: four
/// sequences decoding together, drawn all on the device, every other one on the host (rows
/// drawn around host rows), and all on the host.
#[test]
fn batched_draws_on_the_device_follow_the_cpu_sampler() {
    let Some(g) = common::gpu() else { return };
    let families = if common::sanitizing() { 1 } else { usize::MAX };
    for tm in models().into_iter().take(families) {
        let (name, model) = (&tm.name, &tm.model);
        let certain = |penalty_last_n: usize, seed: u64| SamplerParams {
            temperature: 0.9,
            top_k: 1,
            top_p: 0.95,
            min_p: 0.0,
            repeat_penalty: 1.4,
            frequency_penalty: 0.3,
            presence_penalty: 0.2,
            penalty_last_n,
            seed,
        };
        let prompts: Vec<Vec<u32>> = [5usize, 12, 20, 9]
            .iter()
            .enumerate()
            .map(|(i, &len)| tm.prompt(len, 40 + i as u64))
            .collect();
        let windows = [0usize, 8, 16, 64];
        let runs: Vec<Vec<Vec<u32>>> = [[false; 4], [true, false, true, false], [true; 4]]
            .iter()
            .map(|host| {
                let requests: Vec<_> = (0..4)
                    .map(|i| {
                        let logprobs = host[i].then_some(0);
                        (prompts[i].clone(), certain(windows[i], i as u64), logprobs)
                    })
                    .collect();
                scheduled(&g, model, &requests, 16)
            })
            .collect();
        assert!(
            runs[0].iter().all(|t| t.len() == 16),
            "{name}: {:?}",
            runs[0]
        );
        assert_eq!(runs[0], runs[1], "{name}: device rows around host rows");
        assert_eq!(
            runs[0], runs[2],
            "{name}: device draws against the CPU sampler"
        );
    }
}

/// A seed draws the same tokens through the scheduler's draws after each pass as through
/// `generate`'s (the token after the prompt drawn after the prompt's pass, then sampled
/// chains): a draw is numbered by the drawn token's position either way. The fast path and
/// the exact path's launches. `generate` runs no pass for its last token.
#[test]
fn a_seed_draws_the_same_tokens_in_the_scheduler_and_in_chains() {
    let Some(g) = common::gpu() else { return };
    let families = if common::sanitizing() { 1 } else { usize::MAX };
    for tm in models().into_iter().take(families) {
        let (name, model) = (&tm.name, &tm.model);
        let p = tm.prompt(12, 11);
        for (what, sampler) in real_draws(31) {
            let alone = scheduled(&g, model, &[(p.clone(), sampler.clone(), None)], 24);
            let mut d = gpu(&g, model, 256, 1);
            let params = GenerateParams {
                max_tokens: Some(24),
                sampler,
                stop: Vec::new(),
                ignore_eos: true,
            };
            let out = generate(&mut d, 0, &model.tokenizer, &p, &params, |_| true).unwrap();
            assert_eq!(alone[0], out.tokens, "{name} {what}");
            // The cache holds every token handed out but the last, which no pass has read.
            assert_eq!(d.tokens(0).len(), p.len() + 23, "{name} {what}");
        }
    }
}

#[test]
fn every_pass_size_matches_the_cpu() {
    let Some(g) = common::gpu() else { return };
    for tm in models().into_iter().take(4) {
        let (name, model) = (&tm.name, &tm.model);
        let mut c = cpu(model, 128, 1);
        let mut d = gpu(&g, model, 128, 1);
        let p = tm.prompt(40, 3);
        for m in [1usize, 2, 3, 5, 8, 13, 16, 17, 31, 40] {
            c.clear(0).unwrap();
            d.clear(0).unwrap();
            let mut rows_a = Vec::new();
            let mut rows_b = Vec::new();
            c.eval_all(0, &p[..m], m, |_, r| rows_a.extend_from_slice(r))
                .unwrap();
            d.eval_all(0, &p[..m], m, |_, r| rows_b.extend_from_slice(r))
                .unwrap();
            let e = rel(&rows_b, &rows_a);
            assert!(e < TOL, "{name} m={m}: rel err {e}");
        }
    }
}

#[test]
fn refusals_leave_the_backend_usable() {
    let Some(g) = common::gpu() else { return };
    let Some(TestModel { model, .. }) = models().into_iter().next() else {
        return;
    };
    let mut d = gpu(&g, &model, 32, 1);
    let n_vocab = model.config.n_vocab as u32;
    assert!(d.eval(0, &[n_vocab], Logits::Last).is_err());
    assert!(d.eval(0, &[300; 33], Logits::Last).is_err());
    assert!(d.greedy_chain(0, 300, 40).unwrap().is_err());
    let params = SamplerParams::default();
    assert!(d.sampled_chain(0, 300, 40, &params).unwrap().is_err());
    assert!(d.sampled_chain(0, n_vocab, 4, &params).unwrap().is_err());
    // A length past any context, where `pos + n` would overflow.
    assert!(d.greedy_chain(0, 300, usize::MAX).unwrap().is_err());
    assert!(d
        .sampled_chain(0, 300, usize::MAX, &params)
        .unwrap()
        .is_err());
    assert!(d.backend_mut().greedy_chain(0, 300, 1, usize::MAX).is_err());
    let ok = d.eval(0, &[300, 301], Logits::Last).unwrap();
    assert!(ok.iter().all(|x| x.is_finite()));
    assert_eq!(d.backend().n_ctx(), 32);

    // Draws from rows the last pass did not output, or out of order, or twice from a pass.
    let draw = |row| Draw {
        row,
        params: &params,
        recent: &[300],
        step: 3,
    };
    let b = d.backend_mut();
    assert!(b.draw(&[draw(1)]).is_err());
    b.forward(&Batch {
        tokens: &[302, 303],
        positions: &[2, 3],
        slots: &[0, 0],
        outputs: &[0, 1],
    })
    .unwrap();
    assert!(b.draw(&[draw(1), draw(0)]).is_err());
    assert!(b.draw(&[draw(0), draw(2)]).is_err());
    let t = b.draw(&[draw(0), draw(1)]).unwrap();
    assert!(t.iter().all(|&t| t < n_vocab), "{t:?}");
    assert!(b.draw(&[draw(0)]).is_err());
    // Their logits were penalised on the device before any read.
    assert!(b.logits().is_err());
    let ok = d.eval(0, &[304], Logits::Last).unwrap();
    assert!(ok.iter().all(|x| x.is_finite()));
}

/// A KV cache larger than the GPU's free memory is refused by name, with the context and
/// slots it was asked for, before any of it is allocated.
#[test]
fn a_kv_cache_past_the_gpus_memory_is_refused_by_name() {
    let Some(g) = common::gpu() else { return };
    let Some(TestModel { model, .. }) = models().into_iter().next() else {
        return;
    };
    let (free, _) = g.memory().unwrap();
    let c = &model.config;
    let per_position = 2 * c.n_layer * c.n_head_kv * (c.head_dim + c.head_dim_v);
    let n_ctx = (free / per_position + 1).next_multiple_of(1024);
    let opts = CudaOptions {
        n_ctx,
        n_slots: 2,
        max_batch: 64,
    };
    let err = match CudaBackend::new(g.clone(), model.clone(), opts) {
        Ok(_) => panic!("a KV cache of {n_ctx} positions × 2 slots fit {free} free bytes"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(&format!("the KV cache ({n_ctx} positions × 2 slots) needs"))
            && err.contains(
                "GB the GPU has free after the weights; lower the context size or the slots"
            ),
        "{err}"
    );
    // The GPU is left as it was: a backend of a small context still loads and runs.
    let mut d = gpu(&g, &model, 32, 1);
    assert!(d
        .eval(0, &[300, 301], Logits::Last)
        .unwrap()
        .iter()
        .all(|x| x.is_finite()));
}

#[test]
fn a_backend_loads_only_the_modules_it_lists() {
    if common::gpu().is_none() {
        return;
    }
    for TestModel { name, model, .. } in models() {
        // A GPU of its own, so only this backend's modules are loaded in it.
        let g = akunu_cuda::Gpu::open(0).unwrap();
        let listed: HashSet<ModuleKey> = akunu_cuda::backend::kernel_modules(&g.chip, &model)
            .iter()
            .map(|(file, defines)| ModuleKey::new(file, g.arch(), defines))
            .collect();
        let session = gpu(&g, &model, 64, 1);
        let loaded: HashSet<ModuleKey> = g.loaded_modules().into_iter().collect();
        let unlisted: Vec<_> = loaded.difference(&listed).collect();
        assert!(
            unlisted.is_empty(),
            "{name}: loaded but not listed: {unlisted:?}"
        );
        assert_eq!(loaded.len(), listed.len(), "{name}");
        assert_eq!(
            g.uncompiled(&akunu_cuda::backend::kernel_modules(&g.chip, &model)),
            0
        );
        drop(session);
    }
}
