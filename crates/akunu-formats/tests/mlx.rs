//! MLX reader tests that need no reference data: packing hand vectors (each checked against
//! `mx.dequantize` when written), the rounding of the reference dequantization, config parsing,
//! and model directories built here with a bit-by-bit packer.

use std::path::Path;

use akunu_formats::mlx::{
    dequantize_row, unpack_codes, ConfigError, Error, MlxModel, QuantConfig, QuantParams,
    QuantizedTensor, ScaleDtype,
};
use akunu_formats::safetensors::{Checkpoint, Dtype};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

/// Code lists and the bytes MLX stores for them (little-endian bit stream, LSB first).
const HAND_VECTORS: [(u32, &[u8], &[u8]); 6] = [
    (2, &[1, 3, 2, 1], &[0x6D]),
    (3, &[5, 2, 7, 1, 6, 3, 4, 6], &[0xD5, 0xE3, 0xD1]),
    (
        4,
        &[8, 9, 10, 11, 12, 13, 14, 15],
        &[0x98, 0xBA, 0xDC, 0xFE],
    ),
    (
        5,
        &[17, 30, 3, 12, 25, 8, 21, 14],
        &[0xD1, 0x0F, 0x96, 0x51, 0x75],
    ),
    (6, &[45, 9, 62, 33], &[0x6D, 0xE2, 0x87]),
    (8, &[0xA7, 0x3C], &[0xA7, 0x3C]),
];

#[test]
fn unpacks_hand_vectors() {
    // The 4-bit vector as the u32 word it is stored as: nibbles from the lowest up.
    let mut codes = [0u8; 8];
    unpack_codes(&0xFEDC_BA98u32.to_le_bytes(), 4, &mut codes);
    assert_eq!(codes, [8, 9, 10, 11, 12, 13, 14, 15]);

    for (bits, want, packed) in HAND_VECTORS {
        let mut got = vec![0u8; want.len()];
        unpack_codes(packed, bits, &mut got);
        assert_eq!(got, want, "{bits}-bit");
        assert_eq!(pack(want, bits), packed, "{bits}-bit test packer");
    }
    // 3-bit value 2 straddles bytes 0 and 1: (b0 >> 6) | ((b1 & 1) << 2).
    let b = [0xD5u8, 0xE3];
    assert_eq!((b[0] >> 6) | ((b[1] & 1) << 2), 7);
    // 6-bit value 1: (b0 >> 6) | ((b1 & 0xF) << 2).
    let b = [0x6Du8, 0xE2];
    assert_eq!((b[0] >> 6) | ((b[1] & 0xF) << 2), 9);
}

/// Packs codes bit by bit: bit `j` of code `i` goes to stream bit `i * bits + j`.
fn pack(codes: &[u8], bits: u32) -> Vec<u8> {
    let bits = bits as usize;
    let mut out = vec![0u8; (codes.len() * bits).div_ceil(8)];
    for (i, &code) in codes.iter().enumerate() {
        for j in 0..bits {
            if code >> j & 1 == 1 {
                let bit = i * bits + j;
                out[bit / 8] |= 1 << (bit % 8);
            }
        }
    }
    out
}

