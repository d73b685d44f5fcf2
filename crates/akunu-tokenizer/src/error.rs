use thiserror::Error;

/// Why a tokenizer could not be built or a request could not be served.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("the model file has no tokenizer (no `tokenizer.ggml.model`)")]
    NoTokenizer,
    #[error("the model has no vocabulary (tokenizer model '{0}')")]
    NoVocabulary(String),
    #[error("unsupported tokenizer model '{0}' (supported: llama, gpt2, bert)")]
    UnsupportedModel(String),
    #[error("unknown pre-tokenizer '{name}' (supported: {known})")]
    UnknownPreTokenizer { name: String, known: String },
    #[error("invalid tokenizer metadata: {0}")]
    Invalid(String),
    #[error("unsupported tokenizer.json: {0}")]
    UnsupportedJson(String),
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {source}")]
    Json {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the model has no {0} token")]
    MissingSpecial(&'static str),
}

pub(crate) fn invalid(msg: impl Into<String>) -> TokenizerError {
    TokenizerError::Invalid(msg.into())
}
