//! The writer and reader agree on every metadata value type and every tensor type.

use akunu_formats::gguf::{GgufFile, GgufWriter, MetaArray, MetaValue, ValueType};
use akunu_formats::GgmlType;
use rand::{Rng, SeedableRng};

fn every_value() -> Vec<(&'static str, MetaValue)> {
    let nested = MetaValue::Array(MetaArray {
        elem: ValueType::Array,
        items: vec![
            MetaValue::strings(["a", "ünï", ""]),
            MetaValue::strings(Vec::<String>::new()),
            MetaValue::Array(MetaArray {
                elem: ValueType::String,
                items: vec![MetaValue::String("🦀 crab".into())],
            }),
        ],
    });
    let deep = MetaValue::Array(MetaArray {
        elem: ValueType::Array,
        items: vec![MetaValue::Array(MetaArray {
            elem: ValueType::Array,
            items: vec![MetaValue::i32s([-1, 2, -3])],
        })],
    });
    vec![
        ("t.u8", MetaValue::U8(0xAB)),
        ("t.i8", MetaValue::I8(-77)),
        ("t.u16", MetaValue::U16(0xBEEF)),
        ("t.i16", MetaValue::I16(-12345)),
        ("t.u32", MetaValue::U32(0xDEAD_BEEF)),
        ("t.i32", MetaValue::I32(-1_234_567_890)),
        ("t.f32", MetaValue::F32(-3.25e-7)),
        ("t.bool.true", MetaValue::Bool(true)),
        ("t.bool.false", MetaValue::Bool(false)),
        (
            "t.string",
            MetaValue::String("héllo\n\t{{ template }} 日本語".into()),
        ),
        ("t.string.empty", MetaValue::String(String::new())),
        ("t.u64", MetaValue::U64(u64::MAX - 5)),
        ("t.i64", MetaValue::I64(i64::MIN + 9)),
        ("t.f64", MetaValue::F64(std::f64::consts::PI)),
        ("t.array.f32", MetaValue::f32s([1.5, -2.0, 1e30])),
        ("t.array.empty", MetaValue::i32s([])),
        (
            "t.array.u8",
            MetaValue::Array(MetaArray {
                elem: ValueType::U8,
                items: (0..=255).map(MetaValue::U8).collect(),
            }),
        ),
        (
            "t.array.bool",
            MetaValue::Array(MetaArray {
                elem: ValueType::Bool,
                items: vec![MetaValue::Bool(true), MetaValue::Bool(false)],
            }),
        ),
        ("t.array.nested", nested),
        ("t.array.deep", deep),
    ]
}

fn random_tensors(rng: &mut impl Rng) -> Vec<(String, GgmlType, Vec<u64>, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, &ty) in GgmlType::ALL.iter().enumerate() {
        let block = ty.block_size() as u64;
        let dims: Vec<u64> = match i % 4 {
            0 => vec![block * 2],
            1 => vec![block, 3],
            2 => vec![block * 2, 2, 3],
            _ => vec![block, 1, 2, 2],
        };
        let n: u64 = dims.iter().product();
        let bytes = ty.bytes_for(n).unwrap() as usize;
        let data: Vec<u8> = (0..bytes).map(|_| rng.random()).collect();
        out.push((format!("tensor.{}", ty.name()), ty, dims, data));
    }
    out
}

