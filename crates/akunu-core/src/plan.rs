//! The plan: the typed op list of one forward pass, built once at load.
//!
//! Plan: walk the [`ArchDescriptor`] and emit, per layer, the ops of a pre-norm decoder block
//! (norm, q/k/v projections, optional QK-norm, RoPE, KV-cache store, attention, output
//! projection, optional post-norm, residual add, and the same for the gated feed-forward), then
//! the final norm and the logits. Ops name activation buffers ([`Buf`]) and weights
//! ([`WeightId`]) and carry every constant they need, so a backend lowers the list once and
//! never looks at the architecture, a tensor name or the metadata again. The token count of a
//! pass is not part of the plan: every op applies to all rows of the batch, except the ops
//! after [`Op::SelectOutputs`], which see only the rows whose logits were asked for.

use crate::arch::{Activation, ArchDescriptor, RopeStyle};
use crate::config::ModelConfig;
use crate::model::{Model, WeightId};
use crate::ModelError;

/// Activation buffers of a pass; each holds one row per token of the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The residual stream, `n_embd` wide.
    Residual,
    /// A normalised copy of the residual, `n_embd` wide.
    Normed,
    Q,
    K,
    V,
    /// Attention output before the output projection, `n_head * head_dim_v` wide.
    Attn,
    /// A block's output (attention or feed-forward) before the residual add, `n_embd` wide.
    Out,
    Gate,
    Up,
}

impl Buf {
    pub const ALL: [Buf; 9] = [
        Buf::Residual,
        Buf::Normed,
        Buf::Q,
        Buf::K,
        Buf::V,
        Buf::Attn,
        Buf::Out,
        Buf::Gate,
        Buf::Up,
    ];

    /// Row width of the buffer for a model.
    pub fn width(self, c: &ModelConfig) -> usize {
        match self {
            Buf::Residual | Buf::Normed | Buf::Out => c.n_embd,
            Buf::Q => c.n_head * c.head_dim,
            Buf::K => c.n_head_kv * c.head_dim,
            Buf::V => c.n_head_kv * c.head_dim_v,
            Buf::Attn => c.n_head * c.head_dim_v,
            Buf::Gate | Buf::Up => c.n_ff,
        }
    }
}

/// The RoPE of one layer: rotates `n_rot` dimensions of each `head_dim`-wide head.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub style: RopeStyle,
    pub n_rot: usize,
    pub head_dim: usize,
    /// `inv_freq[i]` for pair i: `freq_scale * base^(-2i/n_rot) / factor[i]`; the angle of a
    /// position p is `p * inv_freq[i]`.
    pub inv_freq: Vec<f32>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `Residual[t] = table[token[t]] * scale`.
    Embed { table: WeightId, scale: f32 },
    /// RMSNorm of each `group`-wide slice of `src` rows (the whole row, or one head) into `dst`
    /// (which may be `src`), times `weight` (`group` values).
    RmsNorm {
        src: Buf,
        dst: Buf,
        weight: WeightId,
        group: usize,
        eps: f32,
    },
    /// `dst[t] = weight · src[t] (+ bias)`.
    MatMul {
        weight: WeightId,
        bias: Option<WeightId>,
        src: Buf,
        dst: Buf,
    },
    /// Rotates each head of `buf` by the token's position.
    Rope { buf: Buf, rope: Rope },
    /// Writes K and V rows into the layer's cache at each token's (slot, position).
    StoreKv { layer: usize },
    /// Causal attention of `Q` rows over the layer's cache into `Attn`.
    Attention {
        layer: usize,
        scale: f32,
        /// Keys at least this many positions behind the query are masked.
        window: Option<usize>,
        softcap: Option<f32>,
    },
    /// `Gate = act(Gate) * Up`.
    GatedActivation { act: Activation },
    /// `Residual += src`.
    AddResidual { src: Buf },
    /// Keep only the rows whose logits were asked for; later ops see those rows only.
    SelectOutputs,
    /// `logits[t] = weight · Normed[t]`, soft-capped if asked.
    Logits {
        weight: WeightId,
        softcap: Option<f32>,
    },
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub ops: Vec<Op>,
    /// A label per op for statistics and profiles (`"blk.3.attn_q"`).
    pub labels: Vec<String>,
}

struct Builder {
    ops: Vec<Op>,
    labels: Vec<String>,
}

impl Builder {
    fn push(&mut self, label: impl Into<String>, op: Op) {
        self.ops.push(op);
        self.labels.push(label.into());
    }
}

