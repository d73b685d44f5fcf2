//! `akunu chat`: an interactive conversation. Each turn re-renders the whole conversation
//! through the chat template; the session keeps the KV cache of the previous turns, so only
//! the new part of the prompt is evaluated.

use std::io::{BufRead, Write};
use std::path::Path;

use akunu_core::generate::{generate, StopReason};
use akunu_core::EngineError;
use akunu_tokenizer::chat::ChatRequest;
use akunu_tokenizer::EncodeOptions;
use anyhow::{anyhow, Result};
use serde_json::{json, Value};

use crate::engine::{self, EngineArgs, GenArgs};
use crate::generate::print_stats;

const HELP: &str = "commands: /reset starts a new conversation, /stats toggles statistics, /exit (or Ctrl-D) quits";

pub fn run(
    path: &Path,
    system: Option<String>,
    engine_args: &EngineArgs,
    gen: &GenArgs,
) -> Result<()> {
    let params = gen.params()?;
    let mut loaded = engine::load(path, engine_args, 1)?;
    let template = loaded
        .template
        .as_ref()
        .map_err(|e| anyhow!("no usable chat template: {e}"))?;
    let tok = &loaded.model.tokenizer;
    let start: Vec<Value> = system
        .map(|s| vec![json!({"role": "system", "content": s})])
        .unwrap_or_default();
    let mut messages = start.clone();
    let mut stats = false;
    eprintln!(
        "akunu chat: {} ({}), context {} tokens. {HELP}",
        path.display(),
        akunu_core::Backend::describe(loaded.session.backend()),
        loaded.session.n_ctx()
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("\n> ");
        let Some(line) = lines.next() else { break };
        let line = line?;
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = start.clone();
                loaded.session.clear(0)?;
                eprintln!("(new conversation)");
                continue;
            }
            "/stats" => {
                stats = !stats;
                continue;
            }
            "/help" => {
                eprintln!("{HELP}");
                continue;
            }
            _ => {}
        }
        messages.push(json!({"role": "user", "content": line}));
        let text = template.render(&ChatRequest::new(messages.clone()))?;
        let ids = tok.encode(
            &text,
            EncodeOptions {
                add_special: false,
                parse_special: true,
            },
        );
        let mut reply = String::new();
        let mut out = std::io::stdout().lock();
        let result = generate(&mut loaded.session, 0, tok, &ids, &params, |piece| {
            reply.push_str(piece);
            out.write_all(piece.as_bytes())
                .and_then(|_| out.flush())
                .is_ok()
        });
        let _ = writeln!(out);
        match result {
            Ok(r) => {
                if stats {
                    print_stats(&r);
                }
                if r.reason == StopReason::ContextFull {
                    eprintln!("(the context is full: /reset to start a new conversation)");
                }
                messages.push(json!({"role": "assistant", "content": reply}));
            }
            Err(EngineError::ContextFull { n_ctx, .. }) => {
                messages.pop();
                eprintln!("(the conversation no longer fits the context of {n_ctx} tokens: /reset to start over, or run with a larger -c)");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
