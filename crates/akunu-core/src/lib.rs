//! The engine core: what a model is, how one forward pass is planned, and how tokens are
//! decoded through a backend. No backend code lives here.

pub mod arch;
pub mod backend;
pub mod batch;
pub mod config;
pub mod generate;
pub mod model;
pub mod plan;
pub mod sampling;
pub mod session;
pub mod stop;

pub use arch::{Activation, ArchDescriptor, Family, RopeStyle};
pub use backend::{Backend, Batch, Draw};
pub use config::ModelConfig;
pub use model::{Model, Weight, WeightId};
pub use plan::{Buf, Op, Plan};
pub use session::{Part, Session};

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Format {
        path: String,
        #[source]
        source: akunu_formats::gguf::GgufError,
    },
    #[error(
        "unsupported architecture {arch:?} (supported: llama, qwen2, qwen3, gemma, gemma2, gemma3)"
    )]
    UnsupportedArch { arch: String },
    #[error("missing metadata key {key}")]
    MissingKey { key: String },
    #[error("metadata key {key}: {why}")]
    BadKey { key: String, why: String },
    #[error("missing tensor {name}")]
    MissingTensor { name: String },
    #[error("tensor {name}: {why}")]
    BadTensor { name: String, why: String },
    #[error("unsupported: {what}")]
    Unsupported { what: String },
    #[error(transparent)]
    Tokenizer(#[from] akunu_tokenizer::TokenizerError),
}

/// Why a forward pass or a decode step was refused.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("context is full: slot {slot} holds {have} tokens, {adding} more would exceed the context of {n_ctx}")]
    ContextFull {
        slot: usize,
        have: usize,
        adding: usize,
        n_ctx: usize,
    },
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken { id: u32, n_vocab: usize },
    #[error("slot {slot} does not exist (the session has {n_slots})")]
    BadSlot { slot: usize, n_slots: usize },
    #[error("invalid batch: {0}")]
    BadBatch(String),
    #[error("backend: {0}")]
    Backend(String),
    #[error(transparent)]
    Sampling(#[from] sampling::SamplingError),
}
