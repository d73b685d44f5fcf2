//! The GGUF reader and writer against the `gguf` Python package: we read what it wrote, and it
//! reads what we wrote (scripts/ref/gguf_fixtures.py).

use std::collections::BTreeMap;
use std::process::Command;

use akunu_formats::gguf::{GgufFile, GgufWriter, MetaArray, MetaValue, ValueType};
use akunu_formats::GgmlType;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value as Json};
use sha2::{Digest, Sha256};

/// The JSON form scripts/ref/gguf_fixtures.py uses for a value.
fn value_json(v: &MetaValue) -> Json {
    let number = |x: f64| json!(x);
    let (ty, value) = match v {
        MetaValue::U8(x) => ("u8", json!(x)),
        MetaValue::I8(x) => ("i8", json!(x)),
        MetaValue::U16(x) => ("u16", json!(x)),
        MetaValue::I16(x) => ("i16", json!(x)),
        MetaValue::U32(x) => ("u32", json!(x)),
        MetaValue::I32(x) => ("i32", json!(x)),
        MetaValue::U64(x) => ("u64", json!(x)),
        MetaValue::I64(x) => ("i64", json!(x)),
        MetaValue::F32(x) => ("f32", number(f64::from(*x))),
        MetaValue::F64(x) => ("f64", number(*x)),
        MetaValue::Bool(x) => ("bool", json!(x)),
        MetaValue::String(s) => ("string", json!(s)),
        MetaValue::Array(a) => {
            let items: Vec<Json> = a.items.iter().map(value_json).collect();
            return json!({"type": "array", "elem": a.elem.name(), "items": items});
        }
    };
    json!({"type": ty, "value": value})
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn reads_what_gguf_py_wrote() {
    let Some(dir) = akunu_testutil::refdata("gguf") else {
        return;
    };
    let expected: Json =
        serde_json::from_slice(&std::fs::read(dir.join("pywritten.json")).unwrap()).unwrap();
    let file = GgufFile::open(dir.join("pywritten.gguf")).unwrap();

    let got: BTreeMap<String, Json> = file
        .metadata()
        .map(|(k, v)| (k.to_owned(), value_json(&v.to_owned_value())))
        .collect();
    let want: BTreeMap<String, Json> = expected["metadata"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(got, want);

    let tensors = expected["tensors"].as_object().unwrap();
    assert_eq!(file.tensors().len(), tensors.len());
    for (name, t) in tensors {
        let info = file
            .tensor(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(info.ty.name(), t["type"], "{name}");
        assert_eq!(json!(info.dims), t["dims"], "{name}");
        assert_eq!(
            sha256_hex(file.tensor_data(info).unwrap()),
            t["sha256"],
            "{name}"
        );
    }
}

#[test]
fn gguf_py_reads_what_we_wrote() {
    let (Some(python), Some(_)) = (akunu_testutil::python(), akunu_testutil::refdata("gguf"))
    else {
        return;
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    // gguf-py cannot read nested arrays, so this file holds every other kind of value.
    let values = vec![
        ("general.architecture", MetaValue::from("qwen3")),
        ("a.u8", MetaValue::U8(rng.random())),
        ("a.i8", MetaValue::I8(rng.random())),
        ("a.u16", MetaValue::U16(rng.random())),
        ("a.i16", MetaValue::I16(rng.random())),
        ("a.u32", MetaValue::U32(rng.random())),
        ("a.i32", MetaValue::I32(rng.random())),
        ("a.f32", MetaValue::F32(rng.random::<f32>() - 0.5)),
        ("a.bool", MetaValue::Bool(true)),
        ("a.string", MetaValue::from("¿Qué? 中文 🙂 \"quoted\"\n")),
        ("a.u64", MetaValue::U64(rng.random())),
        ("a.i64", MetaValue::I64(rng.random())),
        ("a.f64", MetaValue::F64(rng.random::<f64>() * 1e10)),
        (
            "a.strings",
            MetaValue::strings(["Ġthe", "▁x", "<|im_end|>"]),
        ),
        (
            "a.f32s",
            MetaValue::f32s((0..7).map(|_| rng.random::<f32>())),
        ),
        (
            "a.i32s",
            MetaValue::i32s((0..5).map(|_| rng.random::<i32>())),
        ),
        (
            "a.u8s",
            MetaValue::Array(MetaArray {
                elem: ValueType::U8,
                items: (0..9).map(|_| MetaValue::U8(rng.random())).collect(),
            }),
        ),
    ];
    let mut w = GgufWriter::new();
    for (k, v) in &values {
        w.add(k, v.clone()).unwrap();
    }
    let mut tensors = serde_json::Map::new();
    for (ty, dims) in [
        (GgmlType::F32, vec![5u64, 3]),
        (GgmlType::Q4_0, vec![64, 2]),
        (GgmlType::Q4_K, vec![256, 3]),
        (GgmlType::BF16, vec![7]),
        (GgmlType::Q6_K, vec![512, 1, 2]),
    ] {
        let n: u64 = dims.iter().product();
        let data: Vec<u8> = (0..ty.bytes_for(n).unwrap())
            .map(|_| rng.random())
            .collect();
        let name = format!("w.{}", ty.name().to_lowercase());
        tensors.insert(
            name.clone(),
            json!({"type": ty.name(), "dims": dims, "sha256": sha256_hex(&data)}),
        );
        w.add_tensor(&name, ty, &dims, data).unwrap();
    }
    let metadata: serde_json::Map<String, Json> = values
        .iter()
        .map(|(k, v)| (k.to_string(), value_json(v)))
        .collect();

    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("ours.gguf");
    let expected = dir.path().join("ours.json");
    w.write_file(&gguf).unwrap();
    let description = json!({"metadata": metadata, "tensors": tensors});
    std::fs::write(&expected, description.to_string()).unwrap();

    let script = akunu_testutil::workspace_root().join("scripts/ref/gguf_fixtures.py");
    let out = Command::new(python)
        .arg(script)
        .arg("check")
        .arg(&gguf)
        .arg(&expected)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gguf-py disagrees:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
