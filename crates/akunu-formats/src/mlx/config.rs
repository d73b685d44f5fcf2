//! The quantization section of an MLX `config.json`.
//!
//! mlx-lm writes `"quantization": {"group_size": G, "bits": B, "mode": "affine"}` and mirrors it
//! under `quantization_config` for Hugging Face tooling. Mixed-precision conversions add entries
//! keyed by module path: an object of parameters (`{"group_size": 32, "bits": 8}`) or `false` for
//! a module left unquantized. As in `mlx.nn.quantize`, fields an object leaves out take MLX's
//! affine defaults (64, 4), not the model-wide values.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::QuantParams;

/// Model-wide quantization parameters plus per-module overrides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantConfig {
    default: QuantParams,
    overrides: BTreeMap<String, Option<QuantParams>>,
}

/// A quantization section that this reader cannot use, with the JSON key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("`{key}` must be {expected}")]
    Type { key: String, expected: &'static str },
    #[error("`{key}`: {value} bits is not supported (MLX affine: 2, 3, 4, 5, 6, 8)")]
    Bits { key: String, value: u64 },
    #[error("`{key}`: group size {value} is not supported (MLX affine: 32, 64, 128)")]
    GroupSize { key: String, value: u64 },
    #[error("`{key}`: quantization mode `{mode}` is not supported, only affine")]
    Mode { key: String, mode: String },
    #[error("quantization_config describes `{method}` quantization, not MLX")]
    Foreign { method: String },
}

/// Keys of a quantization object that are parameters rather than module paths.
const PARAM_KEYS: [&str; 3] = ["group_size", "bits", "mode"];

impl QuantConfig {
    /// Reads the `quantization` section of a parsed `config.json`, falling back to
    /// `quantization_config`. `Ok(None)` means the model is not quantized.
    ///
    /// A `quantization_config` with a `quant_method` comes from another quantizer (GPTQ, AWQ,
    /// FP8, ...) whose tensors are laid out differently, and is refused.
    pub fn from_config(config: &Value) -> Result<Option<Self>, ConfigError> {
        let (name, section) = match (
            config.get("quantization"),
            config.get("quantization_config"),
        ) {
            (Some(q), _) if !q.is_null() => ("quantization", q),
            (_, Some(q)) if !q.is_null() => {
                if let Some(method) = q.get("quant_method") {
                    let method = method
                        .as_str()
                        .map_or_else(|| method.to_string(), str::to_owned);
                    return Err(ConfigError::Foreign { method });
                }
                ("quantization_config", q)
            }
            _ => return Ok(None),
        };
        let section = section.as_object().ok_or_else(|| ConfigError::Type {
            key: name.to_owned(),
            expected: "an object",
        })?;
        let default = params(section, name)?;
        let mut overrides = BTreeMap::new();
        for (key, value) in section {
            if PARAM_KEYS.contains(&key.as_str()) {
                continue;
            }
            let module_key = || format!("{name}.{key}");
            let entry = match value {
                Value::Bool(false) => None,
                Value::Bool(true) => Some(default),
                Value::Object(fields) => Some(params(fields, &module_key())?),
                // Scalars are annotations some tools add (a method name, a version), not modules.
                _ => continue,
            };
            overrides.insert(key.clone(), entry);
        }
        Ok(Some(QuantConfig { default, overrides }))
    }

    /// The model-wide parameters.
    pub fn default_params(&self) -> QuantParams {
        self.default
    }

    /// The parameters for the module at `path` (e.g. `model.layers.0.mlp.down_proj`), or `None`
    /// when the config disables quantization for it.
    pub fn params_for(&self, path: &str) -> Option<QuantParams> {
        self.overrides
            .get(path)
            .copied()
            .unwrap_or(Some(self.default))
    }

    /// The per-module entries: `None` for modules the config leaves unquantized.
    pub fn overrides(&self) -> impl Iterator<Item = (&str, Option<QuantParams>)> {
        self.overrides.iter().map(|(k, &v)| (k.as_str(), v))
    }
}

/// Parses `group_size`, `bits` and `mode` of one quantization object.
fn params(fields: &Map<String, Value>, key: &str) -> Result<QuantParams, ConfigError> {
    let number = |field: &str, default: u64| match fields.get(field) {
        None => Ok(default),
        Some(v) => v.as_u64().ok_or_else(|| ConfigError::Type {
            key: format!("{key}.{field}"),
            expected: "a non-negative integer",
        }),
    };
    if let Some(mode) = fields.get("mode") {
        let mode_key = || format!("{key}.mode");
        let mode = mode.as_str().ok_or_else(|| ConfigError::Type {
            key: mode_key(),
            expected: "a string",
        })?;
        if mode != "affine" {
            return Err(ConfigError::Mode {
                key: mode_key(),
                mode: mode.to_owned(),
            });
        }
    }
    let group_size = number("group_size", QuantParams::DEFAULT.group_size() as u64)?;
    let bits = number("bits", u64::from(QuantParams::DEFAULT.bits()))?;
    let bits_ok = u32::try_from(bits)
        .ok()
        .filter(|b| super::SUPPORTED_BITS.contains(b));
    let Some(bits) = bits_ok else {
        return Err(ConfigError::Bits {
            key: format!("{key}.bits"),
            value: bits,
        });
    };
    let group_ok = usize::try_from(group_size)
        .ok()
        .and_then(|g| QuantParams::new(g, bits));
    group_ok.ok_or(ConfigError::GroupSize {
        key: format!("{key}.group_size"),
        value: group_size,
    })
}