/// `v` rounded to a scale dtype (F16, BF16 or F32) and widened back.
fn round_to(dtype: Dtype, v: f32) -> f32 {
    match dtype {
        Dtype::F16 => f16::from_f32(v).to_f32(),
        Dtype::Bf16 => bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// `v` stored as a little-endian scale of `dtype` (F16, BF16 or F32).
fn encode(dtype: Dtype, v: f32) -> Vec<u8> {
    match dtype {
        Dtype::F16 => f16::from_f32(v).to_le_bytes().to_vec(),
        Dtype::Bf16 => bf16::from_f32(v).to_le_bytes().to_vec(),
        _ => v.to_le_bytes().to_vec(),
    }
}

#[test]
fn unpacking_matches_a_bit_by_bit_reading() {
    let mut rng = StdRng::seed_from_u64(11);
    for bits in 1..=8u32 {
        for len in 0..90 {
            let packed: Vec<u8> = (0..(len * bits as usize).div_ceil(8))
                .map(|_| rng.random_range(1..=255))
                .collect();
            let mut got = vec![0u8; len];
            unpack_codes(&packed, bits, &mut got);
            let want: Vec<u8> = (0..len)
                .map(|i| {
                    (0..bits as usize).fold(0u8, |code, j| {
                        let bit = i * bits as usize + j;
                        code | ((packed[bit / 8] >> (bit % 8)) & 1) << j
                    })
                })
                .collect();
            assert_eq!(got, want, "{bits} bits, {len} codes");
        }
    }
}

#[test]
#[should_panic(expected = "cannot hold")]
fn unpacking_refuses_short_input() {
    unpack_codes(&[0xFF; 3], 3, &mut [0u8; 9]);
}

/// MLX rounds `scale * q` to the scale dtype and then rounds the sum with the bias again, and
/// never fuses the multiply-add. Random groups include many values where a single rounding (or a
/// fused multiply-add, for F32) gives a different result; the test insists on finding them.
#[test]
fn dequantization_rounds_like_mlx() {
    let mut rng = StdRng::seed_from_u64(12);
    let params = QuantParams::new(32, 8).unwrap();
    let groups = 512;
    let codes: Vec<u8> = (0..groups * 32)
        .map(|_| rng.random_range(1..=255))
        .collect();
    let scale_values: Vec<f32> = (0..groups).map(|_| rng.random_range(0.001..0.05)).collect();
    let bias_values: Vec<f32> = (0..groups).map(|_| rng.random_range(-6.0..-0.01)).collect();

    for dtype in [Dtype::F16, Dtype::Bf16, Dtype::F32] {
        let round = |v| round_to(dtype, v);
        let scales: Vec<u8> = scale_values
            .iter()
            .flat_map(|&v| encode(dtype, v))
            .collect();
        let biases: Vec<u8> = bias_values.iter().flat_map(|&v| encode(dtype, v)).collect();
        let mut out = vec![0f32; codes.len()];
        let scale_dtype = ScaleDtype::from_dtype(dtype).unwrap();
        dequantize_row(params, scale_dtype, &codes, &scales, &biases, &mut out);
        let mut single_rounding_differs = 0;
        for (i, (&q, &got)) in codes.iter().zip(&out).enumerate() {
            let (s, b) = (round(scale_values[i / 32]), round(bias_values[i / 32]));
            let q = f32::from(q);
            let want = round(round(s * q) + b);
            assert_eq!(got.to_bits(), want.to_bits(), "{dtype:?} value {i}");
            let single = if dtype == Dtype::F32 {
                s.mul_add(q, b)
            } else {
                round((f64::from(s) * f64::from(q) + f64::from(b)) as f32)
            };
            single_rounding_differs += usize::from(single.to_bits() != want.to_bits());
        }
        assert!(
            single_rounding_differs > 100,
            "{dtype:?}: {single_rounding_differs}"
        );
    }
}

#[test]
fn dequantizes_by_group() {
    // 3-bit, group 32: two groups with different scales and biases.
    let params = QuantParams::new(32, 3).unwrap();
    let codes: Vec<u8> = (0..64u8).map(|i| i % 7 + 1).collect();
    let packed = pack(&codes, 3);
    let scales: Vec<u8> = [0.5f32, -0.25]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let biases: Vec<u8> = [1.0f32, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = vec![0f32; 64];
    dequantize_row(params, ScaleDtype::F32, &packed, &scales, &biases, &mut out);
    for (i, &v) in out.iter().enumerate() {
        let q = f32::from(codes[i]);
        let want = if i < 32 {
            0.5 * q + 1.0
        } else {
            -0.25 * q + 3.0
        };
        assert_eq!(v, want, "value {i}");
    }
}

#[test]
fn rejects_unsupported_params() {
    for bits in [2, 3, 4, 5, 6, 8] {
        for group in [32, 64, 128] {
            let p = QuantParams::new(group, bits).unwrap();
            assert_eq!((p.group_size(), p.bits()), (group, bits));
            assert_eq!(p.group_bytes() * 8, group * bits as usize);
        }
    }
    for (group, bits) in [(64, 1), (64, 7), (64, 16), (16, 4), (256, 4), (0, 4)] {
        assert!(QuantParams::new(group, bits).is_none(), "{group} {bits}");
    }
}

fn params(group: usize, bits: u32) -> Option<QuantParams> {
    QuantParams::new(group, bits)
}

#[test]
fn parses_quantization_sections() {
    let config = json!({
        "hidden_size": 64,
        "quantization": {
            "group_size": 32, "bits": 4, "mode": "affine",
            "model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8},
            "model.layers.1.mlp.gate": {"bits": 6},
            "model.layers.2.mlp.gate": {"group_size": 128},
            "lm_head": false,
            "model.embed_tokens": true,
            "note": "scalars are annotations, not modules"
        },
        "quantization_config": {"group_size": 128, "bits": 2}
    });
    let q = QuantConfig::from_config(&config).unwrap().unwrap();
    assert_eq!(q.default_params(), params(32, 4).unwrap());
    assert_eq!(q.params_for("model.layers.0.mlp.down_proj"), params(64, 8));
    // Fields an override leaves out take MLX's affine defaults (64, 4), as nn.quantize does.
    assert_eq!(q.params_for("model.layers.1.mlp.gate"), params(64, 6));
    assert_eq!(q.params_for("model.layers.2.mlp.gate"), params(128, 4));
    assert_eq!(q.params_for("lm_head"), None);
    assert_eq!(q.params_for("model.embed_tokens"), params(32, 4));
    assert_eq!(
        q.params_for("model.layers.9.self_attn.q_proj"),
        params(32, 4)
    );
    assert_eq!(q.params_for("note"), params(32, 4));
    assert_eq!(q.overrides().count(), 5);

    let mirrored = json!({"quantization_config": {"group_size": 128, "bits": 2}});
    let q = QuantConfig::from_config(&mirrored).unwrap().unwrap();
    assert_eq!(q.default_params(), params(128, 2).unwrap());
    let defaults = json!({"quantization": {}});
    let q = QuantConfig::from_config(&defaults).unwrap().unwrap();
    assert_eq!(q.default_params(), QuantParams::DEFAULT);

    for plain in [
        json!({}),
        json!({"quantization": null}),
        json!({"quantization_config": null}),
    ] {
        assert_eq!(QuantConfig::from_config(&plain).unwrap(), None, "{plain}");
    }
}

#[test]
fn rejects_bad_quantization_sections() {
    let err = |config: Value| QuantConfig::from_config(&config).unwrap_err();
    let foreign =
        err(json!({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}));
    assert!(
        matches!(&foreign, ConfigError::Foreign { method } if method == "gptq"),
        "{foreign}"
    );
    for bits in [1u64, 7, 16, 1 << 40] {
        let e = err(json!({"quantization": {"group_size": 64, "bits": bits}}));
        assert!(
            matches!(&e, ConfigError::Bits { key, .. } if key == "quantization.bits"),
            "{e}"
        );
    }
    for group in [16, 256, 0] {
        let e = err(json!({"quantization": {"group_size": group, "bits": 4}}));
        assert!(matches!(e, ConfigError::GroupSize { .. }), "{e}");
    }
    let e = err(json!({"quantization": {"group_size": 64, "bits": "4"}}));
    assert!(matches!(e, ConfigError::Type { .. }), "{e}");
    let e = err(json!({"quantization": {"group_size": 64.5, "bits": 4}}));
    assert!(matches!(e, ConfigError::Type { .. }), "{e}");
    let e = err(json!({"quantization": [64, 4]}));
    assert!(matches!(e, ConfigError::Type { .. }), "{e}");
    let e = err(json!({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}}));
    assert!(
        matches!(&e, ConfigError::Mode { mode, .. } if mode == "mxfp4"),
        "{e}"
    );
    let e = err(json!({"quantization": {"bits": 4, "model.layers.0.mlp": {"bits": 9}}}));
    let text = e.to_string();
    assert!(
        text.contains("quantization.model.layers.0.mlp.bits"),
        "{text}"
    );
}

/// One module of a model built for a test: codes, scales and biases drawn at random.
struct Module {
    name: &'static str,
    params: QuantParams,
    dtype: Dtype,
    shape: Vec<usize>,
    codes: Vec<u8>,
    scales: Vec<f32>,
    biases: Vec<f32>,
}

impl Module {
    fn random(
        rng: &mut StdRng,
        name: &'static str,
        params: QuantParams,
        dtype: Dtype,
        shape: &[usize],
    ) -> Self {
        let (&k, lead) = shape.split_last().unwrap();
        let rows: usize = lead.iter().product();
        let groups = rows * k / params.group_size();
        let round = |v| round_to(dtype, v);
        Module {
            name,
            params,
            dtype,
            shape: shape.to_vec(),
            codes: (0..rows * k)
                .map(|_| rng.random_range(1..1u32 << params.bits()) as u8)
                .collect(),
            scales: (0..groups)
                .map(|_| round(rng.random_range(0.01..0.2)))
                .collect(),
            biases: (0..groups)
                .map(|_| round(rng.random_range(-2.0..-0.1)))
                .collect(),
        }
    }

    /// What dequantization must give, computed value by value from the stored fields.
    fn expected(&self) -> Vec<f32> {
        let round = |v| round_to(self.dtype, v);
        let g = self.params.group_size();
        self.codes
            .iter()
            .enumerate()
            .map(|(i, &q)| round(round(self.scales[i / g] * f32::from(q)) + self.biases[i / g]))
            .collect()
    }

    /// The three tensors as (name, dtype, shape, bytes).
    fn tensors(&self) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
        let (&k, lead) = self.shape.split_last().unwrap();
        let mut weight_shape = lead.to_vec();
        weight_shape.push(k * self.params.bits() as usize / 32);
        let mut scale_shape = lead.to_vec();
        scale_shape.push(k / self.params.group_size());
        let encode = |values: &[f32]| -> Vec<u8> {
            values.iter().flat_map(|&v| encode(self.dtype, v)).collect()
        };
        vec![
            (
                format!("{}.weight", self.name),
                Dtype::U32,
                weight_shape,
                pack(&self.codes, self.params.bits()),
            ),
            (
                format!("{}.scales", self.name),
                self.dtype,
                scale_shape.clone(),
                encode(&self.scales),
            ),
            (
                format!("{}.biases", self.name),
                self.dtype,
                scale_shape,
                encode(&self.biases),
            ),
        ]
    }
}

type Tensors = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

fn hf_dtype(dtype: Dtype) -> safetensors::Dtype {
    match dtype {
        Dtype::U32 => safetensors::Dtype::U32,
        Dtype::F16 => safetensors::Dtype::F16,
        Dtype::Bf16 => safetensors::Dtype::BF16,
        Dtype::F32 => safetensors::Dtype::F32,
        Dtype::I32 => safetensors::Dtype::I32,
        other => panic!("tests do not write {other}"),
    }
}

/// Writes `config.json` and `model.safetensors` (with the Hugging Face writer) into `dir`.
fn write_model(dir: &Path, config: &Value, tensors: &Tensors) {
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let views = tensors.iter().map(|(name, dtype, shape, data)| {
        let view = safetensors::tensor::TensorView::new(hf_dtype(*dtype), shape.clone(), data);
        (name.clone(), view.unwrap())
    });
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
}

fn sample_modules(rng: &mut StdRng) -> Vec<Module> {
    vec![
        Module::random(
            rng,
            "model.layers.0.self_attn.q_proj",
            params(64, 4).unwrap(),
            Dtype::F16,
            &[6, 128],
        ),
        Module::random(
            rng,
            "model.layers.0.mlp.down_proj",
            params(32, 3).unwrap(),
            Dtype::Bf16,
            &[5, 96],
        ),
        Module::random(
            rng,
            "model.layers.0.mlp.experts",
            params(128, 6).unwrap(),
            Dtype::F32,
            &[3, 4, 256],
        ),
        Module::random(
            rng,
            "model.embed_tokens",
            params(32, 5).unwrap(),
            Dtype::F16,
            &[7, 64],
        ),
    ]
}

fn sample_config() -> Value {
    json!({
        "model_type": "test",
        "quantization": {
            "group_size": 64, "bits": 4,
            "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 3},
            "model.layers.0.mlp.experts": {"group_size": 128, "bits": 6},
            "model.embed_tokens": {"group_size": 32, "bits": 5},
            "lm_head": false
        }
    })
}

fn sample_tensors(modules: &[Module]) -> Tensors {
    let mut tensors: Tensors = modules.iter().flat_map(Module::tensors).collect();
    let norm: Vec<u8> = (1..=32u8)
        .flat_map(|i| f32::from(i).to_le_bytes())
        .collect();
    tensors.push(("model.norm.weight".into(), Dtype::F32, vec![32], norm));
    let head: Vec<u8> = (0..64u16)
        .flat_map(|i| f16::from_f32(f32::from(i) + 0.5).to_le_bytes())
        .collect();
    tensors.push(("lm_head.weight".into(), Dtype::F16, vec![4, 16], head));
    tensors
}

#[test]
fn opens_a_quantized_model() {
    let mut rng = StdRng::seed_from_u64(13);
    let dir = tempfile::tempdir().unwrap();
    let modules = sample_modules(&mut rng);
    write_model(dir.path(), &sample_config(), &sample_tensors(&modules));

    let model = MlxModel::open(dir.path()).unwrap();
    let mut names: Vec<&str> = modules.iter().map(|m| m.name).collect();
    names.sort_unstable();
    assert_eq!(model.quantized_modules().collect::<Vec<_>>(), names);
    assert_eq!(model.config()["model_type"], "test");
    assert_eq!(model.quantization().unwrap().params_for("lm_head"), None);
    assert!(model.quantized("lm_head").is_none());
    assert!(model.quantized("model.norm").is_none());
    let norm = model
        .checkpoint()
        .get("model.norm.weight")
        .unwrap()
        .to_f32_vec()
        .unwrap();
    assert_eq!(norm[31], 32.0);

    for m in &modules {
        let t = model.quantized(m.name).unwrap();
        assert_eq!(t.module(), m.name);
        assert_eq!(t.params(), m.params);
        assert_eq!(t.shape(), m.shape);
        assert_eq!(t.cols(), *m.shape.last().unwrap());
        assert_eq!(t.rows() * t.cols(), m.codes.len());
        assert_eq!(t.scale_dtype(), ScaleDtype::from_dtype(m.dtype).unwrap());
        assert_eq!(t.weight().name(), format!("{}.weight", m.name));
        let want = m.expected();
        assert_eq!(t.dequantize(), want, "{}", m.name);
        let last = t.rows() - 1;
        let mut row = vec![0f32; t.cols()];
        t.dequantize_row_into(last, &mut row);
        assert_eq!(row, want[last * t.cols()..], "{}", m.name);

        let direct = QuantizedTensor::new(m.name, m.params, t.weight(), t.scales(), t.biases());
        assert_eq!(direct.unwrap().dequantize(), want);
    }
}

/// Builds the sample model with `edit` applied to its config and tensors, and opens it.
fn open_edited(edit: impl FnOnce(&mut Value, &mut Tensors)) -> Error {
    let mut rng = StdRng::seed_from_u64(14);
    let dir = tempfile::tempdir().unwrap();
    let modules = sample_modules(&mut rng);
    let mut config = sample_config();
    let mut tensors = sample_tensors(&modules);
    edit(&mut config, &mut tensors);
    write_model(dir.path(), &config, &tensors);
    MlxModel::open(dir.path()).expect_err("accepted an inconsistent model")
}

fn find<'a>(tensors: &'a mut Tensors, name: &str) -> &'a mut (String, Dtype, Vec<usize>, Vec<u8>) {
    tensors.iter_mut().find(|t| t.0 == name).unwrap()
}

