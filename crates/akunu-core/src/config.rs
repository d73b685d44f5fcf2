//! The numbers of a model: widths, counts, RoPE and attention parameters.
//!
//! Read from GGUF metadata with the key names and defaults of llama.cpp's loader, so a file
//! means the same thing here as there. Everything is checked for consistency before a plan is
//! built from it: a hostile header gets an error, never a huge allocation or a division by zero.

use akunu_formats::gguf::{GgufFile, Value};

use crate::arch::{ArchDescriptor, Family};
use crate::ModelError;

/// Upper bounds that keep arithmetic on header values far from overflow.
const MAX_WIDTH: u64 = 1 << 20;
const MAX_LAYERS: u64 = 4096;

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    pub n_ff: usize,
    pub rms_eps: f32,
    pub n_ctx_train: usize,
    /// Dimensions of each head that RoPE rotates (the rest pass through).
    pub n_rot: usize,
    pub rope_base: f32,
    /// Multiplies positions (1 / the linear scaling factor).
    pub rope_freq_scale: f32,
    /// RoPE base and scale of sliding-window layers.
    pub rope_base_swa: f32,
    pub rope_freq_scale_swa: f32,
    /// Keys more than this many positions behind the query are masked on sliding-window layers.
    pub sliding_window: Option<usize>,
    /// Which layers use the sliding window.
    pub swa_layers: Vec<bool>,
    /// Scale applied to q·k (or to q beforehand; the same thing).
    pub attn_scale: f32,
}

impl ModelConfig {
    pub fn from_gguf(file: &GgufFile, arch: &ArchDescriptor) -> Result<ModelConfig, ModelError> {
        let int = |key: &str| -> Result<Option<u64>, ModelError> {
            match file.arch_key(key) {
                None => Ok(None),
                Some(v) => uniform_int(&v).map(Some).ok_or_else(|| ModelError::BadKey {
                    key: arch_key(file, key),
                    why: "expected a non-negative integer (or an array of one repeated value)"
                        .into(),
                }),
            }
        };
        let required = |key: &str| -> Result<u64, ModelError> {
            int(key)?.ok_or_else(|| ModelError::MissingKey {
                key: arch_key(file, key),
            })
        };
        let float = |key: &str| -> Result<Option<f32>, ModelError> {
            match file.arch_key(key) {
                None => Ok(None),
                Some(v) => match v.as_f64() {
                    Some(x) if x.is_finite() => Ok(Some(x as f32)),
                    _ => Err(ModelError::BadKey {
                        key: arch_key(file, key),
                        why: "expected a finite number".into(),
                    }),
                },
            }
        };
        let bounded = |key: &str, v: u64, max: u64| -> Result<usize, ModelError> {
            if v == 0 || v > max {
                return Err(ModelError::BadKey {
                    key: arch_key(file, key),
                    why: format!("{v} is outside 1..={max}"),
                });
            }
            Ok(v as usize)
        };

        let n_embd = bounded("embedding_length", required("embedding_length")?, MAX_WIDTH)?;
        let n_layer = bounded("block_count", required("block_count")?, MAX_LAYERS)?;
        let n_head = bounded(
            "attention.head_count",
            required("attention.head_count")?,
            MAX_WIDTH,
        )?;
        let n_head_kv = match int("attention.head_count_kv")? {
            Some(v) => bounded("attention.head_count_kv", v, MAX_WIDTH)?,
            None => n_head,
        };
        if n_head % n_head_kv != 0 {
            return Err(ModelError::BadKey {
                key: arch_key(file, "attention.head_count_kv"),
                why: format!(
                    "{n_head} query heads cannot be shared by {n_head_kv} key/value heads"
                ),
            });
        }
        let n_ff = bounded(
            "feed_forward_length",
            required("feed_forward_length")?,
            MAX_WIDTH,
        )?;
        let head_dim = match int("attention.key_length")? {
            Some(v) => bounded("attention.key_length", v, MAX_WIDTH)?,
            None => n_embd / n_head,
        };
        let head_dim_v = match int("attention.value_length")? {
            Some(v) => bounded("attention.value_length", v, MAX_WIDTH)?,
            None => head_dim,
        };
        let n_rot = match int("rope.dimension_count")? {
            Some(v) => bounded("rope.dimension_count", v, MAX_WIDTH)?,
            None => head_dim,
        };
        if n_rot > head_dim || n_rot % 2 != 0 || head_dim % 2 != 0 {
            return Err(ModelError::BadKey {
                key: arch_key(file, "rope.dimension_count"),
                why: format!("RoPE over {n_rot} of {head_dim} head dimensions"),
            });
        }
        let rms_eps =
            float("attention.layer_norm_rms_epsilon")?.ok_or_else(|| ModelError::MissingKey {
                key: arch_key(file, "attention.layer_norm_rms_epsilon"),
            })?;
        if rms_eps.is_nan() || rms_eps < 0.0 {
            return Err(ModelError::BadKey {
                key: arch_key(file, "attention.layer_norm_rms_epsilon"),
                why: format!("{rms_eps} is not a valid epsilon"),
            });
        }
        let n_ctx_train = match int("context_length")? {
            Some(v) => bounded("context_length", v, 1 << 28)?,
            None => 4096,
        };

        let rope_base = positive(file, "rope.freq_base", float("rope.freq_base")?, 10000.0)?;
        let rope_freq_scale = match file
            .arch_key("rope.scaling.type")
            .and_then(|v| v.as_str().map(str::to_owned))
        {
            Some(t) if t != "none" && t != "linear" => {
                return Err(ModelError::Unsupported {
                    what: format!("RoPE scaling type {t:?} (supported: none, linear)"),
                })
            }
            Some(t) if t == "none" => 1.0,
            _ => {
                let factor = match float("rope.scaling.factor")? {
                    Some(f) => Some(f),
                    None => float("rope.scale_linear")?,
                };
                match factor {
                    Some(f) if f > 0.0 => 1.0 / f,
                    Some(0.0) => 1.0,
                    Some(f) => {
                        return Err(ModelError::BadKey {
                            key: arch_key(file, "rope.scaling.factor"),
                            why: format!("{f} is negative"),
                        })
                    }
                    None => 1.0,
                }
            }
        };

        let family = arch.family;
        let mut sliding_window = None;
        let mut swa_layers = vec![false; n_layer];
        let mut rope_base_swa = rope_base;
        let rope_freq_scale_swa = match family {
            Family::Gemma2 => rope_freq_scale,
            _ => 1.0,
        };
        let default_pattern = match family {
            Family::Gemma2 => Some(2),
            Family::Gemma3 => Some(6),
            _ => None,
        };
        if let Some(default_pattern) = default_pattern {
            let window = match int("attention.sliding_window")? {
                Some(w) => w,
                None if family == Family::Gemma2 => 4096,
                None => 0,
            };
            if window > 0 {
                sliding_window = Some(window.min(1 << 28) as usize);
                swa_layers = swa_pattern(file, n_layer, default_pattern)?;
                rope_base_swa = if family == Family::Gemma3 {
                    10000.0
                } else {
                    rope_base
                };
                if let Some(b) = float("rope.freq_base_swa")? {
                    rope_base_swa = positive(file, "rope.freq_base_swa", Some(b), b)?;
                }
            }
        }

        // Gemma 2/3 27B scale queries by n_embd / n_head instead of the head width (their
        // reference's query_pre_attn_scalar); llama.cpp recognises them by layer count.
        let attn_scale = match (family, n_layer) {
            (Family::Gemma2, 46) | (Family::Gemma3, 62) => 1.0 / ((n_embd / n_head) as f32).sqrt(),
            _ => 1.0 / (head_dim as f32).sqrt(),
        };

        let n_vocab = file
            .tensor("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .ok_or(ModelError::MissingTensor {
                name: "token_embd.weight".into(),
            })?;
        let n_vocab = usize::try_from(n_vocab)
            .ok()
            .filter(|&n| n > 0 && n <= 1 << 24)
            .ok_or_else(|| ModelError::BadTensor {
                name: "token_embd.weight".into(),
                why: format!("{n_vocab} vocabulary rows"),
            })?;

