//! Architectures as data.
//!
//! Plan: one [`ArchDescriptor`] says how a decoder block of a family is wired (activation, RoPE
//! style, which norms exist, soft-capping, embedding scale, which layers use a sliding window).
//! It starts from the family's defaults, chosen from `general.architecture` by exact name, and
//! then every optional part is decided by the tensors the file really has (a llama file without
//! `output.weight` ties its embeddings; a qwen2 file with `attn_q.bias` gets biases), so a file
//! that deviates from its family is described by what it holds. The plan builder reads only the
//! descriptor, never the architecture name.

use akunu_formats::gguf::GgufFile;

use crate::ModelError;

/// The families this engine runs. Each is one `general.architecture` value of llama.cpp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Llama 1/2/3/3.1/3.2, Mistral, TinyLlama, SmolLM (all written as `llama`).
    Llama,
    Qwen2,
    Qwen3,
    Gemma,
    Gemma2,
    Gemma3,
}

impl Family {
    pub const ALL: [Family; 6] = [
        Family::Llama,
        Family::Qwen2,
        Family::Qwen3,
        Family::Gemma,
        Family::Gemma2,
        Family::Gemma3,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Gemma => "gemma",
            Family::Gemma2 => "gemma2",
            Family::Gemma3 => "gemma3",
        }
    }

    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// The gated activation of the feed-forward block: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// GELU with the tanh approximation, as the Gemma reference uses.
    GeluTanh,
}

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): llama (its GGUF q/k weights are permuted for this).
    Normal,
    /// Split halves (i, i + n_rot/2): GPT-NeoX, Qwen, Gemma.
    Neox,
}

/// Which parts a decoder block has and how they behave.
#[derive(Clone, Debug, PartialEq)]
pub struct ArchDescriptor {
    pub family: Family,
    pub activation: Activation,
    pub rope: RopeStyle,
    /// Multiply the token embedding by this (Gemma: sqrt(n_embd)).
    pub embedding_scale: Option<f32>,
    /// Per-head RMSNorm of q and k before RoPE (Qwen 3, Gemma 3).
    pub qk_norm: bool,
    /// RMSNorm of the attention output before the residual add (Gemma 2/3).
    pub post_attn_norm: bool,
    /// RMSNorm of the feed-forward output before the residual add (Gemma 2/3).
    pub post_ffn_norm: bool,
    /// q/k/v projections carry biases (Qwen 2).
    pub qkv_bias: bool,
    /// The output projection is the token embedding (no `output.weight`).
    pub tie_embeddings: bool,
    /// `tanh(s / c) * c` on attention scores (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// `tanh(l / c) * c` on the final logits (Gemma 2).
    pub final_softcap: Option<f32>,
    /// llama 3.1-style frequency factors (`rope_freqs.weight`) divide the RoPE frequencies.
    pub rope_freq_factors: bool,
}

impl ArchDescriptor {
    /// The family's defaults, before the tensors are consulted.
    pub fn defaults(family: Family) -> ArchDescriptor {
        let base = ArchDescriptor {
            family,
            activation: Activation::Silu,
            rope: RopeStyle::Normal,
            embedding_scale: None,
            qk_norm: false,
            post_attn_norm: false,
            post_ffn_norm: false,
            qkv_bias: false,
            tie_embeddings: false,
            attn_softcap: None,
            final_softcap: None,
            rope_freq_factors: false,
        };
        match family {
            Family::Llama => base,
            Family::Qwen2 => ArchDescriptor {
                rope: RopeStyle::Neox,
                qkv_bias: true,
                ..base
            },
            Family::Qwen3 => ArchDescriptor {
                rope: RopeStyle::Neox,
                qk_norm: true,
                ..base
            },
            Family::Gemma | Family::Gemma2 | Family::Gemma3 => ArchDescriptor {
                activation: Activation::GeluTanh,
                rope: RopeStyle::Neox,
                qk_norm: family == Family::Gemma3,
                post_attn_norm: family != Family::Gemma,
                post_ffn_norm: family != Family::Gemma,
                tie_embeddings: true,
                ..base
            },
        }
    }

    /// The descriptor of an open file: the family's defaults, adjusted to the tensors present.
    pub fn from_gguf(file: &GgufFile) -> Result<ArchDescriptor, ModelError> {
        let arch = file.architecture().ok_or(ModelError::MissingKey {
            key: "general.architecture".into(),
        })?;
        let family = Family::from_name(arch).ok_or_else(|| ModelError::UnsupportedArch {
            arch: arch.to_string(),
        })?;
        let mut d = ArchDescriptor::defaults(family);
        let has = |name: &str| file.tensor(name).is_some();
        // A part exists when any layer has its tensor; the plan then requires it in every
        // layer, so a file missing it in some layer is refused rather than read without it.
        let in_blocks = |suffix: &str| {
            file.tensors()
                .iter()
                .any(|t| t.name.starts_with("blk.") && t.name.ends_with(suffix))
        };
        d.tie_embeddings = !has("output.weight");
        d.qk_norm = in_blocks(".attn_q_norm.weight") || in_blocks(".attn_k_norm.weight");
        d.post_attn_norm = in_blocks(".post_attention_norm.weight");
        d.post_ffn_norm = in_blocks(".post_ffw_norm.weight");
        d.qkv_bias =
            in_blocks(".attn_q.bias") || in_blocks(".attn_k.bias") || in_blocks(".attn_v.bias");
        d.rope_freq_factors = has("rope_freqs.weight");
        if matches!(family, Family::Gemma | Family::Gemma2 | Family::Gemma3) {
            let n_embd = file
                .arch_key("embedding_length")
                .and_then(|v| v.as_f64())
                .unwrap_or(0.0);
            d.embedding_scale = Some(n_embd.sqrt() as f32);
        }
        let softcap = |key: &str| {
            file.arch_key(key)
                .and_then(|v| v.as_f64())
                .filter(|c| *c > 0.0)
                .map(|c| c as f32)
        };
        // Gemma 2 always caps (50 for attention, 30 for logits unless the file says otherwise, as
        // its reference does); Gemma 3 caps the logits only when the file asks.
        if family == Family::Gemma2 {
            d.attn_softcap = softcap("attn_logit_softcapping").or(Some(50.0));
        }
        match family {
            Family::Gemma2 => d.final_softcap = softcap("final_logit_softcapping").or(Some(30.0)),
            Family::Gemma3 => d.final_softcap = softcap("final_logit_softcapping"),
            _ => {}
        }
        Ok(d)
    }
}
