#!/usr/bin/env python3
"""Small synthetic GGUF models, one or two per architecture the CPU engine runs.

    tiny_models.py OUTDIR [--ggml-lib PATH]

Writes OUTDIR/<name>.gguf for every entry of MODELS and OUTDIR/models.json describing them
(architecture, shapes, tensor types, the features each one exercises). Weights are random with a
fixed seed per model, so the files are the same on every run with the same gguf package and ggml
library.

The files are laid out as llama.cpp's convert_hf_to_gguf.py would write the same model: its
metadata keys (as llama.cpp's loader reads them), tensor names and shapes, and its conventions:
Gemma norms stored as 1 + w (the converter adds the 1 that Gemma's RMSNorm adds at run time), a
Llama 3.1 RoPE scaling carried only by the `rope_freqs.weight` tensor (the converter writes no
`rope.scaling.type` for it, and llama.cpp's loader rejects the string "llama3"), Gemma 3's local
RoPE base left to the loader's default of 10000, embeddings tied by leaving out `output.weight`.

Weights are scaled so that activations stay O(1) and the logits spread over a few units: random
models whose logits all tie, or overflow, would let a broken engine pass.

Quantized tensors: Q8_0, Q4_0 and Q5_0 come from the gguf package's quantizers; the K-quants,
which it cannot quantize, from ggml's own ggml_quantize_chunk loaded with ctypes from --ggml-lib
(default $AKUNU_GGML_LIB), the ggml base library of the reference build. K-quants need rows whose
length is a multiple of 256, which is why the models using them are 256 wide where it matters.

The tokenizer is a minimal SentencePiece vocabulary (the "llama" tokenizer model): the four Gemma
specials, the 256 byte tokens and enough word pieces to reach the vocabulary size. Tests feed
token ids, so it only has to load.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import string
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
F32, F16, Q8_0, Q4_0, Q5_0, Q4_K, Q6_K = Q.F32, Q.F16, Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q4_K, Q.Q6_K
K_QUANTS = {Q4_K, Q6_K}

PAD, EOS, BOS, UNK = 0, 1, 2, 3
LOGIT_STD = 3.0
TIED_INPUT_RMS = 0.2

# general.file_type as llama-quantize would name each mix, after its most common type.
FILE_TYPE = {F32: gguf.LlamaFileType.ALL_F32, F16: gguf.LlamaFileType.MOSTLY_F16,
             Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0, Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0,
             Q5_0: gguf.LlamaFileType.MOSTLY_Q5_0, Q4_K: gguf.LlamaFileType.MOSTLY_Q4_K_M,
             Q6_K: gguf.LlamaFileType.MOSTLY_Q6_K}


@dataclass
class Spec:
    name: str
    arch: str
    seed: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    rope_base: float
    types: dict[str, Q]  # per matrix role: embd, q, k, v, o, gate, up, down, output
    features: list[str]
    tied: bool = True
    qkv_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    sliding_window: int = 0
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    # Llama 3.1 rope_scaling (factor, low_freq_factor, high_freq_factor, original context)
    llama3_rope: tuple[float, float, float, int] | None = None


Q4_K_M = {"embd": Q4_K, "q": Q4_K, "k": Q4_K, "v": Q6_K, "o": Q4_K,
          "gate": Q4_K, "up": Q4_K, "down": Q6_K, "output": Q6_K}

MODELS = [
    Spec("llama", "llama", 101, n_embd=256, n_layer=3, n_head=8, n_head_kv=2, head_dim=32,
         n_ff=512, n_vocab=512, rope_base=10000.0, tied=False, types=Q4_K_M,
         features=["gqa 4:1", "separate output.weight", "Q4_K/Q6_K (Q4_K_M-like mix)",
                   "rope NORM (interleaved pairs)"]),
    Spec("llama31", "llama", 102, n_embd=128, n_layer=2, n_head=4, n_head_kv=2, head_dim=32,
         n_ff=384, n_vocab=384, rope_base=500000.0,
         types={r: F16 for r in ("embd", "q", "k", "v", "o", "gate", "up", "down")},
         llama3_rope=(8.0, 1.0, 4.0, 64),
         features=["gqa 2:1", "tied embeddings (no output.weight)",
                   "Llama 3.1 RoPE scaling via rope_freqs.weight", "F16 weights"]),
    Spec("qwen2", "qwen2", 103, n_embd=128, n_layer=2, n_head=4, n_head_kv=2, head_dim=32,
         n_ff=352, n_vocab=640, rope_base=1000000.0, tied=False, qkv_bias=True,
         types={"embd": Q8_0, "q": Q8_0, "k": Q8_0, "v": Q8_0, "o": Q4_0,
                "gate": Q5_0, "up": Q5_0, "down": Q8_0, "output": Q8_0},
         features=["q/k/v biases", "gqa 2:1", "rope NEOX", "Q8_0/Q4_0/Q5_0 weights"]),
    Spec("qwen3", "qwen3", 104, n_embd=128, n_layer=3, n_head=4, n_head_kv=2, head_dim=64,
         n_ff=384, n_vocab=1000, rope_base=1000000.0, qk_norm=True,
         types={"embd": F16, "q": F32, "k": F32, "v": F32, "o": Q4_K,
                "gate": Q5_0, "up": Q5_0, "down": Q4_0},
         features=["QK-norm", "head_dim*n_head != n_embd", "tied embeddings",
                   "F32/F16/Q4_K/Q5_0/Q4_0 weights"]),
    Spec("gemma", "gemma", 105, n_embd=128, n_layer=2, n_head=4, n_head_kv=1, head_dim=32,
         n_ff=512, n_vocab=333, rope_base=10000.0,
         types={"embd": F32, "q": F32, "k": F32, "v": F32, "o": F32,
                "gate": F16, "up": F16, "down": Q4_0},
         features=["Gemma 1", "multi-query attention", "GELU gated FFN",
                   "embedding scale sqrt(n_embd)", "norms stored as 1+w", "odd vocabulary size"]),
    Spec("gemma2", "gemma2", 106, n_embd=256, n_layer=4, n_head=4, n_head_kv=2, head_dim=64,
         n_ff=512, n_vocab=768, rope_base=10000.0, post_norms=True, sliding_window=8,
         attn_softcap=3.0, final_softcap=10.0,
         types={"embd": Q6_K, "q": Q4_K, "k": Q4_K, "v": Q6_K, "o": Q4_K,
                "gate": Q4_K, "up": Q5_0, "down": Q6_K},
         features=["attention logit soft-capping", "final logit soft-capping",
                   "sliding window 8 on even layers (0, 2), global on odd",
                   "post-attention and post-FFN norms", "Q4_K/Q6_K/Q5_0 weights"]),
    Spec("gemma3", "gemma3", 107, n_embd=128, n_layer=6, n_head=4, n_head_kv=1, head_dim=64,
         n_ff=512, n_vocab=896, rope_base=1000000.0, qk_norm=True, post_norms=True,
         sliding_window=512,
         types={"embd": Q8_0, "q": Q5_0, "k": Q5_0, "v": Q8_0, "o": Q4_K,
                "gate": Q5_0, "up": Q5_0, "down": Q6_K},
         features=["layers 0-4 sliding, layer 5 global (pattern 6)",
                   "rope base 1e6 global, 10000 local (loader default)", "QK-norm", "post-norms",
                   "embedding scale", "window 512 larger than the sequence",
                   "types of the real Q4_K_M file"]),
    Spec("gemma3_swa8", "gemma3", 108, n_embd=128, n_layer=7, n_head=4, n_head_kv=2, head_dim=32,
         n_ff=256, n_vocab=512, rope_base=1000000.0, qk_norm=True, post_norms=True,
         sliding_window=8,
         types={"embd": F16, "q": F16, "k": F16, "v": Q8_0, "o": Q4_0,
                "gate": F16, "up": Q4_0, "down": Q4_K},
         features=["sliding window 8, smaller than the sequence",
                   "layers 0-4 and 6 sliding, layer 5 global", "two RoPE bases", "QK-norm",
                   "post-norms", "gqa 2:1"]),
]


# ---------------------------------------------------------------------------------------------
# quantization


class Ggml:
    """ggml's quantizers (the K-quants the gguf package cannot produce)."""

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        self.lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        self.lib.ggml_quantize_chunk.argtypes = [
            ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
            ctypes.c_int64, ctypes.c_void_p]

    def quantize(self, t: Q, x: np.ndarray) -> np.ndarray:
        rows, cols = x.shape
        block, size = gguf.GGML_QUANT_SIZES[t]
        out = np.zeros(rows * (cols // block) * size, dtype=np.uint8)
        x = np.ascontiguousarray(x, dtype=np.float32)
        written = self.lib.ggml_quantize_chunk(int(t), x.ctypes.data, out.ctypes.data, 0, rows,
                                               cols, None)
        assert written == out.size, (t.name, written, out.size)
        return out.reshape(rows, -1)


def encode(x: np.ndarray, t: Q, ggml: Ggml | None) -> np.ndarray:
    """x (rows, cols) float32 as tensor data of type t (rows, bytes per row for quantized)."""
    if t == F32:
        return x.astype(np.float32)
    if t == F16:
        return x.astype(np.float16)
    block = gguf.GGML_QUANT_SIZES[t][0]
    assert x.shape[1] % block == 0, f"{t.name} needs rows of a multiple of {block}, got {x.shape}"
    if t in K_QUANTS:
        if ggml is None:
            sys.exit("K-quants need ggml: pass --ggml-lib or set AKUNU_GGML_LIB")
        return ggml.quantize(t, x)
    return gguf.quants.quantize(x.astype(np.float32), t)


# ---------------------------------------------------------------------------------------------
# vocabulary


def vocab(n: int) -> tuple[list[str], list[float], list[int]]:
    """Specials at Gemma's ids, the 256 byte tokens, then word pieces up to n tokens."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"]
    types = [gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL,
             gguf.TokenType.UNKNOWN]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    letters = string.ascii_lowercase
    pieces = ["\u2581"] + [f"\u2581{a}" for a in letters] + list(letters)
    pieces += [f"\u2581{a}{b}" for a in letters for b in letters]
    pieces += [f"{a}{b}" for a in letters for b in letters]
    need = n - len(tokens)
    assert 0 <= need <= len(pieces), n
    tokens += pieces[:need]
    types += [gguf.TokenType.NORMAL] * need
    scores = [0.0] * (n - need) + [-float(i) for i in range(need)]
    return tokens, scores, [int(t) for t in types]


# ---------------------------------------------------------------------------------------------
# weights


def llama3_rope_factors(spec: Spec) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors, for rope_type "llama3"."""
    factor, low, high, old_ctx = spec.llama3_rope
    dim = spec.head_dim
    freqs = 1.0 / (spec.rope_base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def build(spec: Spec, path: Path, ggml: Ggml | None) -> dict:
    rng = np.random.default_rng(spec.seed)
    gemma = spec.arch.startswith("gemma")
    d, hd, ff, nv = spec.n_embd, spec.head_dim, spec.n_ff, spec.n_vocab
    q_dim, kv_dim = spec.n_head * hd, spec.n_head_kv * hd

    def normal(rows: int, cols: int, std: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        # Random around 1. Gemma checkpoints hold w and compute x * (1 + w); the converter stores
        # 1 + w, so the file holds the same kind of values either way.
        return 1 + (rng.standard_normal(n) * 0.1).astype(np.float32)

    tensors: list[tuple[str, np.ndarray, Q]] = []

    def matrix(name: str, role: str, rows: int, cols: int, std: float) -> None:
        tensors.append((name, normal(rows, cols, std), spec.types[role]))

    # Logits are the output matrix times output_norm.weight times a unit-RMS vector; they should
    # spread with a standard deviation of about LOGIT_STD. A separate output matrix gets rows of
    # std LOGIT_STD/sqrt(d). A tied one is also the input embedding, whose row for the current
    # token stays in the residual stream: large embeddings would make every position predict
    # its own input token. Tied embeddings are therefore small (the input, after Gemma's sqrt(d)
    # scale, has an RMS of TIED_INPUT_RMS, below the layers' O(1) contributions), and a large
    # output norm restores the logit spread, as real Gemma checkpoints do with norms of 10-40.
    if spec.tied:
        embd_std = TIED_INPUT_RMS / (math.sqrt(d) if gemma else 1.0)
        out_gain = LOGIT_STD / (embd_std * math.sqrt(d))
    else:
        embd_std, out_gain = 1.0, 1.0
    matrix("token_embd.weight", "embd", nv, d, embd_std)
    tensors.append(("output_norm.weight", out_gain * norm(d), F32))
    if not spec.tied:
        matrix("output.weight", "output", nv, d, LOGIT_STD / math.sqrt(d))
    if spec.llama3_rope:
        tensors.append(("rope_freqs.weight", llama3_rope_factors(spec), F32))

    # Inputs to every projection are RMS-normalized: std 1/sqrt(fan_in) keeps outputs O(1), and
    # attention scores then spread by about 1, enough for masks and RoPE to matter. Larger gains
    # make the models needlessly sensitive to llama.cpp's own rounding of activations.
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        tensors.append((p + "attn_norm.weight", norm(d), F32))
        matrix(p + "attn_q.weight", "q", q_dim, d, 1.0 / math.sqrt(d))
        matrix(p + "attn_k.weight", "k", kv_dim, d, 1.0 / math.sqrt(d))
        matrix(p + "attn_v.weight", "v", kv_dim, d, 1.0 / math.sqrt(d))
        if spec.qkv_bias:
            for t, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                tensors.append((p + f"attn_{t}.bias", (rng.standard_normal(n) * 0.5)
                                .astype(np.float32), F32))
        if spec.qk_norm:
            tensors.append((p + "attn_q_norm.weight", norm(hd), F32))
            tensors.append((p + "attn_k_norm.weight", norm(hd), F32))
        matrix(p + "attn_output.weight", "o", d, q_dim, 1.0 / math.sqrt(q_dim))
        if spec.post_norms:
            tensors.append((p + "post_attention_norm.weight", norm(d), F32))
        tensors.append((p + "ffn_norm.weight", norm(d), F32))
        matrix(p + "ffn_gate.weight", "gate", ff, d, 1.0 / math.sqrt(d))
        matrix(p + "ffn_up.weight", "up", ff, d, 1.0 / math.sqrt(d))
        matrix(p + "ffn_down.weight", "down", d, ff, 1.0 / math.sqrt(ff))
        if spec.post_norms:
            tensors.append((p + "post_ffw_norm.weight", norm(d), F32))

    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_name(f"akunu tiny {spec.name}")
    w.add_context_length(4096)
    w.add_embedding_length(d)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_layer_norm_rms_eps(1e-6 if gemma else 1e-5)
    if q_dim != d or gemma:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if spec.arch == "llama":
        w.add_rope_dimension_count(hd)
        w.add_vocab_size(nv)
    w.add_rope_freq_base(spec.rope_base)
    if spec.sliding_window:
        w.add_sliding_window(spec.sliding_window)
    if spec.attn_softcap:
        w.add_attn_logit_softcapping(spec.attn_softcap)
    if spec.final_softcap:
        w.add_final_logit_softcapping(spec.final_softcap)
    w.add_file_type(FILE_TYPE[spec.types["gate"]])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    tokens, scores, types = vocab(nv)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    w.add_unk_token_id(UNK)
    w.add_pad_token_id(PAD)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(not gemma)

    described = []
    for name, x, t in tensors:
        if x.ndim == 1:
            w.add_tensor(name, x)
            described.append({"name": name, "type": "F32", "shape": [x.shape[0]]})
            continue
        data = encode(x, t, ggml)
        # Quantized data goes in as bytes per row; the writer derives the element shape.
        w.add_tensor(name, data, raw_dtype=t if t not in (F32, F16) else None)
        described.append({"name": name, "type": t.name, "shape": [x.shape[1], x.shape[0]]})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    return {
        "file": path.name,
        "arch": spec.arch,
        "n_embd": d,
        "n_layer": spec.n_layer,
        "n_head": spec.n_head,
        "n_head_kv": spec.n_head_kv,
        "head_dim": hd,
        "n_ff": ff,
        "n_vocab": nv,
        "rope_freq_base": spec.rope_base,
        "sliding_window": spec.sliding_window,
        "attn_logit_softcapping": spec.attn_softcap,
        "final_logit_softcapping": spec.final_softcap,
        "tied_embeddings": spec.tied,
        "llama3_rope_scaling": None if spec.llama3_rope is None else dict(
            zip(("factor", "low_freq_factor", "high_freq_factor",
                 "original_max_position_embeddings"), spec.llama3_rope)),
        "features": spec.features,
        "tensor_types": sorted({t["type"] for t in described}),
        "tensors": described,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--ggml-lib", default=os.environ.get("AKUNU_GGML_LIB"),
                    help="libggml-base.so for the K-quants (default $AKUNU_GGML_LIB)")
    args = ap.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    ggml = Ggml(args.ggml_lib) if args.ggml_lib else None
    models = {}
    for spec in MODELS:
        tmp = args.outdir / f"{spec.name}.gguf.tmp"
        info = build(spec, tmp, ggml)
        tmp.replace(args.outdir / f"{spec.name}.gguf")
        info["file"] = f"{spec.name}.gguf"
        models[spec.name] = info
        print(f"wrote {args.outdir / info['file']} ({spec.arch}, {', '.join(info['tensor_types'])})")
    (args.outdir / "models.json").write_text(json.dumps(models, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
