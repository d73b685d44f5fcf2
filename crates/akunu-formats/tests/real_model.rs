//! The real default model (Gemma 3 270M Q4_K_M): its index, its hyperparameters, and every one
//! of its tensors dequantized exactly as the `gguf` Python package does it, bit for bit.
//! It holds Q5_0, Q4_K, Q6_K, Q8_0 and F32 tensors.

use akunu_formats::gguf::GgufFile;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

#[test]
fn index_and_hyperparameters() {
    let Some(path) = akunu_testutil::model() else {
        return;
    };
    let file = GgufFile::open(path).unwrap();
    assert_eq!(file.tensors().len(), 236);
    assert_eq!(file.architecture(), Some("gemma3"));
    let int = |k: &str| file.arch_key(k).and_then(|v| v.as_int());
    assert_eq!(int("block_count"), Some(18));
    assert_eq!(int("embedding_length"), Some(640));
    assert_eq!(int("feed_forward_length"), Some(2048));
    assert_eq!(int("attention.head_count"), Some(4));
    assert_eq!(int("attention.head_count_kv"), Some(1));
    assert_eq!(int("attention.key_length"), Some(256));
    assert_eq!(int("attention.sliding_window"), Some(512));
    assert_eq!(int("context_length"), Some(32768));
    let vocab = file
        .get("tokenizer.ggml.tokens")
        .unwrap()
        .as_array()
        .unwrap();
    assert_eq!(vocab.len(), 262_144);
    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.dims, [640, 262_144]);
}

#[test]
fn every_tensor_dequantizes_like_gguf_py() {
    let (Some(path), Some(dir)) = (akunu_testutil::model(), akunu_testutil::refdata("gguf")) else {
        return;
    };
    let digests: Json =
        serde_json::from_slice(&std::fs::read(dir.join("model-digests.json")).unwrap()).unwrap();
    let file = GgufFile::open(path).unwrap();
    let mut seen_types = std::collections::BTreeSet::new();
    for t in file.tensors() {
        let want = &digests[&t.name];
        assert_eq!(want["type"], t.ty.name(), "{}", t.name);
        let mut values = vec![0f32; t.n_elements as usize];
        akunu_quant::dequantize(t.ty, file.tensor_data(t).unwrap(), &mut values).unwrap();
        let mut hasher = Sha256::new();
        for v in &values {
            hasher.update(v.to_le_bytes());
        }
        let got: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            want["sha256"], got,
            "{} ({}) differs from gguf-py",
            t.name, t.ty
        );
        seen_types.insert(t.ty.name());
    }
    assert_eq!(
        seen_types.into_iter().collect::<Vec<_>>(),
        ["F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"]
    );
}
