//! MLX model directories and their quantized tensors.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{dequantize_row, ConfigError, QuantConfig, QuantParams, ScaleDtype};
use crate::safetensors::{Checkpoint, Dtype, TensorView};

/// `config.json` files are a few kilobytes; the bound only stops a hostile file from being read
/// into memory whole.
const MAX_CONFIG_LEN: u64 = 16 << 20;

/// Errors from opening an MLX model directory or validating a quantized tensor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Safetensors(#[from] crate::safetensors::Error),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {len} bytes exceeds the {limit}-byte limit for a config", path.display())]
    ConfigTooLarge { path: PathBuf, len: u64, limit: u64 },
    #[error("{}: malformed config: {source}", path.display())]
    ConfigJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: {source}", path.display())]
    Config {
        path: PathBuf,
        #[source]
        source: ConfigError,
    },
    #[error("module `{module}` is quantized (it has `{module}.scales`) but the config has no quantization section")]
    NoQuantConfig { module: String },
    #[error("module `{module}` is quantized (it has `{module}.scales`) but the config disables quantization for it")]
    QuantizationDisabled { module: String },
    #[error("the config quantizes module `{module}` but its weight has no `{module}.scales`")]
    NotQuantized { module: String },
    #[error("module `{module}` has `{module}.scales` but no `{tensor}`")]
    MissingCompanion { module: String, tensor: String },
    #[error("module `{module}`: `{tensor}` is {dtype}, expected {expected}")]
    Dtype {
        module: String,
        tensor: String,
        dtype: Dtype,
        expected: &'static str,
    },
    #[error("module `{module}`: {detail}")]
    Shape { module: String, detail: String },
}

/// An MLX model directory: `config.json` plus safetensors weights, single-file or sharded.
pub struct MlxModel {
    dir: PathBuf,
    config: Value,
    quantization: Option<QuantConfig>,
    checkpoint: Checkpoint,
    quantized: BTreeMap<String, Layout>,
}

/// What validation learned about one quantized module.
struct Layout {
    params: QuantParams,
    scale_dtype: ScaleDtype,
    shape: Vec<usize>,
}

/// A quantized weight: packed U32 codes `[.., N, K*bits/32]` with scales and biases
/// `[.., N, K/group_size]`, describing a logical `[.., N, K]` matrix.
#[derive(Clone, Debug)]
pub struct QuantizedTensor<'a> {
    module: &'a str,
    params: QuantParams,
    scale_dtype: ScaleDtype,
    shape: Vec<usize>,
    weight: TensorView<'a>,
    scales: TensorView<'a>,
    biases: TensorView<'a>,
}

impl MlxModel {
    /// Opens `dir`, reads its quantization config and validates every quantized module: a module
    /// is quantized exactly when `<module>.scales` exists, as mlx-lm decides when loading.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, Error> {
        let dir = dir.as_ref().to_path_buf();
        let config_path = dir.join("config.json");
        let config = read_config(&config_path)?;
        let quantization = QuantConfig::from_config(&config).map_err(|source| Error::Config {
            path: config_path.clone(),
            source,
        })?;
        let checkpoint = Checkpoint::open(&dir)?;

        let mut quantized = BTreeMap::new();
        for name in checkpoint.names() {
            let Some(module) = name.strip_suffix(".scales") else {
                continue;
            };
            let owned = || module.to_owned();
            let Some(config) = &quantization else {
                return Err(Error::NoQuantConfig { module: owned() });
            };
            let Some(params) = config.params_for(module) else {
                return Err(Error::QuantizationDisabled { module: owned() });
            };
            let companion = |suffix: &str| {
                let tensor = format!("{module}.{suffix}");
                checkpoint.tensor(&tensor).ok_or(Error::MissingCompanion {
                    module: owned(),
                    tensor,
                })
            };
            let (weight, biases) = (companion("weight")?, companion("biases")?);
            let scales = checkpoint.get(name)?;
            let layout = validate(module, params, weight, scales, biases)?;
            quantized.insert(owned(), layout);
        }
        if let Some(config) = &quantization {
            for (module, params) in config.overrides() {
                let has_weight = checkpoint.contains(&format!("{module}.weight"));
                if params.is_some() && has_weight && !quantized.contains_key(module) {
                    return Err(Error::NotQuantized {
                        module: module.to_owned(),
                    });
                }
            }
        }
        Ok(MlxModel {
            dir,
            config,
            quantization,
            checkpoint,
            quantized,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The parsed `config.json`.
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// The quantization section, `None` for an unquantized model.
    pub fn quantization(&self) -> Option<&QuantConfig> {
        self.quantization.as_ref()
    }

    /// All tensors, quantized or not (norms, unquantized layers, the packed parts themselves).
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    /// Paths of the quantized modules, in lexicographic order.
    pub fn quantized_modules(&self) -> impl Iterator<Item = &str> {
        self.quantized.keys().map(String::as_str)
    }

    /// The quantized module at `module` (the tensor names without `.weight`).
    pub fn quantized(&self, module: &str) -> Option<QuantizedTensor<'_>> {
        let (module, layout) = self.quantized.get_key_value(module)?;
        let part = |suffix: &str| self.checkpoint.tensor(&format!("{module}.{suffix}"));
        Some(QuantizedTensor {
            module,
            params: layout.params,
            scale_dtype: layout.scale_dtype,
            shape: layout.shape.clone(),
            weight: part("weight")?,
            scales: part("scales")?,
            biases: part("biases")?,
        })
    }
}

impl fmt::Debug for MlxModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MlxModel")
            .field("dir", &self.dir)
            .field("quantization", &self.quantization)
            .field("quantized_modules", &self.quantized.len())
            .finish_non_exhaustive()
    }
}

