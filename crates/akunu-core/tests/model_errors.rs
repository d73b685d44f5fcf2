//! Broken and hostile model files: `Model::load` must refuse each with an error that names the
//! fault (the metadata key or the tensor), never panic, and never accept a file it would
//! compute wrongly with.
//!
//! Each case is a copy of one of the small synthetic models of `scripts/ref/tiny_models.py`
//! (`$AKUNU_REFDATA/engine/tiny`), rewritten with `GgufWriter` with one thing changed, or
//! truncated.

use std::path::{Path, PathBuf};

use akunu_core::{Model, ModelError};
use akunu_formats::gguf::{GgufFile, GgufWriter, MetaValue};
use akunu_quant::GgmlType;

fn tiny(name: &str) -> Option<PathBuf> {
    let dir = akunu_testutil::refdata("engine")?;
    Some(dir.join("tiny").join(format!("{name}.gguf")))
}

fn open(path: &Path) -> GgufFile {
    GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One change to a model file.
#[derive(Default)]
struct Edit {
    /// Metadata to set (replacing or adding the key), or to remove (`None`).
    meta: Vec<(String, Option<MetaValue>)>,
    /// Tensors to leave out.
    drop: Vec<String>,
    /// Tensors to write with another type, shape and data.
    replace: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)>,
}

impl Edit {
    fn set(key: &str, value: impl Into<MetaValue>) -> Edit {
        Edit {
            meta: vec![(key.into(), Some(value.into()))],
            ..Edit::default()
        }
    }

    fn remove(key: &str) -> Edit {
        Edit {
            meta: vec![(key.into(), None)],
            ..Edit::default()
        }
    }

    fn drop(name: &str) -> Edit {
        Edit {
            drop: vec![name.into()],
            ..Edit::default()
        }
    }

    fn replace(name: &str, ty: GgmlType, dims: &[u64], data: Vec<u8>) -> Edit {
        Edit {
            replace: vec![(name.into(), ty, dims.to_vec(), data)],
            ..Edit::default()
        }
    }
}

/// Writes `src` with `edit` applied to `dir/name` and returns the path.
fn write(src: &GgufFile, edit: &Edit, dir: &Path, name: &str) -> PathBuf {
    let mut w = GgufWriter::new();
    for (key, value) in src.metadata() {
        let value = match edit.meta.iter().find(|(k, _)| k == key) {
            Some((_, Some(v))) => v.clone(),
            Some((_, None)) => continue,
            None => value.to_owned_value(),
        };
        w.add(key, value).unwrap();
    }
    for (key, value) in &edit.meta {
        if let (None, Some(v)) = (src.get(key), value) {
            w.add(key, v.clone()).unwrap();
        }
    }
    for t in src.tensors() {
        if edit.drop.contains(&t.name) {
            continue;
        }
        match edit.replace.iter().find(|(n, ..)| *n == t.name) {
            Some((_, ty, dims, data)) => w.add_tensor(&t.name, *ty, dims, data.as_slice()),
            None => w.add_tensor(&t.name, t.ty, &t.dims, src.tensor_data(t).unwrap()),
        }
        .unwrap();
    }
    let path = dir.join(name);
    w.write_file(&path).unwrap();
    path
}

/// Loads `src` with `edit` applied and returns the error's message, failing if it loads.
fn load_error(src: &GgufFile, edit: &Edit, dir: &Path, what: &str) -> (ModelError, String) {
    let path = write(src, edit, dir, "edited.gguf");
    match Model::load(&path) {
        Ok(_) => panic!("{what}: the model loaded"),
        Err(e) => {
            let msg = e.to_string();
            (e, msg)
        }
    }
}

