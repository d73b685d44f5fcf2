//! The `akunu` binary as a user runs it.

use std::process::{Command, Output};

use akunu_formats::gguf::{GgufWriter, MetaValue};
use akunu_formats::GgmlType;
use serde_json::Value as Json;

fn akunu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_akunu"))
        .args(args)
        // Never reach the network from these tests.
        .env("AKUNU_CACHE", "/nonexistent-akunu-cache")
        .env("AKUNU_PYPI_URL", "http://127.0.0.1:9")
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "akunu failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn small_model(dir: &std::path::Path) -> String {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").unwrap();
    w.add("general.name", "tiny").unwrap();
    w.add("llama.block_count", 1u32).unwrap();
    w.add("llama.rope.freq_base", 1e-6f32).unwrap();
    w.add("tokenizer.ggml.model", "gpt2").unwrap();
    w.add(
        "tokenizer.ggml.tokens",
        MetaValue::strings(["a", "b", "ab"]),
    )
    .unwrap();
    w.add("tokenizer.ggml.merges", MetaValue::strings(["a b"]))
        .unwrap();
    w.add("tokenizer.ggml.bos_token_id", 0u32).unwrap();
    w.add("tokenizer.chat_template", "{{ messages }}").unwrap();
    w.add_tensor("blk.0.w", GgmlType::Q4_K, &[256, 2], vec![7u8; 288])
        .unwrap();
    w.add_tensor("norm", GgmlType::F32, &[4], vec![1u8; 16])
        .unwrap();
    let path = dir.join("tiny.gguf");
    w.write_file(&path).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn inspect_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let model = small_model(dir.path());
    let text = stdout(&akunu(&["inspect", &model]));
    for needle in [
        "architecture   llama",
        "block_count",
        "model          gpt2",
        "merges         1",
        "chat template  present (14 bytes)",
        "blk.0.w",
        "Q4_K",
        "[256, 2]",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    let json: Json =
        serde_json::from_str(&stdout(&akunu(&["inspect", "--json", "-m", &model]))).unwrap();
    assert_eq!(json["tensor_count"], 2);
    assert_eq!(json["hyperparameters"]["block_count"], 1);
    assert_eq!(json["hyperparameters"]["rope.freq_base"], 1e-6);
    assert_eq!(json["tokenizer"]["tokens"], 3);
    assert_eq!(json["chat_template"], true);
    assert_eq!(json["totals_by_type"]["Q4_K"]["bytes"], 288);
    assert_eq!(json["tensors"][0]["shape"], serde_json::json!([256, 2]));
}