impl Plan {
    /// Builds the plan and registers (and shape-checks) every weight it uses in `model`.
    pub fn build(model: &mut Model) -> Result<Plan, ModelError> {
        let arch: ArchDescriptor = model.arch.clone();
        let c = model.config.clone();
        let mut b = Builder {
            ops: Vec::new(),
            labels: Vec::new(),
        };
        let q_width = c.n_head * c.head_dim;
        let k_width = c.n_head_kv * c.head_dim;
        let v_width = c.n_head_kv * c.head_dim_v;
        let attn_width = c.n_head * c.head_dim_v;

        let table = model.weight("token_embd.weight", c.n_embd, c.n_vocab)?;
        b.push(
            "token_embd",
            Op::Embed {
                table,
                scale: arch.embedding_scale.unwrap_or(1.0),
            },
        );
        let freq_factors = if arch.rope_freq_factors {
            let id = model.weight("rope_freqs.weight", c.n_rot / 2, 1)?;
            let f = model.weight_f32(id)?;
            if f.iter().any(|x| !x.is_finite() || *x <= 0.0) {
                return Err(ModelError::BadTensor {
                    name: "rope_freqs.weight".into(),
                    why: "RoPE frequency factors must be positive".into(),
                });
            }
            Some(f)
        } else {
            None
        };

        for il in 0..c.n_layer {
            let p = |s: &str| format!("blk.{il}.{s}");
            let swa = c.swa_layers[il];
            let norm =
                |model: &mut Model, name: &str, width: usize| model.weight(&p(name), width, 1);

            let w = norm(model, "attn_norm.weight", c.n_embd)?;
            b.push(
                p("attn_norm"),
                rms(Buf::Residual, Buf::Normed, w, c.n_embd, c.rms_eps),
            );
            for (name, dst, width) in [
                ("attn_q", Buf::Q, q_width),
                ("attn_k", Buf::K, k_width),
                ("attn_v", Buf::V, v_width),
            ] {
                let weight = model.weight(&p(&format!("{name}.weight")), c.n_embd, width)?;
                let bias = if arch.qkv_bias {
                    Some(model.weight(&p(&format!("{name}.bias")), width, 1)?)
                } else {
                    None
                };
                b.push(
                    p(name),
                    Op::MatMul {
                        weight,
                        bias,
                        src: Buf::Normed,
                        dst,
                    },
                );
            }
            if arch.qk_norm {
                for (name, buf) in [("attn_q_norm", Buf::Q), ("attn_k_norm", Buf::K)] {
                    let w = norm(model, &format!("{name}.weight"), c.head_dim)?;
                    b.push(p(name), rms(buf, buf, w, c.head_dim, c.rms_eps));
                }
            }
            let (base, scale) = if swa {
                (c.rope_base_swa, c.rope_freq_scale_swa)
            } else {
                (c.rope_base, c.rope_freq_scale)
            };
            let rope = Rope {
                style: arch.rope,
                n_rot: c.n_rot,
                head_dim: c.head_dim,
                inv_freq: inv_freq(c.n_rot, base, scale, freq_factors.as_deref()),
            };
            b.push(
                p("rope_q"),
                Op::Rope {
                    buf: Buf::Q,
                    rope: rope.clone(),
                },
            );
            b.push(p("rope_k"), Op::Rope { buf: Buf::K, rope });
            b.push(p("kv_store"), Op::StoreKv { layer: il });
            b.push(
                p("attention"),
                Op::Attention {
                    layer: il,
                    scale: c.attn_scale,
                    window: if swa { c.sliding_window } else { None },
                    softcap: arch.attn_softcap,
                },
            );
            let wo = model.weight(&p("attn_output.weight"), attn_width, c.n_embd)?;
            b.push(
                p("attn_output"),
                Op::MatMul {
                    weight: wo,
                    bias: None,
                    src: Buf::Attn,
                    dst: Buf::Out,
                },
            );
            if arch.post_attn_norm {
                let w = norm(model, "post_attention_norm.weight", c.n_embd)?;
                b.push(
                    p("post_attention_norm"),
                    rms(Buf::Out, Buf::Out, w, c.n_embd, c.rms_eps),
                );
            }
            b.push(p("attn_residual"), Op::AddResidual { src: Buf::Out });

            let w = norm(model, "ffn_norm.weight", c.n_embd)?;
            b.push(
                p("ffn_norm"),
                rms(Buf::Residual, Buf::Normed, w, c.n_embd, c.rms_eps),
            );
            for (name, dst) in [("ffn_gate", Buf::Gate), ("ffn_up", Buf::Up)] {
                let weight = model.weight(&p(&format!("{name}.weight")), c.n_embd, c.n_ff)?;
                b.push(
                    p(name),
                    Op::MatMul {
                        weight,
                        bias: None,
                        src: Buf::Normed,
                        dst,
                    },
                );
            }
            b.push(
                p("ffn_act"),
                Op::GatedActivation {
                    act: arch.activation,
                },
            );
            let wd = model.weight(&p("ffn_down.weight"), c.n_ff, c.n_embd)?;
            b.push(
                p("ffn_down"),
                Op::MatMul {
                    weight: wd,
                    bias: None,
                    src: Buf::Gate,
                    dst: Buf::Out,
                },
            );
            if arch.post_ffn_norm {
                let w = norm(model, "post_ffw_norm.weight", c.n_embd)?;
                b.push(
                    p("post_ffw_norm"),
                    rms(Buf::Out, Buf::Out, w, c.n_embd, c.rms_eps),
                );
            }
            b.push(p("ffn_residual"), Op::AddResidual { src: Buf::Out });
        }

        b.push("select_outputs", Op::SelectOutputs);
        let w = model.weight("output_norm.weight", c.n_embd, 1)?;
        b.push(
            "output_norm",
            rms(Buf::Residual, Buf::Normed, w, c.n_embd, c.rms_eps),
        );
        let output = if arch.tie_embeddings {
            table
        } else {
            model.weight("output.weight", c.n_embd, c.n_vocab)?
        };
        b.push(
            "output",
            Op::Logits {
                weight: output,
                softcap: arch.final_softcap,
            },
        );
        Ok(Plan {
            ops: b.ops,
            labels: b.labels,
        })
    }
}

fn rms(src: Buf, dst: Buf, weight: WeightId, group: usize, eps: f32) -> Op {
    Op::RmsNorm {
        src,
        dst,
        weight,
        group,
        eps,
    }
}

/// Per-pair inverse frequencies, computed in f64 once so every backend rotates by the same
/// angles.
pub fn inv_freq(n_rot: usize, base: f32, freq_scale: f32, factors: Option<&[f32]>) -> Vec<f32> {
    (0..n_rot / 2)
        .map(|i| {
            let f = (base as f64).powf(-2.0 * i as f64 / n_rot as f64) * freq_scale as f64;
            let factor = factors.and_then(|fs| fs.get(i)).copied().unwrap_or(1.0) as f64;
            (f / factor) as f32
        })
        .collect()
}