/// Fails unless the message names every one of `needles`.
fn assert_names(what: &str, msg: &str, needles: &[&str]) {
    for n in needles {
        assert!(msg.contains(n), "{what}: {msg:?} does not mention {n:?}");
    }
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

#[test]
fn an_unchanged_copy_loads() {
    let dir = tempdir();
    for name in ["llama", "qwen2", "qwen3", "gemma3"] {
        let Some(path) = tiny(name) else { return };
        let src = open(&path);
        let copy = write(&src, &Edit::default(), dir.path(), "copy.gguf");
        let (a, b) = (Model::load(&path).unwrap(), Model::load(&copy).unwrap());
        assert_eq!(a.config, b.config, "{name}");
        assert_eq!(a.plan.ops, b.plan.ops, "{name}");
    }
}

#[test]
fn truncated_files_are_refused_naming_the_cut() {
    let Some(path) = tiny("llama") else { return };
    let bytes = std::fs::read(&path).unwrap();
    let src = open(&path);
    let data_offset = src.data_offset() as usize;
    // Bytes past the last tensor's data are padding; a file cut there is still whole.
    let data_end = src
        .tensors()
        .iter()
        .map(|t| data_offset + (t.offset + t.n_bytes) as usize)
        .max()
        .unwrap();
    let mut cuts: Vec<usize> = (0..64).collect();
    cuts.extend((64..data_offset + 64).step_by(97));
    cuts.extend((data_offset.saturating_sub(3)..data_offset + 3).filter(|&c| c < bytes.len()));
    cuts.extend((data_offset..data_end).step_by((data_end - data_offset) / 150));
    cuts.extend([data_end - 1]);
    let dir = tempdir();
    let cut_path = dir.path().join("cut.gguf");
    for cut in cuts {
        std::fs::write(&cut_path, &bytes[..cut]).unwrap();
        let msg = match Model::load(&cut_path) {
            Ok(_) => panic!("cut at {cut} of {}: the model loaded", bytes.len()),
            Err(e) => e.to_string(),
        };
        assert_names(&format!("cut at {cut}"), &msg, &["cut.gguf", "truncated"]);
        if cut >= data_offset {
            // The first tensor (in index order) whose data the cut removes is named.
            let first = src
                .tensors()
                .iter()
                .find(|t| data_offset + (t.offset + t.n_bytes) as usize > cut)
                .unwrap();
            assert_names(&format!("cut at {cut}"), &msg, &[&first.name]);
        }
    }
    // A cut in the final padding keeps every tensor whole.
    if data_end < bytes.len() {
        std::fs::write(&cut_path, &bytes[..data_end]).unwrap();
        Model::load(&cut_path).expect("a file cut after the last tensor's data");
    }
}

#[test]
fn a_missing_tensor_is_named() {
    let Some(path) = tiny("llama") else { return };
    let src = open(&path);
    let dir = tempdir();
    for name in [
        "token_embd.weight",
        "output_norm.weight",
        "blk.0.attn_norm.weight",
        "blk.0.attn_q.weight",
        "blk.1.attn_v.weight",
        "blk.2.ffn_down.weight",
        "blk.2.ffn_norm.weight",
    ] {
        let (e, msg) = load_error(&src, &Edit::drop(name), dir.path(), name);
        assert!(
            matches!(e, ModelError::MissingTensor { .. }),
            "{name}: {msg}"
        );
        assert_names(name, &msg, &["missing tensor", name]);
    }
    // Without `output.weight` the embeddings are tied: a valid file, not a broken one.
    let tied = write(&src, &Edit::drop("output.weight"), dir.path(), "tied.gguf");
    let m = Model::load(&tied).expect("a llama file with tied embeddings");
    assert!(m.arch.tie_embeddings);
}

#[test]
fn dropping_any_tensor_the_model_uses_is_refused_naming_it() {
    // Optional parts (QK-norm, post-norms, q/k/v biases) are recognised by their tensors in
    // block 0; a file that lacks one of block 0's tensors but has the rest of the set must not
    // load as a model without that part, silently ignoring the other layers' tensors.
    let dir = tempdir();
    let mut accepted = Vec::new();
    for model in ["llama", "qwen2", "qwen3", "gemma3"] {
        let Some(path) = tiny(model) else { return };
        let src = open(&path);
        for t in src.tensors() {
            // The one tensor whose absence is a valid variant of the family.
            if t.name == "output.weight" {
                continue;
            }
            let copy = write(&src, &Edit::drop(&t.name), dir.path(), "dropped.gguf");
            match Model::load(&copy) {
                Ok(_) => accepted.push(format!("{model} without {}", t.name)),
                Err(e) => assert_names(model, &e.to_string(), &[&t.name]),
            }
        }
    }
    assert!(
        accepted.is_empty(),
        "loaded although a used tensor is missing: {accepted:?}"
    );
}

#[test]
fn a_misshapen_tensor_is_named() {
    let Some(path) = tiny("llama") else { return };
    let src = open(&path);
    let dir = tempdir();
    let data = |name: &str| src.tensor_data(src.tensor(name).unwrap()).unwrap().to_vec();

    // A matrix transposed (same bytes: both widths are whole Q4_K blocks).
    let name = "blk.1.ffn_up.weight";
    let (e, msg) = load_error(
        &src,
        &Edit::replace(name, GgmlType::Q4_K, &[512, 256], data(name)),
        dir.path(),
        "transposed",
    );
    assert!(matches!(e, ModelError::BadTensor { .. }), "{msg}");
    assert_names("transposed", &msg, &[name, "shape", "[256, 512]"]);

    // A norm weight of half the width.
    let name = "blk.0.attn_norm.weight";
    let (_, msg) = load_error(
        &src,
        &Edit::replace(name, GgmlType::F32, &[128], data(name)[..512].to_vec()),
        dir.path(),
        "narrow norm",
    );
    assert_names("narrow norm", &msg, &[name, "shape"]);

    // A norm weight that is a matrix.
    let (_, msg) = load_error(
        &src,
        &Edit::replace(
            name,
            GgmlType::F32,
            &[256, 2],
            [data(name), data(name)].concat(),
        ),
        dir.path(),
        "2-D norm",
    );
    assert_names("2-D norm", &msg, &[name, "shape"]);

    // A type the engine does not compute with (Q8_K only holds activations).
    let q8k = GgmlType::Q8_K.bytes_for(256).unwrap() as usize;
    let (_, msg) = load_error(
        &src,
        &Edit::replace(name, GgmlType::Q8_K, &[256], vec![0; q8k]),
        dir.path(),
        "Q8_K norm",
    );
    assert_names("Q8_K norm", &msg, &[name, "Q8_K"]);

    // An embedding table with fewer rows than the tokenizer has tokens.
    let name = "token_embd.weight";
    let half = data(name).len() / 2;
    let (_, msg) = load_error(
        &src,
        &Edit::replace(
            name,
            GgmlType::Q4_K,
            &[256, 256],
            data(name)[..half].to_vec(),
        ),
        dir.path(),
        "short vocabulary",
    );
    assert_names("short vocabulary", &msg, &[name, "512"]);

    // Trailing dimensions of 1 are the same shape.
    let name = "blk.2.attn_output.weight";
    let padded = write(
        &src,
        &Edit::replace(name, GgmlType::Q4_K, &[256, 256, 1, 1], data(name)),
        dir.path(),
        "padded.gguf",
    );
    Model::load(&padded).expect("trailing dimensions of 1");
}

#[test]
fn an_unsupported_or_missing_architecture_is_named() {
    let Some(path) = tiny("llama") else { return };
    let src = open(&path);
    let dir = tempdir();
    for arch in ["mamba", "LLAMA", "llama4", ""] {
        let (e, msg) = load_error(
            &src,
            &Edit::set("general.architecture", arch),
            dir.path(),
            arch,
        );
        assert!(
            matches!(e, ModelError::UnsupportedArch { .. }),
            "{arch:?}: {msg}"
        );
        assert_names(arch, &msg, &[&format!("{arch:?}")]);
    }
    let (e, msg) = load_error(
        &src,
        &Edit::remove("general.architecture"),
        dir.path(),
        "none",
    );
    assert!(matches!(e, ModelError::MissingKey { .. }), "{msg}");
    assert_names("no architecture", &msg, &["general.architecture"]);
    let (_, msg) = load_error(
        &src,
        &Edit::set("general.architecture", 7u32),
        dir.path(),
        "number",
    );
    assert_names("numeric architecture", &msg, &["general.architecture"]);
}

/// Each `(value, expected words)` set on `key` of the llama model must be refused with a
/// message naming the key and those words.
fn refused(key: &str, cases: Vec<(MetaValue, &[&str])>) {
    let Some(path) = tiny("llama") else { return };
    let src = open(&path);
    let dir = tempdir();
    for (value, words) in cases {
        let what = format!("{key} = {value:?}");
        let (_, msg) = load_error(&src, &Edit::set(key, value), dir.path(), &what);
        assert_names(&what, &msg, &[key]);
        assert_names(&what, &msg, words);
    }
}

#[test]
fn block_count_out_of_range_is_named() {
    refused(
        "llama.block_count",
        vec![
            (MetaValue::U32(0), &["0 is outside"]),
            (MetaValue::U32(4097), &["4097"]),
            (MetaValue::U64(u64::MAX), &["outside"]),
            (MetaValue::I32(-3), &["non-negative integer"]),
            (MetaValue::String("3".into()), &["integer"]),
            (MetaValue::F32(3.0), &["integer"]),
        ],
    );
    let Some(path) = tiny("llama") else { return };
    let src = open(&path);
    let dir = tempdir();
    let (_, msg) = load_error(
        &src,
        &Edit::remove("llama.block_count"),
        dir.path(),
        "no block_count",
    );
    assert_names("no block_count", &msg, &["missing", "llama.block_count"]);
    // More blocks than the file holds: the first missing block's tensor is named.
    for n in [4u32, 4096] {
        let (e, msg) = load_error(
            &src,
            &Edit::set("llama.block_count", n),
            dir.path(),
            "blocks",
        );
        assert!(
            matches!(e, ModelError::MissingTensor { .. }),
            "{n} blocks: {msg}"
        );
        assert_names("too many blocks", &msg, &["blk.3."]);
    }
}

#[test]
fn head_counts_that_do_not_divide_are_named() {
    refused(
        "llama.attention.head_count_kv",
        vec![
            (MetaValue::U32(3), &["8 query heads", "3 key/value heads"]),
            (MetaValue::U32(16), &["16"]),
            (MetaValue::U32(0), &["0 is outside"]),
        ],
    );
    refused(
        "llama.attention.head_count",
        vec![
            (MetaValue::U32(0), &["0 is outside"]),
            (MetaValue::U32(7), &["7 query heads"]),
            (MetaValue::U64(1 << 40), &["outside"]),
            // Per-layer counts that differ are not supported.
            (MetaValue::i32s([8, 8, 4]), &["integer"]),
        ],
    );
    let Some(path) = tiny("llama") else { return };
    let src = open(&path);
    let dir = tempdir();
    // A width that the head count does not divide, with no explicit head width: the heads
    // cannot tile the embedding, whichever check catches it.
    let (_, msg) = load_error(
        &src,
        &Edit::set("llama.attention.head_count", 6u32),
        dir.path(),
        "6 heads",
    );
    assert!(
        msg.contains("head_count") || msg.contains("attn_q.weight"),
        "6 heads of 256: {msg}"
    );
    // More heads than dimensions: a head width of 0 must not reach the plan.
    let mut edit = Edit::set("llama.attention.head_count", 512u32);
    edit.meta
        .push(("llama.attention.head_count_kv".into(), Some(512u32.into())));
    edit.meta.push(("llama.rope.dimension_count".into(), None));
    let (_, msg) = load_error(&src, &edit, dir.path(), "512 heads");
    assert!(
        msg.contains("head_count") || msg.contains("attn_q.weight") || msg.contains("rope"),
        "512 heads of 256: {msg}"
    );
    // Per-layer arrays of one repeated value are the same as the value.
    let same = write(
        &src,
        &Edit::set("llama.attention.head_count", MetaValue::i32s([8, 8, 8])),
        dir.path(),
        "per_layer.gguf",
    );
    assert_eq!(
        Model::load(&same)
            .expect("per-layer head counts")
            .config
            .n_head,
        8
    );
}

#[test]
fn rope_dimensions_that_do_not_fit_the_head_are_named() {
    refused(
        "llama.rope.dimension_count",
        vec![
            (MetaValue::U32(31), &["31 of 32"]),
            (MetaValue::U32(64), &["64 of 32"]),
            (MetaValue::U32(0), &["0 is outside"]),
        ],
    );
    // Rotating part of each head is valid.
    let Some(path) = tiny("llama") else { return };
    let src = open(&path);
    let dir = tempdir();
    let partial = write(
        &src,
        &Edit::set("llama.rope.dimension_count", 16u32),
        dir.path(),
        "p.gguf",
    );
    assert_eq!(
        Model::load(&partial).expect("partial RoPE").config.n_rot,
        16
    );
}

#[test]
fn a_bad_epsilon_is_named() {
    let key = "llama.attention.layer_norm_rms_epsilon";
    refused(
        key,
        vec![
            (MetaValue::String("1e-5".into()), &["finite number"]),
            (MetaValue::F32(f32::NAN), &["finite number"]),
            (MetaValue::F32(f32::INFINITY), &["finite number"]),
            (MetaValue::F32(-1e-5), &["not a valid epsilon"]),
        ],
    );
    let Some(path) = tiny("llama") else { return };
    let src = open(&path);
    let dir = tempdir();
    let (e, msg) = load_error(&src, &Edit::remove(key), dir.path(), "no epsilon");
    assert!(matches!(e, ModelError::MissingKey { .. }), "{msg}");
    assert_names("no epsilon", &msg, &[key]);
}

#[test]
fn other_bad_hyperparameters_are_named() {
    refused(
        "llama.embedding_length",
        vec![(MetaValue::U32(0), &["0 is outside"])],
    );
    refused(
        "llama.feed_forward_length",
        vec![(MetaValue::U32(0), &["0 is outside"])],
    );
    refused(
        "llama.context_length",
        vec![(MetaValue::U32(0), &["0 is outside"])],
    );
    refused(
        "llama.attention.key_length",
        vec![(MetaValue::U32(0), &["0 is outside"])],
    );
    refused(
        "llama.rope.freq_base",
        vec![
            (MetaValue::F32(0.0), &["not positive"]),
            (MetaValue::F32(-10_000.0), &["not positive"]),
            (MetaValue::F32(f32::NAN), &["finite number"]),
        ],
    );
    refused(
        "llama.rope.scaling.factor",
        vec![(MetaValue::F32(-2.0), &["negative"])],
    );
    let Some(path) = tiny("llama") else { return };
    let src = open(&path);
    let dir = tempdir();
    // A width that disagrees with the tensors: the first tensor of the other width is named.
    let (e, msg) = load_error(
        &src,
        &Edit::set("llama.embedding_length", 512u32),
        dir.path(),
        "512",
    );
    assert!(matches!(e, ModelError::BadTensor { .. }), "{msg}");
    assert_names(
        "embedding_length 512",
        &msg,
        &["token_embd.weight", "[512, 512]"],
    );
    let (e, msg) = load_error(
        &src,
        &Edit::set("llama.rope.scaling.type", "yarn"),
        dir.path(),
        "yarn",
    );
    assert!(matches!(e, ModelError::Unsupported { .. }), "{msg}");
    assert_names("yarn", &msg, &["yarn"]);
}
