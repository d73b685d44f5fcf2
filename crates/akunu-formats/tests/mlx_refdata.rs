//! The MLX reader against model directories quantized by MLX itself, with `mx.dequantize` output
//! as the expected values (scripts/ref/mlx_fixtures.py).

use std::path::Path;

use akunu_formats::mlx::{unpack_codes, MlxModel, QuantParams};
use akunu_formats::safetensors::Dtype;
use serde_json::Value;

/// Opens the model in `dir` and checks every module of its manifest: parameters, shapes, codes
/// and dequantized values, the latter bit for bit. Returns the model and the manifest.
fn check_model(dir: &Path) -> (MlxModel, Value) {
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let model = MlxModel::open(dir).unwrap();
    let modules = manifest["modules"].as_object().unwrap();
    let mut names: Vec<&str> = modules.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(model.quantized_modules().collect::<Vec<_>>(), names);

    let expected = dir.join("expected");
    for (name, entry) in modules {
        let t = model.quantized(name).unwrap();
        let group = entry["group_size"].as_u64().unwrap() as usize;
        let bits = entry["bits"].as_u64().unwrap() as u32;
        assert_eq!(t.params(), QuantParams::new(group, bits).unwrap(), "{name}");
        assert_eq!(t.scales().dtype().name(), entry["dtype"], "{name}");
        let shape: Vec<usize> = serde_json::from_value(entry["shape"].clone()).unwrap();
        assert_eq!(t.shape(), shape, "{name}");
        assert_eq!(t.weight().dtype(), Dtype::U32);

        let codes = std::fs::read(expected.join(format!("{name}.codes"))).unwrap();
        let row_bytes = t.cols() * bits as usize / 8;
        for (row, want) in codes.chunks_exact(t.cols()).enumerate() {
            let mut got = vec![0u8; t.cols()];
            let packed = &t.weight().data()[row * row_bytes..(row + 1) * row_bytes];
            unpack_codes(packed, bits, &mut got);
            assert_eq!(got, want, "{name} row {row} codes");
        }

        let want = std::fs::read(expected.join(format!("{name}.f32"))).unwrap();
        let got: Vec<u8> = t
            .dequantize()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(got.len(), want.len(), "{name}");
        if got != want {
            let first = got
                .chunks(4)
                .zip(want.chunks(4))
                .position(|(a, b)| a != b)
                .unwrap();
            panic!("{name}: value {first} differs from mx.dequantize");
        }
    }
    for name in manifest["unquantized"].as_array().unwrap() {
        let name = name.as_str().unwrap();
        assert!(
            model.checkpoint().get(name).unwrap().to_f32_vec().is_ok(),
            "{name}"
        );
        assert!(
            model.quantized(name.trim_end_matches(".weight")).is_none(),
            "{name}"
        );
    }
    (model, manifest)
}

#[test]
fn matches_mx_dequantize_for_every_bits_and_group_size() {
    let Some(dir) = akunu_testutil::refdata("mlx/model") else {
        return;
    };
    let (model, manifest) = check_model(&dir);
    let mut seen = std::collections::BTreeSet::new();
    for entry in manifest["modules"].as_object().unwrap().values() {
        seen.insert((
            entry["bits"].as_u64().unwrap(),
            entry["group_size"].as_u64().unwrap(),
        ));
    }
    assert_eq!(seen.len(), 18, "every bits x group size combination");
    let q = model.quantization().unwrap();
    assert_eq!(q.default_params(), QuantParams::DEFAULT);
    assert_eq!(q.params_for("lm_head"), None);
}

#[test]
fn matches_mx_dequantize_across_shards() {
    let Some(dir) = akunu_testutil::refdata("mlx/sharded") else {
        return;
    };
    let (model, _) = check_model(&dir);
    assert_eq!(model.checkpoint().files().len(), 2);
    assert_eq!(
        model.quantization().unwrap().default_params(),
        QuantParams::new(32, 6).unwrap()
    );
    // The fixture puts this module's weight and its scales in different shards.
    let split = model.quantized("model.layers.1.mlp.up_proj").unwrap();
    let file = |name: &str| {
        model
            .checkpoint()
            .file_of(name)
            .unwrap()
            .path()
            .to_path_buf()
    };
    assert_ne!(file(split.weight().name()), file(split.scales().name()));
}
