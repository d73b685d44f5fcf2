//! `akunu perplexity` and `akunu bench` on the default model (`$AKUNU_MODEL`), and perplexity
//! against llama-perplexity's result on the same text (`$AKUNU_REFDATA/engine`, written by
//! `scripts/ref/engine_fixtures.py`).

use std::path::Path;
use std::process::{Command, Output};

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

/// Plain English prose, varied enough that the model's perplexity on it is moderate.
fn english(sentences: usize) -> String {
    const SUBJECTS: [&str; 6] = [
        "The old fisherman",
        "A young teacher",
        "My neighbour",
        "The small dog",
        "Every child in the village",
        "The doctor",
    ];
    const VERBS: [&str; 5] = [
        "walked slowly to",
        "often talked about",
        "came back from",
        "was thinking of",
        "painted a picture of",
    ];
    const OBJECTS: [&str; 7] = [
        "the harbour before the storm",
        "the market on Sunday morning",
        "a quiet garden behind the church",
        "the river that runs past the school",
        "the long road over the hills",
        "an island far out at sea",
        "the house where she was born",
    ];
    (0..sentences)
        .map(|i| {
            format!(
                "{} {} {}.",
                SUBJECTS[i % SUBJECTS.len()],
                VERBS[(i / 2) % VERBS.len()],
                OBJECTS[(i * 3 + 1) % OBJECTS.len()]
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The value of `Final estimate: PPL = X +/- Y`.
fn final_ppl(out: &Output) -> (f64, f64) {
    let text = stdout(out);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("Final estimate: PPL = "))
        .unwrap_or_else(|| panic!("no final estimate in:\n{text}"));
    let (ppl, err) = line.split_once(" +/- ").expect("PPL +/- error");
    (ppl.parse().unwrap(), err.parse().unwrap())
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn bench_json_has_llama_bench_fields() {
    let Some(model) = akunu_testutil::model() else {
        return;
    };
    let model = model.to_str().unwrap();
    let out = stdout(&akunu(&[
        "bench", "-m", model, "-p", "16", "-n", "4", "-r", "2", "-t", "2", "-o", "json",
    ]));
    let json: Json = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}:\n{out}"));
    let tests = json.as_array().expect("an array of tests");
    assert_eq!(tests.len(), 2, "{out}");
    for (t, (n_prompt, n_gen)) in tests.iter().zip([(16, 0), (0, 4)]) {
        assert_eq!(t["model_filename"], model);
        assert_eq!(t["n_prompt"], n_prompt);
        assert_eq!(t["n_gen"], n_gen);
        assert_eq!(t["n_threads"], 2);
        assert_eq!(t["n_batch"], 2048);
        assert_eq!(t["backends"], "CPU");
        assert!(
            t["model_type"].as_str().unwrap().starts_with("gemma3 "),
            "{t}"
        );
        assert!(t["model_size"].as_u64().unwrap() > 100 << 20, "{t}");
        assert!(t["model_n_params"].as_u64().unwrap() > 100_000_000, "{t}");
        assert!(t["test_time"].as_str().unwrap().ends_with('Z'), "{t}");
        assert!(t["avg_ns"].as_u64().unwrap() > 0, "{t}");
        assert!(t["stddev_ns"].as_u64().is_some(), "{t}");
        let avg_ts = t["avg_ts"].as_f64().unwrap();
        assert!(avg_ts > 0.0 && avg_ts.is_finite(), "{t}");
        assert!(t["stddev_ts"].as_f64().unwrap() >= 0.0, "{t}");
        let ns = t["samples_ns"].as_array().unwrap();
        let ts = t["samples_ts"].as_array().unwrap();
        assert_eq!((ns.len(), ts.len()), (2, 2), "{t}");
        for (ns, ts) in ns.iter().zip(ts) {
            let (ns, ts) = (ns.as_u64().unwrap(), ts.as_f64().unwrap());
            let tokens = (n_prompt + n_gen) as f64;
            assert!((ts - tokens * 1e9 / ns as f64).abs() <= 1e-6 * ts, "{t}");
        }
    }
}

#[test]
fn bench_markdown_table() {
    let Some(model) = akunu_testutil::model() else {
        return;
    };
    let out = stdout(&akunu(&[
        "bench",
        model.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "0",
        "-r",
        "1",
        "-t",
        "1",
        "-ngl",
        "99",
    ]));
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("| model ")
            && lines[0].ends_with("|            test |                  t/s |"),
        "{out}"
    );
    assert!(lines[1].starts_with("| ------"), "{out}");
    let row = lines[2];
    assert!(
        row.contains(" CPU ") && row.contains(" pp8 |") && row.contains(" ± "),
        "{out}"
    );
    assert_eq!(
        lines.len(),
        5,
        "one test, a blank line and the build line:\n{out}"
    );
}

/// `--device cuda` either runs on a GPU or fails saying why: it never falls back to the CPU.
#[test]
fn bench_on_cuda_never_falls_back_to_the_cpu() {
    let Some(model) = akunu_testutil::model() else {
        return;
    };
    let m = model.to_str().unwrap();
    let bench = |extra: &[&str]| {
        let mut args = vec![
            "bench", m, "-p", "8", "-n", "0", "-r", "1", "--device", "cuda",
        ];
        args.extend_from_slice(extra);
        akunu(&args)
    };
    let out = bench(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        let table = String::from_utf8_lossy(&out.stdout);
        assert!(
            table.contains(" CUDA ") && !table.contains(" CPU "),
            "{table}"
        );
    } else {
        assert!(err.contains("CUDA backend: "), "{err}");
    }
    assert!(!err.contains("running on the CPU"), "{err}");

    let out = bench(&["-ngl", "0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("-ngl 0 runs on the CPU, which contradicts --device cuda"),
        "{err}"
    );
}

#[test]
fn perplexity_is_finite_and_independent_of_threads() {
    let Some(model) = akunu_testutil::model() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "text.txt", &(english(40) + "\n"));
    let run = |threads: &str| {
        akunu(&[
            "perplexity",
            "-m",
            model.to_str().unwrap(),
            "-f",
            &file,
            "-c",
            "64",
            "--chunks",
            "3",
            "-t",
            threads,
        ])
    };
    let one = run("1");
    let text = stdout(&one);
    assert!(text.starts_with("[1]") && text.contains(",[3]"), "{text}");
    assert!(
        !text.contains("[4]"),
        "--chunks 3 scores three chunks:\n{text}"
    );
    let (ppl, err) = final_ppl(&one);
    assert!(ppl.is_finite() && ppl > 1.0, "{text}");
    assert!(err > 0.0 && err < ppl, "{text}");
    let (ppl2, _) = final_ppl(&run("2"));
    assert!(
        (ppl - ppl2).abs() <= 1e-3 * ppl,
        "1 thread {ppl}, 2 threads {ppl2}"
    );
}

#[test]
fn perplexity_refuses_a_short_text() {
    let Some(model) = akunu_testutil::model() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "short.txt", &english(3));
    let out = akunu(&[
        "perplexity",
        model.to_str().unwrap(),
        "-f",
        &file,
        "-c",
        "64",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("you need at least 128 tokens to evaluate perplexity with a context of 64"),
        "{err}"
    );
}

#[test]
fn perplexity_reports_a_missing_file() {
    // The text is read before the model is looked at, so no model is needed.
    let out = akunu(&["perplexity", "-f", "/nonexistent/text.txt"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/text.txt"), "{err}");
}

/// The full llama-perplexity run recorded in the engine manifest: same text, same flags.
#[test]
fn perplexity_matches_llama_cpp() {
    let (Some(model), Some(dir)) = (akunu_testutil::model(), akunu_testutil::refdata("engine"))
    else {
        return;
    };
    let manifest: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let reference = &manifest["perplexity"];
    let args: Vec<String> = reference["command"]
        .as_array()
        .expect("the llama-perplexity command")
        .iter()
        .skip(1)
        .map(|a| match a.as_str().unwrap() {
            "MODEL" => model.to_str().unwrap().to_owned(),
            other if other == reference["text"] => dir.join(other).to_str().unwrap().to_owned(),
            other => other.to_owned(),
        })
        .collect();
    let mut argv = vec!["perplexity"];
    argv.extend(args.iter().map(String::as_str));
    let out = akunu(&argv);
    let text = stdout(&out);
    let chunks = reference["chunks"].as_u64().unwrap() as usize;
    assert!(text.contains(&format!(",[{chunks}]")), "{text}");
    let (ppl, err) = final_ppl(&out);
    let want = reference["final"].as_f64().unwrap();
    let want_err = reference["final_err"].as_f64().unwrap();
    let tol = reference["tolerance"]["rel"].as_f64().unwrap();
    eprintln!("akunu PPL = {ppl} +/- {err}, llama.cpp {want} +/- {want_err}");
    assert!(
        (ppl - want).abs() <= tol * want,
        "PPL {ppl} vs llama.cpp's {want} (tolerance {tol} relative)"
    );
    assert!(
        (err - want_err).abs() <= 0.05 * want_err,
        "error {err} vs {want_err}"
    );
}
