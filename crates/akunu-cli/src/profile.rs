//! `akunu profile`: time per op of the plan, for a prompt pass and for decode steps, summed
//! over layers (all `blk.N.ffn_down` ops form one row).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use akunu_core::session::Logits;
use anyhow::{bail, Result};

use crate::engine::{self, EngineArgs};

pub fn run(path: &Path, n_prompt: usize, n_gen: usize, args: &EngineArgs) -> Result<()> {
    let mut loaded = engine::load(path, args, 1)?;
    let n_ctx = loaded.session.n_ctx();
    if n_prompt.checked_add(n_gen).is_none_or(|n| n > n_ctx) {
        bail!("-p {n_prompt} and -n {n_gen} tokens together must fit the context of {n_ctx} (-c)");
    }
    let n_vocab = loaded.model.config.n_vocab;
    let labels = loaded.session.backend().op_labels();
    let tokens = engine::synthetic_tokens(&loaded.model, n_prompt + n_gen);
    let (prompt, gen) = tokens.split_at(n_prompt);

    let session = &mut loaded.session;
    println!("{}", akunu_core::Backend::describe(session.backend()));
    if session.backend().gpu_name().is_some() {
        // Events between ops need launches one at a time: no graphs, and no launch starting
        // while the one before drains (qwen3-0.6b: ~1.2 ms of ops a step here, ~0.4 ms a
        // step in `bench`; docs/perf/2026-12-06-host-free-timing.md).
        println!(
            "note: each op is timed alone, without graphs or overlapping launches; \
             `run` and `bench` decode faster than these sums"
        );
    }
    if n_prompt > 0 {
        session.backend_mut().set_profiling(true);
        let t = Instant::now();
        session.eval(0, prompt, Logits::Last)?;
        let total = t.elapsed();
        let times = session.backend().op_seconds();
        report(
            &format!("prompt of {n_prompt} tokens"),
            &labels,
            &times,
            total,
            n_prompt,
        );
    }
    if n_gen > 0 {
        if n_prompt == 0 {
            session.eval(0, &gen[..1], Logits::Last)?;
        }
        session.backend_mut().set_profiling(true);
        let t = Instant::now();
        for &tok in gen {
            session.eval(0, &[tok % n_vocab as u32], Logits::Last)?;
        }
        let total = t.elapsed();
        let times = session.backend().op_seconds();
        report(
            &format!("{n_gen} decode steps"),
            &labels,
            &times,
            total,
            n_gen,
        );
    }
    Ok(())
}

fn report(title: &str, labels: &[String], times: &[f64], total: Duration, tokens: usize) {
    let mut rows: Vec<(String, f64, usize)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for (label, &t) in labels.iter().zip(times) {
        let key = match label.strip_prefix("blk.") {
            Some(rest) => rest.split_once('.').map_or(rest, |(_, op)| op).to_string(),
            None => label.clone(),
        };
        let i = *index.entry(key.clone()).or_insert_with(|| {
            rows.push((key, 0.0, 0));
            rows.len() - 1
        });
        rows[i].1 += t;
        rows[i].2 += 1;
    }
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    let ops_total: f64 = times.iter().sum();
    println!(
        "\n{title}: {:.2} ms total, {:.1} t/s ({:.2} ms in ops)",
        total.as_secs_f64() * 1e3,
        tokens as f64 / total.as_secs_f64(),
        ops_total * 1e3
    );
    println!("| op | count | ms | % |\n|---|---|---|---|");
    for (name, t, count) in rows {
        println!(
            "| {name} | {count} | {:.3} | {:.1} |",
            t * 1e3,
            100.0 * t / ops_total.max(1e-12)
        );
    }
}
