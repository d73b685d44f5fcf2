//! Tying a tokenizer to its chat template: which template, which special-token texts it sees,
//! and which token ends an assistant turn.
//!
//! The template is the model's own (`tokenizer.chat_template`) or, when the file has none, the
//! built-in one its vocabulary and architecture point to. Its `bos_token`, `eos_token`, ...
//! variables are the vocabulary's texts for those roles. The end-of-turn marker the template
//! writes after an assistant message joins the end-of-generation set, so decode loops stop on
//! what the template actually emits rather than on a hard-coded list.

use crate::chat::{BuiltinTemplate, ChatError, ChatTemplate};
use crate::tokenizer::Tokenizer;
use crate::TokenId;

impl Tokenizer {
    /// The chat template to render prompts with: the model's own, else the built-in fallback
    /// for `arch` (the GGUF `general.architecture`, or "" when unknown).
    pub fn chat_template_for(&self, arch: &str) -> Result<ChatTemplate, ChatError> {
        let mut template = match self.chat_template() {
            Some(source) => ChatTemplate::new(source)?,
            None => BuiltinTemplate::detect(arch, |t| self.token_id(t).is_some()).template(),
        };
        let s = self.special_tokens();
        let roles = [
            ("bos_token", s.bos),
            ("eos_token", s.eos),
            ("unk_token", s.unk),
            ("pad_token", s.pad),
            ("sep_token", s.sep),
            ("mask_token", s.mask),
        ];
        for (name, id) in roles {
            if let Some(text) = id.and_then(|id| self.token_text(id)) {
                template.set_special_token(name, text);
            }
        }
        Ok(template)
    }

    /// Adds the token `template` writes after each assistant message to the
    /// end-of-generation set; returns it, or `None` when the template has no such marker or it
    /// is not a single special token (EOS then remains the stop).
    pub fn learn_end_of_turn(
        &mut self,
        template: &ChatTemplate,
    ) -> Result<Option<TokenId>, ChatError> {
        Ok(template
            .end_of_turn_text()?
            .and_then(|text| self.add_end_of_turn_text(&text)))
    }
}