fn read_config(path: &Path) -> Result<Value, Error> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_CONFIG_LEN {
        return Err(Error::ConfigTooLarge {
            path: path.to_path_buf(),
            len,
            limit: MAX_CONFIG_LEN,
        });
    }
    let bytes = std::fs::read(path).map_err(io)?;
    serde_json::from_slice(&bytes).map_err(|source| Error::ConfigJson {
        path: path.to_path_buf(),
        source,
    })
}

/// Checks dtypes and shapes of one module's three tensors against `params`.
fn validate(
    module: &str,
    params: QuantParams,
    weight: TensorView<'_>,
    scales: TensorView<'_>,
    biases: TensorView<'_>,
) -> Result<Layout, Error> {
    let dtype_error = |view: TensorView<'_>, expected| Error::Dtype {
        module: module.to_owned(),
        tensor: view.name().to_owned(),
        dtype: view.dtype(),
        expected,
    };
    let shape_error = |detail: String| Error::Shape {
        module: module.to_owned(),
        detail,
    };
    if weight.dtype() != Dtype::U32 {
        return Err(dtype_error(weight, "U32"));
    }
    let scale_dtype = ScaleDtype::from_dtype(scales.dtype())
        .ok_or_else(|| dtype_error(scales, "F16, BF16 or F32"))?;
    if biases.dtype() != scales.dtype() {
        return Err(dtype_error(biases, scales.dtype().name()));
    }
    let (w, s) = (weight.shape(), scales.shape());
    if biases.shape() != s {
        return Err(shape_error(format!(
            "biases {:?} and scales {s:?} differ",
            biases.shape()
        )));
    }
    let (Some((&words, w_lead)), Some((&groups, s_lead))) = (w.split_last(), s.split_last()) else {
        return Err(shape_error(
            "weight and scales must have at least one dimension".into(),
        ));
    };
    if w.len() < 2 || w_lead != s_lead {
        return Err(shape_error(format!(
            "weight {w:?} and scales {s:?} must agree on every dimension but the last, and have \
             at least two"
        )));
    }
    let cols = groups.checked_mul(params.group_size());
    let fits = cols
        .and_then(|k| k.checked_mul(params.bits() as usize))
        .zip(words.checked_mul(32))
        .is_some_and(|(needed, held)| needed == held);
    let (Some(cols), true) = (cols, fits) else {
        return Err(shape_error(format!(
            "weight {w:?} holds {words} u32 per row but scales {s:?} imply {groups} groups of {} \
             {}-bit codes",
            params.group_size(),
            params.bits()
        )));
    };
    let mut shape = w_lead.to_vec();
    shape.push(cols);
    Ok(Layout {
        params,
        scale_dtype,
        shape,
    })
}

impl<'a> QuantizedTensor<'a> {
    /// Validates the three tensors of a quantized module against `params`.
    pub fn new(
        module: &'a str,
        params: QuantParams,
        weight: TensorView<'a>,
        scales: TensorView<'a>,
        biases: TensorView<'a>,
    ) -> Result<Self, Error> {
        let layout = validate(module, params, weight, scales, biases)?;
        Ok(QuantizedTensor {
            module,
            params,
            scale_dtype: layout.scale_dtype,
            shape: layout.shape,
            weight,
            scales,
            biases,
        })
    }

    /// The module path, e.g. `model.layers.0.self_attn.q_proj`.
    pub fn module(&self) -> &'a str {
        self.module
    }

    pub fn params(&self) -> QuantParams {
        self.params
    }

    pub fn scale_dtype(&self) -> ScaleDtype {
        self.scale_dtype
    }

    /// The logical shape `[.., N, K]` of the dequantized matrix.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Rows over all leading dimensions (N for a linear layer, E·N for stacked experts).
    pub fn rows(&self) -> usize {
        self.shape[..self.shape.len() - 1].iter().product()
    }

    /// Values per row (K).
    pub fn cols(&self) -> usize {
        self.shape[self.shape.len() - 1]
    }

    pub fn weight(&self) -> TensorView<'a> {
        self.weight
    }

    pub fn scales(&self) -> TensorView<'a> {
        self.scales
    }

    pub fn biases(&self) -> TensorView<'a> {
        self.biases
    }

    /// Dequantizes row `row` into `out`, exactly as [`dequantize_row`] documents.
    ///
    /// # Panics
    /// If `row >= self.rows()` or `out.len() != self.cols()`.
    pub fn dequantize_row_into(&self, row: usize, out: &mut [f32]) {
        assert!(row < self.rows(), "row {row} of {}", self.rows());
        assert_eq!(out.len(), self.cols(), "output length");
        let packed = self.cols() / 8 * self.params.bits() as usize;
        let scales = self.cols() / self.params.group_size() * self.scale_dtype.size();
        let slice = |view: TensorView<'a>, len: usize| &view.data()[row * len..(row + 1) * len];
        dequantize_row(
            self.params,
            self.scale_dtype,
            slice(self.weight, packed),
            slice(self.scales, scales),
            slice(self.biases, scales),
            out,
        );
    }

    /// The whole tensor dequantized to f32, row-major in [`QuantizedTensor::shape`].
    pub fn dequantize(&self) -> Vec<f32> {
        let cols = self.cols();
        let mut out = vec![0f32; self.rows() * cols];
        if cols > 0 {
            for (row, values) in out.chunks_exact_mut(cols).enumerate() {
                self.dequantize_row_into(row, values);
            }
        }
        out
    }
}
