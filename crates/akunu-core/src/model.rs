//! A loaded model: the memory-mapped file, its descriptor, config, weight table and tokenizer.
//!
//! Weights are never copied: the table records each tensor's type, shape and byte range in the
//! map, and backends read (CPU) or upload (GPU) those bytes. Every tensor the plan uses is looked
//! up and shape-checked here, once, so a file with a missing or misshapen tensor fails at load
//! with its name instead of misbehaving later.

use std::path::Path;
use std::sync::Arc;

use akunu_formats::gguf::GgufFile;
use akunu_quant::GgmlType;
use akunu_tokenizer::Tokenizer;

use crate::arch::ArchDescriptor;
use crate::config::ModelConfig;
use crate::plan::Plan;
use crate::ModelError;

/// Index of a tensor in [`Model::weights`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WeightId(pub u32);

/// One tensor the plan uses: `rows` rows of `cols` elements of type `ty`.
#[derive(Clone, Debug)]
pub struct Weight {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// Byte range in the file.
    pub start: usize,
    pub len: usize,
}

pub struct Model {
    pub file: Arc<GgufFile>,
    pub arch: ArchDescriptor,
    pub config: ModelConfig,
    pub tokenizer: Tokenizer,
    /// The forward pass, built once at load.
    pub plan: Plan,
    weights: Vec<Weight>,
}

impl Model {
    /// Opens a GGUF file and reads everything the engine needs from it.
    pub fn load(path: impl AsRef<Path>) -> Result<Model, ModelError> {
        let path = path.as_ref();
        let file = GgufFile::open(path).map_err(|e| ModelError::Format {
            path: path.display().to_string(),
            source: e,
        })?;
        Model::from_gguf(Arc::new(file))
    }

    pub fn from_gguf(file: Arc<GgufFile>) -> Result<Model, ModelError> {
        let arch = ArchDescriptor::from_gguf(&file)?;
        let config = ModelConfig::from_gguf(&file, &arch)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        if tokenizer.n_vocab() > config.n_vocab {
            return Err(ModelError::BadTensor {
                name: "token_embd.weight".into(),
                why: format!(
                    "{} rows for a vocabulary of {} tokens",
                    config.n_vocab,
                    tokenizer.n_vocab()
                ),
            });
        }
        let mut model = Model {
            file,
            arch,
            config,
            tokenizer,
            plan: Plan {
                ops: Vec::new(),
                labels: Vec::new(),
            },
            weights: Vec::new(),
        };
        model.plan = Plan::build(&mut model)?;
        Ok(model)
    }

    /// Registers a tensor, checking it is `[cols, rows]` (ggml order; a 1-D tensor when
    /// `rows` is 1) of a type the engine computes with.
    pub(crate) fn weight(
        &mut self,
        name: &str,
        cols: usize,
        rows: usize,
    ) -> Result<WeightId, ModelError> {
        let info = self
            .file
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor { name: name.into() })?;
        let dims = &info.dims;
        let want_1d = rows == 1;
        let shape_ok = match dims.as_slice() {
            [c] => want_1d && *c == cols as u64,
            [c, r] => *c == cols as u64 && *r == rows as u64,
            [c, r, rest @ ..] => {
                *c == cols as u64 && *r == rows as u64 && rest.iter().all(|&d| d == 1)
            }
            [] => false,
        };
        if !shape_ok {
            return Err(ModelError::BadTensor {
                name: name.into(),
                why: format!("shape {dims:?}, expected [{cols}, {rows}]"),
            });
        }
        if !info.ty.is_supported() || matches!(info.ty, GgmlType::Q8_1 | GgmlType::Q8_K) {
            return Err(ModelError::BadTensor {
                name: name.into(),
                why: format!("tensor type {} is not supported for computation", info.ty),
            });
        }
        let start = usize::try_from(self.file.data_offset() + info.offset).map_err(|_| {
            ModelError::BadTensor {
                name: name.into(),
                why: "offset beyond the address space".into(),
            }
        })?;
        let len = info.n_bytes as usize;
        if self.file.bytes().get(start..start + len).is_none() {
            return Err(ModelError::BadTensor {
                name: name.into(),
                why: "data past the end of the file".into(),
            });
        }
        if let Some(i) = self.weights.iter().position(|w| w.name == name) {
            return Ok(WeightId(i as u32));
        }
        self.weights.push(Weight {
            name: name.into(),
            ty: info.ty,
            rows,
            cols,
            start,
            len,
        });
        Ok(WeightId(self.weights.len() as u32 - 1))
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.file.tensor(name).is_some()
    }

    pub fn weights(&self) -> &[Weight] {
        &self.weights
    }

    pub fn weight_info(&self, id: WeightId) -> &Weight {
        &self.weights[id.0 as usize]
    }

    /// The bytes of a registered tensor.
    pub fn weight_bytes(&self, id: WeightId) -> &[u8] {
        let w = &self.weights[id.0 as usize];
        &self.file.bytes()[w.start..w.start + w.len]
    }

    /// A 1-D f32 view of a small tensor (norm weights, biases, RoPE factors), converted from
    /// whatever type it is stored in.
    pub fn weight_f32(&self, id: WeightId) -> Result<Vec<f32>, ModelError> {
        let w = self.weight_info(id);
        let mut out = vec![0.0f32; w.rows * w.cols];
        akunu_quant::dequantize(w.ty, self.weight_bytes(id), &mut out).map_err(|e| {
            ModelError::BadTensor {
                name: w.name.clone(),
                why: e.to_string(),
            }
        })?;
        Ok(out)
    }

    /// Total bytes of the file's tensors (what decode streams per token, roughly).
    pub fn tensor_bytes(&self) -> u64 {
        self.file.tensors().iter().map(|t| t.n_bytes).sum()
    }
}