const DOWN: &str = "model.layers.0.mlp.down_proj";

#[test]
fn rejects_inconsistent_models() {
    let e = open_edited(|_, t| t.retain(|t| t.0 != format!("{DOWN}.biases")));
    assert!(
        matches!(&e, Error::MissingCompanion { tensor, .. } if tensor.ends_with(".biases")),
        "{e}"
    );
    let e = open_edited(|_, t| t.retain(|t| t.0 != format!("{DOWN}.weight")));
    assert!(
        matches!(&e, Error::MissingCompanion { tensor, .. } if tensor.ends_with(".weight")),
        "{e}"
    );

    let e = open_edited(|_, t| find(t, &format!("{DOWN}.weight")).1 = Dtype::F32);
    assert!(
        matches!(
            &e,
            Error::Dtype {
                expected: "U32",
                ..
            }
        ),
        "{e}"
    );
    let e = open_edited(|_, t| {
        let biases = find(t, &format!("{DOWN}.biases"));
        biases.1 = Dtype::F16;
    });
    assert!(
        matches!(
            &e,
            Error::Dtype {
                dtype: Dtype::F16,
                expected: "BF16",
                ..
            }
        ),
        "{e}"
    );
    let e = open_edited(|_, t| {
        for suffix in ["scales", "biases"] {
            let x = find(t, &format!("{DOWN}.{suffix}"));
            x.1 = Dtype::I32;
            let doubled: Vec<u8> = x.3.iter().flat_map(|&b| [b, b]).collect();
            x.3 = doubled;
        }
    });
    assert!(
        matches!(
            e,
            Error::Dtype {
                dtype: Dtype::I32,
                ..
            }
        ),
        "{e}"
    );

    // The config claims 4 bits for a module packed at 3.
    let e = open_edited(|c, _| c["quantization"][DOWN]["bits"] = json!(4));
    assert!(
        matches!(e, Error::Shape { .. }) && e.to_string().contains(DOWN),
        "{e}"
    );
    // Or group size 64 where the scales hold groups of 32.
    let e = open_edited(|c, _| c["quantization"][DOWN]["group_size"] = json!(64));
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    let e = open_edited(|_, t| {
        let biases = find(t, &format!("{DOWN}.biases"));
        biases.2 = vec![biases.2[1], biases.2[0]];
    });
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    let e = open_edited(|_, t| {
        let weight = find(t, &format!("{DOWN}.weight"));
        weight.2 = vec![weight.2.iter().product()];
    });
    assert!(matches!(e, Error::Shape { .. }), "{e}");

    let e = open_edited(|c, _| {
        c.as_object_mut()
            .unwrap()
            .remove("quantization")
            .map(drop)
            .unwrap()
    });
    assert!(matches!(e, Error::NoQuantConfig { .. }), "{e}");
    let e = open_edited(|c, _| c["quantization"][DOWN] = json!(false));
    assert!(
        matches!(&e, Error::QuantizationDisabled { module } if module == DOWN),
        "{e}"
    );
    let e = open_edited(|c, _| c["quantization"]["lm_head"] = json!({"group_size": 32, "bits": 8}));
    assert!(
        matches!(&e, Error::NotQuantized { module } if module == "lm_head"),
        "{e}"
    );
    let e = open_edited(|c, _| c["quantization"]["bits"] = json!(7));
    assert!(
        matches!(
            e,
            Error::Config {
                source: ConfigError::Bits { .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("config.json"), "{e}");
}

#[test]
fn rejects_missing_or_malformed_config() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(15);
    write_model(
        dir.path(),
        &sample_config(),
        &sample_tensors(&sample_modules(&mut rng)),
    );
    std::fs::write(dir.path().join("config.json"), "{\"quantization\": ").unwrap();
    let e = MlxModel::open(dir.path()).unwrap_err();
    assert!(matches!(e, Error::ConfigJson { .. }), "{e}");
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let e = MlxModel::open(dir.path()).unwrap_err();
    assert!(
        matches!(e, Error::Io { .. }) && e.to_string().contains("config.json"),
        "{e}"
    );
    // The weights themselves go through the safetensors checks.
    std::fs::write(dir.path().join("config.json"), "{}").unwrap();
    std::fs::write(dir.path().join("model.safetensors"), [1, 2, 3]).unwrap();
    let e = MlxModel::open(dir.path()).unwrap_err();
    assert!(matches!(e, Error::Safetensors(_)), "{e}");
    // An unquantized model opens with no quantized modules.
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let plain: Tensors = vec![(
        "w".into(),
        Dtype::F32,
        vec![2],
        [1f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect(),
    )];
    write_model(dir.path(), &json!({}), &plain);
    let model = MlxModel::open(dir.path()).unwrap();
    assert!(model.quantization().is_none());
    assert_eq!(model.quantized_modules().count(), 0);
    assert_eq!(Checkpoint::open(dir.path()).unwrap().len(), 1);
}
