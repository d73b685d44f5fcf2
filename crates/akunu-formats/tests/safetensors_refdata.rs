//! The safetensors reader against files written by the `safetensors` Python package, with
//! expected bytes and f32 values from numpy and ml_dtypes (scripts/ref/safetensors_fixtures.py).

use std::path::Path;

use akunu_formats::safetensors::{Checkpoint, Error, SafetensorsFile, TensorView};
use serde_json::Value;

fn manifest(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

fn read_f32(path: &Path) -> Vec<u32> {
    let bytes = std::fs::read(path).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Checks one view against its manifest entry and expected files; f32 values bit for bit.
fn check(view: TensorView<'_>, entry: &Value, expected: &Path) {
    let name = view.name();
    assert_eq!(view.dtype().name(), entry["dtype"], "{name}");
    let shape: Vec<usize> = serde_json::from_value(entry["shape"].clone()).unwrap();
    assert_eq!(view.shape(), shape, "{name}");
    let bytes = std::fs::read(expected.join(format!("{name}.bin"))).unwrap();
    assert_eq!(view.data(), bytes, "{name}");
    assert!(view.data().iter().any(|&b| b != 0), "{name} is all zero");
    if entry["f32"] == true {
        let got: Vec<u32> = view
            .to_f32_vec()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(
            got,
            read_f32(&expected.join(format!("{name}.f32"))),
            "{name}"
        );
    } else {
        assert!(
            matches!(view.to_f32_vec(), Err(Error::NotConvertible { .. })),
            "{name}"
        );
    }
}

#[test]
fn reads_python_written_dtypes() {
    let Some(dir) = akunu_testutil::refdata("safetensors") else {
        return;
    };
    let manifest = manifest(&dir);
    let entry = &manifest["dtypes.safetensors"];
    let file = SafetensorsFile::open(dir.join("dtypes.safetensors")).unwrap();
    let metadata: std::collections::BTreeMap<String, String> =
        serde_json::from_value(entry["metadata"].clone()).unwrap();
    assert_eq!(file.metadata(), &metadata);
    let tensors = entry["tensors"].as_object().unwrap();
    assert_eq!(file.len(), tensors.len());
    assert_eq!(tensors.len(), 16, "one tensor per dtype plus a scalar");
    for (name, entry) in tensors {
        check(file.get(name).unwrap(), entry, &dir.join("expected"));
    }
}

#[test]
fn reads_python_written_shards() {
    let Some(dir) = akunu_testutil::refdata("safetensors") else {
        return;
    };
    let manifest = manifest(&dir);
    let entry = &manifest["sharded"];
    let sharded = dir.join("sharded");
    for path in [
        sharded.clone(),
        sharded.join("model.safetensors.index.json"),
    ] {
        let ckpt = Checkpoint::open(&path).unwrap();
        assert_eq!(ckpt.files().len(), 3);
        assert_eq!(
            ckpt.index_metadata().unwrap(),
            entry["index_metadata"].as_object().unwrap()
        );
        let tensors = entry["tensors"].as_object().unwrap();
        assert_eq!(ckpt.len(), tensors.len());
        for (name, tensor) in tensors {
            check(ckpt.get(name).unwrap(), tensor, &dir.join("expected"));
            let shard = ckpt.file_of(name).unwrap().path().file_name().unwrap();
            assert_eq!(shard.to_str().unwrap(), entry["weight_map"][name], "{name}");
        }
    }
}