        Ok(ModelConfig {
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_v,
            n_ff,
            rms_eps,
            n_ctx_train,
            n_rot,
            rope_base,
            rope_freq_scale,
            rope_base_swa,
            rope_freq_scale_swa,
            sliding_window,
            swa_layers,
            attn_scale,
        })
    }

    /// Bytes of KV cache one position takes across all layers, at `elem` bytes per value.
    pub fn kv_bytes_per_position(&self, elem: usize) -> usize {
        self.n_layer * self.n_head_kv * (self.head_dim + self.head_dim_v) * elem
    }
}

fn arch_key(file: &GgufFile, key: &str) -> String {
    format!("{}.{key}", file.architecture().unwrap_or("?"))
}

fn positive(file: &GgufFile, key: &str, v: Option<f32>, default: f32) -> Result<f32, ModelError> {
    match v {
        None => Ok(default),
        Some(x) if x > 0.0 => Ok(x),
        Some(x) => Err(ModelError::BadKey {
            key: arch_key(file, key),
            why: format!("{x} is not positive"),
        }),
    }
}

/// An integer, or an array whose elements are all the same integer (llama.cpp allows per-layer
/// arrays for head counts; layers with different widths are not supported here).
fn uniform_int(v: &Value) -> Option<u64> {
    if let Some(arr) = v.as_array() {
        let vals = arr.to_int_vec()?;
        let first = *vals.first()?;
        if vals.iter().any(|&x| x != first) {
            return None;
        }
        return u64::try_from(first).ok();
    }
    u64::try_from(v.as_int()?).ok()
}

/// Sliding-window layers: an explicit per-layer bool array, or a period `n` where every `n`th
/// layer (the last of each period) is global, as llama.cpp's `set_swa_pattern`.
fn swa_pattern(file: &GgufFile, n_layer: usize, default: u64) -> Result<Vec<bool>, ModelError> {
    let key = "attention.sliding_window_pattern";
    let Some(v) = file.arch_key(key) else {
        return Ok(period_pattern(n_layer, default));
    };
    if let Some(arr) = v.as_array() {
        let flags: Option<Vec<bool>> = arr.iter().map(|e| e.as_bool()).collect();
        return match flags {
            Some(f) if f.len() == n_layer => Ok(f),
            _ => Err(ModelError::BadKey {
                key: arch_key(file, key),
                why: format!("expected {n_layer} booleans"),
            }),
        };
    }
    match v.as_int().and_then(|n| u64::try_from(n).ok()) {
        Some(n) => Ok(period_pattern(n_layer, n)),
        None => Err(ModelError::BadKey {
            key: arch_key(file, key),
            why: "expected a period or a per-layer boolean array".into(),
        }),
    }
}

fn period_pattern(n_layer: usize, n: u64) -> Vec<bool> {
    (0..n_layer as u64)
        .map(|il| n == 0 || il % n < n - 1)
        .collect()
}
