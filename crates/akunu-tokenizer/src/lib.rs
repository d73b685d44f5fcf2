//! Text to token ids and back, exactly as the model was trained to see it.
//!
//! A [`Tokenizer`] is built from GGUF metadata (`tokenizer.ggml.*`) or from a Hugging Face
//! `tokenizer.json`. Three algorithms cover the models in use: SentencePiece BPE by scores
//! (Gemma, Llama 2, Mistral), byte-level BPE with ranked merges behind a regex pre-tokenizer
//! (Llama 3, Qwen 2/3, SmolLM, DeepSeek) and WordPiece (BERT). Special tokens are split out of
//! the text first; decoding goes through per-token pieces, and [`StreamDecoder`] turns a token
//! stream into text without ever splitting a UTF-8 character. [`chat`] renders conversations
//! with the model's Jinja chat template.

mod bpe;
pub mod chat;
mod conversation;
mod error;
mod gguf;
mod hf;
mod pretok;
mod roles;
mod special;
mod spm;
mod stream;
mod tokenizer;
mod unicode;
mod vocab;
mod wpm;

pub use chat::{BuiltinTemplate, ChatError, ChatRequest, ChatTemplate};
pub use error::TokenizerError;
pub use stream::StreamDecoder;
pub use tokenizer::{DecodeOptions, EncodeOptions, Source, SpecialTokens, Tokenizer};
pub use vocab::TokenKind;

/// A token id.
pub type TokenId = u32;
