//! `akunu run` (a prompt through the model's chat template) and `akunu complete` (raw text
//! continuation): text streams to stdout, statistics go to stderr.

use std::io::Write;
use std::path::Path;

use akunu_core::generate::{generate, GenerateOutput, StopReason};
use akunu_tokenizer::chat::ChatRequest;
use akunu_tokenizer::EncodeOptions;
use anyhow::{Context, Result};
use serde_json::json;

use crate::engine::{self, EngineArgs, GenArgs};

pub enum Mode {
    /// The prompt is a user message, wrapped by the chat template.
    Chat { system: Option<String> },
    /// The prompt is text to continue.
    Raw,
}

pub fn run(
    path: &Path,
    prompt: &str,
    mode: Mode,
    engine_args: &EngineArgs,
    gen: &GenArgs,
    quiet: bool,
) -> Result<()> {
    let params = gen.params()?;
    let mut loaded = engine::load(path, engine_args, 1)?;
    let tok = &loaded.model.tokenizer;
    let ids = match mode {
        Mode::Raw => tok.encode(
            prompt,
            EncodeOptions {
                add_special: tok.add_bos(),
                parse_special: true,
            },
        ),
        Mode::Chat { system } => {
            let template = loaded
                .template
                .as_ref()
                .map_err(|e| anyhow::anyhow!("no usable chat template: {e}"))?;
            let mut messages = Vec::new();
            if let Some(s) = system {
                messages.push(json!({"role": "system", "content": s}));
            }
            messages.push(json!({"role": "user", "content": prompt}));
            let req = ChatRequest::new(messages);
            let text = template
                .render(&req)
                .context("rendering the chat template")?;
            // The template writes BOS itself when the model wants one.
            tok.encode(
                &text,
                EncodeOptions {
                    add_special: false,
                    parse_special: true,
                },
            )
        }
    };
    if !quiet {
        eprintln!(
            "akunu: {} ({}), {}, loaded in {:.0} ms",
            path.display(),
            loaded.model.arch.family.name(),
            akunu_core::Backend::describe(loaded.session.backend()),
            loaded.load_time.as_secs_f64() * 1e3
        );
    }
    let mut out = std::io::stdout().lock();
    let mut write_failed = false;
    let result = generate(&mut loaded.session, 0, tok, &ids, &params, |text| {
        let ok = out
            .write_all(text.as_bytes())
            .and_then(|_| out.flush())
            .is_ok();
        write_failed |= !ok;
        ok
    })?;
    let _ = writeln!(out);
    if !quiet {
        print_stats(&result);
    }
    Ok(())
}

pub fn print_stats(r: &GenerateOutput) {
    let reason = match r.reason {
        StopReason::EndOfGeneration => "end of generation",
        StopReason::StopString => "stop string",
        StopReason::MaxTokens => "token limit",
        StopReason::ContextFull => "context full",
        StopReason::Cancelled => "cancelled",
    };
    eprintln!(
        "prompt: {} tokens ({} reused) in {:.1} ms, {:.1} t/s | generated: {} tokens in {:.1} ms, {:.1} t/s | stopped: {reason}",
        r.prompt_tokens,
        r.reused,
        r.prompt_time.as_secs_f64() * 1e3,
        r.prompt_tps(),
        r.tokens.len(),
        r.gen_time.as_secs_f64() * 1e3,
        r.gen_tps(),
    );
}