#[test]
fn every_value_and_tensor_type_round_trips() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for (version, alignment) in [(3, None), (2, None), (3, Some(64u32)), (3, Some(1))] {
        let values = every_value();
        let tensors = random_tensors(&mut rng);
        let mut w = GgufWriter::new().with_version(version).unwrap();
        if let Some(a) = alignment {
            w.add("general.alignment", a).unwrap();
        }
        for (k, v) in &values {
            w.add(k, v.clone()).unwrap();
        }
        for (name, ty, dims, data) in &tensors {
            w.add_tensor(name, *ty, dims, data.as_slice()).unwrap();
        }
        let bytes = w.to_bytes().unwrap();
        let file = GgufFile::from_bytes(bytes).unwrap();

        assert_eq!(file.version(), version);
        let alignment = u64::from(alignment.unwrap_or(32));
        assert_eq!(file.alignment(), alignment);
        assert_eq!(file.data_offset() % alignment, 0);
        for (k, v) in &values {
            assert_eq!(&file.get(k).unwrap().to_owned_value(), v, "{k}");
        }
        assert_eq!(file.tensors().len(), tensors.len());
        for (name, ty, dims, data) in &tensors {
            let info = file.tensor(name).unwrap();
            assert_eq!((info.ty, &info.dims), (*ty, dims));
            assert_eq!(info.offset % alignment, 0);
            assert_eq!(file.tensor_data(info), Some(data.as_slice()), "{name}");
        }
    }
}

#[test]
fn typed_accessors_read_what_was_written() {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").unwrap();
    w.add("llama.block_count", 22u32).unwrap();
    w.add("llama.rope.freq_base", 500000.0f32).unwrap();
    w.add(
        "tokenizer.ggml.tokens",
        MetaValue::strings(["<s>", "▁a", "b"]),
    )
    .unwrap();
    w.add("tokenizer.ggml.scores", MetaValue::f32s([0.0, -1.5, -2.5]))
        .unwrap();
    w.add("tokenizer.ggml.token_type", MetaValue::i32s([3, 1, 1]))
        .unwrap();
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(file.architecture(), Some("llama"));
    assert_eq!(
        file.arch_key("block_count").and_then(|v| v.as_int()),
        Some(22)
    );
    assert_eq!(file.get_f64("llama.rope.freq_base"), Some(500000.0));
    let tokens = file
        .get("tokenizer.ggml.tokens")
        .unwrap()
        .as_array()
        .unwrap();
    assert_eq!(
        tokens.strings().unwrap().collect::<Vec<_>>(),
        ["<s>", "▁a", "b"]
    );
    let scores = file
        .get("tokenizer.ggml.scores")
        .unwrap()
        .as_array()
        .unwrap();
    assert_eq!(scores.to_f32_vec().unwrap(), [0.0, -1.5, -2.5]);
    assert_eq!(scores.to_i32_vec(), None);
    let types = file
        .get("tokenizer.ggml.token_type")
        .unwrap()
        .as_array()
        .unwrap();
    assert_eq!(types.to_i32_vec().unwrap(), [3, 1, 1]);
    assert_eq!(file.get("missing"), None);
    assert_eq!(file.metadata().count(), 6);
}

#[test]
fn writer_refuses_inconsistent_input() {
    let mut w = GgufWriter::new();
    w.add("a", 1u32).unwrap();
    assert!(w.add("a", 2u32).is_err(), "duplicate key");
    assert!(
        w.add("general.alignment", 48u32).is_err(),
        "alignment not a power of two"
    );
    assert!(
        w.add("general.alignment", "32").is_err(),
        "alignment of the wrong type"
    );
    let mixed = MetaValue::Array(MetaArray {
        elem: ValueType::U32,
        items: vec![MetaValue::U32(1), MetaValue::I32(2)],
    });
    assert!(
        w.add("mixed", mixed).is_err(),
        "array with a stray item type"
    );
    assert!(w
        .add_tensor("t", GgmlType::Q4_0, &[32], vec![0u8; 17])
        .is_err());
    assert!(w
        .add_tensor("t", GgmlType::Q4_0, &[16], vec![0u8; 9])
        .is_err());
    assert!(w
        .add_tensor("t", GgmlType::F32, &[1, 1, 1, 1, 1], vec![0u8; 4])
        .is_err());
    w.add_tensor("t", GgmlType::F32, &[2], vec![1u8; 8])
        .unwrap();
    assert!(w
        .add_tensor("t", GgmlType::F32, &[2], vec![1u8; 8])
        .is_err());
    assert!(GgufWriter::new().with_version(1).is_err());
}
