//! Roles a vocabulary does not always declare, recognised by token text.
//!
//! End of turn, end of message and the fill-in-the-middle markers are found by their usual
//! spellings when the metadata does not name them, and every token spelled like an end marker
//! ends generation. GGUF files are read as llama.cpp reads them, which also turns every token so
//! recognised into a control token (never read out of plain text); `tokenizer.json` keeps the
//! file's own token types, as Hugging Face does.

use rustc_hash::FxHashSet;

use crate::tokenizer::SpecialTokens;
use crate::vocab::{TokenKind, Vocab};
use crate::TokenId;

const EOT: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Spellings of the FIM roles, in the order pre, suf, mid, pad, rep, sep.
const FIM: [&[&str]; 6] = [
    &[
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ],
    &[
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ],
    &[
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ],
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &[
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ],
    &["<|file_sep|>"],
];

/// Token texts that end generation wherever they appear in a vocabulary.
const END_MARKERS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Fills in end of turn and end of message, finds the FIM roles (`fim`: declared ids, in
/// FIM order) and returns the end-of-generation set. With `force_control`, every token
/// recognised here by its text becomes a control token.
pub(crate) fn derive_roles(
    vocab: &mut Vocab,
    special: &mut SpecialTokens,
    mut fim: [Option<TokenId>; 6],
    force_control: bool,
) -> FxHashSet<TokenId> {
    let find = |names: &[&str]| names.iter().find_map(|n| vocab.id(n.as_bytes()));
    let mut recognised = Vec::new();
    for (slot, names) in [
        (&mut special.eot, EOT),
        (&mut special.eom, &["<|eom_id|>"][..]),
    ] {
        if slot.is_none() {
            *slot = find(names);
            recognised.extend(*slot);
        }
    }
    for (slot, names) in fim.iter_mut().zip(FIM) {
        if slot.is_none() {
            *slot = find(names);
            recognised.extend(*slot);
        }
    }
    let mut eog: FxHashSet<TokenId> = fim[3..].iter().flatten().copied().collect();
    for name in END_MARKERS {
        if let Some(id) = vocab.id(name.as_bytes()) {
            eog.insert(id);
            recognised.push(id);
        }
    }
    eog.extend(special.eos);
    eog.extend(special.eot);
    eog.extend(special.eom);
    if force_control {
        for id in recognised {
            vocab.tokens[id as usize].kind = TokenKind::Control;
        }
    }
    eog
}
