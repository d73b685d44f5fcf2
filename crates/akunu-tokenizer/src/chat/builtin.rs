//! Fallback templates for model files that carry none.
//!
//! The sources live beside this file as `.jinja` so the reference script renders the very same
//! text with Jinja2. They take the same variables as a model's own template (`messages`,
//! `add_generation_prompt`, `bos_token`).

use super::ChatTemplate;

/// One of the chat formats akunu knows without a template in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BuiltinTemplate {
    /// `<|im_start|>ROLE\nCONTENT<|im_end|>\n` (Qwen, many fine-tunes; the default).
    ChatMl,
    /// `<|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>` after `bos_token`.
    Llama3,
    /// `<start_of_turn>ROLE\nCONTENT<end_of_turn>\n` after `bos_token`, `model` for the
    /// assistant, a system prompt folded into the first user turn (Gemma 1–3).
    Gemma,
}

impl BuiltinTemplate {
    /// Every built-in, for iteration.
    pub const ALL: [BuiltinTemplate; 3] = [Self::ChatMl, Self::Llama3, Self::Gemma];

    /// Picks the format a model without a template most likely speaks.
    ///
    /// The vocabulary decides first, since a format only works if its marker tokens exist:
    /// `<start_of_turn>` means Gemma, `<|start_header_id|>` Llama 3, `<|im_start|>` ChatML.
    /// Without any of them a `gemma*` architecture still means Gemma, and everything else gets
    /// ChatML. The architecture alone never selects Llama 3: `llama` covers Llama 1/2, Mistral
    /// and many fine-tunes that have no header tokens at all.
    pub fn detect(arch: &str, has_token: impl Fn(&str) -> bool) -> BuiltinTemplate {
        if has_token("<start_of_turn>") {
            BuiltinTemplate::Gemma
        } else if has_token("<|start_header_id|>") {
            BuiltinTemplate::Llama3
        } else if has_token("<|im_start|>") {
            BuiltinTemplate::ChatMl
        } else if arch.to_ascii_lowercase().starts_with("gemma") {
            BuiltinTemplate::Gemma
        } else {
            BuiltinTemplate::ChatMl
        }
    }

    /// The Jinja source.
    pub fn source(self) -> &'static str {
        match self {
            BuiltinTemplate::ChatMl => include_str!("builtin/chatml.jinja"),
            BuiltinTemplate::Llama3 => include_str!("builtin/llama3.jinja"),
            BuiltinTemplate::Gemma => include_str!("builtin/gemma.jinja"),
        }
    }

    /// A short name for logs: `chatml`, `llama3`, `gemma`.
    pub fn name(self) -> &'static str {
        match self {
            BuiltinTemplate::ChatMl => "chatml",
            BuiltinTemplate::Llama3 => "llama3",
            BuiltinTemplate::Gemma => "gemma",
        }
    }

    /// The compiled template (no special tokens set yet).
    pub fn template(self) -> ChatTemplate {
        ChatTemplate::builtin(self)
    }
}

impl std::fmt::Display for BuiltinTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