#[test]
fn bad_input_gives_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"not a model at all").unwrap();
    let out = akunu(&["inspect", junk.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a GGUF file"), "{err}");

    let out = akunu(&["pull", "not a spec"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "));

    let out = akunu(&["pull", "--sha256", "00"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("carries its own digest"));
}

#[test]
fn out_of_range_numbers_give_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let model = small_model(dir.path());
    let cases: [(&[&str], &str); 5] = [
        (&["serve", "--shutdown-grace", "1e20"], "--shutdown-grace"),
        (&["serve", "--timeout", "18446744073709551615"], "--timeout"),
        (&["serve", "--timeout", "0"], "--timeout"),
        (
            &["bench", "-p", "1-200", "-d", "0-100"],
            "more than 10000 tests",
        ),
        (
            &["bench", "--pg", "18446744073709551615,1"],
            "overflows a token count",
        ),
    ];
    for (args, needle) in cases {
        let out = akunu(&[args, &[model.as_str()]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            err.starts_with("error: ") && err.contains(needle),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn serve_refuses_an_empty_alias() {
    let dir = tempfile::tempdir().unwrap();
    let model = small_model(dir.path());
    let out = akunu(&["serve", "-a", "", model.as_str()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("id must not be empty"), "{err}");
}

#[test]
fn profile_refuses_more_tokens_than_the_context() {
    let Some(dir) = akunu_testutil::refdata("engine") else {
        return;
    };
    let model = dir.join("tiny").join("llama.gguf");
    let model = model.to_str().unwrap();
    for (p, n) in [("18446744073709551615", "1"), ("60", "5")] {
        let out = akunu(&[
            "profile", model, "--device", "cpu", "-c", "64", "-p", p, "-n", n,
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "-p {p} -n {n} succeeded");
        assert!(
            err.starts_with("error: ") && err.contains("must fit the context of 64"),
            "-p {p} -n {n}: {err}"
        );
    }
}

#[test]
fn a_chat_template_that_never_finishes_leaves_completion_working() {
    let Some(dir) = akunu_testutil::refdata("engine") else {
        return;
    };
    let src = akunu_formats::gguf::GgufFile::open(dir.join("tiny").join("llama.gguf")).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in src.metadata() {
        if key != "tokenizer.chat_template" {
            w.add(key, value.to_owned_value()).unwrap();
        }
    }
    w.add(
        "tokenizer.chat_template",
        "{% for m in messages %}{{ m.content }}{% endfor %}\
         {% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    )
    .unwrap();
    for t in src.tensors() {
        w.add_tensor(&t.name, t.ty, &t.dims, src.tensor_data(t).unwrap())
            .unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("looping-template.gguf");
    w.write_file(&model).unwrap();
    let model = model.to_str().unwrap();
    let args = ["--device", "cpu", "-p", "a", "-n", "2"];
    let completed = akunu(&[&["complete", model][..], &args].concat());
    stdout(&completed);
    let chat = akunu(&[&["run", "-m", model][..], &args].concat());
    let err = String::from_utf8_lossy(&chat.stderr);
    assert!(!chat.status.success());
    assert!(
        err.contains("no usable chat template") && err.contains("steps"),
        "{err}"
    );
}

#[test]
fn a_context_larger_than_memory_gives_a_clear_error() {
    let Some(dir) = akunu_testutil::refdata("engine") else {
        return;
    };
    let model = dir.join("tiny").join("llama.gguf");
    let out = akunu(&[
        "complete",
        model.to_str().unwrap(),
        "--device",
        "cpu",
        "-c",
        "1000000000000",
        "-p",
        "a",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.starts_with("error: ")
            && err.contains("the KV cache (1000000000000 positions) needs")
            && err.contains("GB, more than this machine's"),
        "{err}"
    );
}

#[test]
fn inspect_the_default_model() {
    let Some(model) = akunu_testutil::model() else {
        return;
    };
    let json: Json = serde_json::from_str(&stdout(&akunu(&[
        "inspect",
        "--json",
        model.to_str().unwrap(),
    ])))
    .unwrap();
    assert_eq!(json["tensor_count"], 236);
    assert_eq!(json["architecture"], "gemma3");
    let hp = &json["hyperparameters"];
    assert_eq!(hp["block_count"], 18);
    assert_eq!(hp["embedding_length"], 640);
    assert_eq!(hp["attention.head_count"], 4);
    assert_eq!(hp["attention.head_count_kv"], 1);
    assert_eq!(hp["attention.key_length"], 256);
    assert_eq!(hp["attention.sliding_window"], 512);
    assert_eq!(hp["attention.layer_norm_rms_epsilon"], 1e-6);
    assert_eq!(json["tokenizer"]["tokens"], 262_144);
}

#[test]
fn tokenize_prints_ids_and_pieces_like_llama_tokenize() {
    let dir = tempfile::tempdir().unwrap();
    let model = small_model(dir.path());
    // No pre-tokenizer named: the default one; "ab" merges, the space has no token.
    let out = stdout(&akunu(&["tokenize", "-m", &model, "-p", "ab a", "--ids"]));
    assert_eq!(out, "[2, 0]\n");
    let out = stdout(&akunu(&[
        "tokenize",
        "-m",
        &model,
        "-p",
        "ab",
        "--show-count",
    ]));
    assert_eq!(out, "     2 -> 'ab'\nTotal number of tokens: 1\n");
    let file = dir.path().join("text.txt");
    // Escapes are processed (as llama-tokenize does) unless --no-escape; "\n" has no token.
    std::fs::write(&file, "b\\na").unwrap();
    let f = file.to_str().unwrap();
    let run = |args: &[&str]| stdout(&akunu(&[&["tokenize", "-m", &model][..], args].concat()));
    assert_eq!(run(&["-f", f, "--ids"]), "[1, 0]\n");
    assert_eq!(run(&["-f", f, "--ids", "--no-escape"]), "[1, 0]\n");
    assert_eq!(run(&["-p", "a\\x62", "--ids"]), "[2]\n");

    std::fs::write(&file, b"a\xffb").unwrap();
    let out = akunu(&["tokenize", "-m", &model, "-f", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid UTF-8 (at byte 1)"));
    let out = akunu(&["tokenize", "-m", &model]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("-p TEXT, -f FILE or --stdin"));
}

#[test]
fn tokenize_matches_llama_cpp_on_real_vocabularies() {
    let Some(tok) = akunu_testutil::refdata("tok") else {
        return;
    };
    let Some(gemma) = akunu_testutil::model() else {
        return;
    };
    let hard: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(tok.join("corpus/hard.json")).unwrap())
            .unwrap();
    for (name, model) in [
        ("gemma3", gemma),
        ("llama3", tok.join("llama3.gguf")),
        ("qwen3", tok.join("qwen3.gguf")),
    ] {
        let refs =
            std::fs::read_to_string(tok.join(format!("ref/{name}.hard.special.jsonl"))).unwrap();
        for (text, line) in hard.iter().zip(refs.lines()).step_by(7) {
            let want: Json = serde_json::from_str(line).unwrap();
            let model = model.to_str().unwrap();
            let args = ["tokenize", "-m", model, "-p", text, "--ids", "--no-escape"];
            let got = stdout(&akunu(&args));
            let got: Json = serde_json::from_str(&got).unwrap();
            assert_eq!(got, want["with_special"], "{name}: {text:?}");
        }
    }
}
