#!/usr/bin/env python3
"""Exact-arithmetic forward pass of a GGUF model, to tell which backend's rounding moves the
result when two of them disagree.

    f64_forward.py MODEL.gguf perplexity IDS.json [-c 512] [--chunks N]
    f64_forward.py MODEL.gguf logits IDS.json OUT.f32

Weights are dequantized by the `gguf` package (so the quantized weights are the same as every
backend's) and everything after that is float64: no activation quantization, no f16, no
approximated exp or GELU. What is left between this and a backend is that backend's own
arithmetic.

`perplexity` scores IDS (token ids, BOS first, as `akunu tokenize --ids` prints them) exactly as
`akunu perplexity` does: chunks of -c tokens whose first token is BOS, the second half of each
scored, and prints the same `[i]ppl,` line and final estimate. `logits` writes the logits of the
last position (f32, little-endian) for comparison with a backend's.

Families: llama, qwen2, qwen3, gemma3 (the architectures of the default and benchmark models).
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import gguf
import numpy as np


class Model:
    def __init__(self, path: str):
        r = gguf.GGUFReader(path)
        self.arch = str(r.fields["general.architecture"].contents())
        if self.arch not in ("llama", "qwen2", "qwen3", "gemma3"):
            sys.exit(f"unsupported architecture {self.arch}")

        def kv(key, default=None):
            f = r.fields.get(f"{self.arch}.{key}")
            return default if f is None else f.contents()

        self.n_embd = kv("embedding_length")
        self.n_layer = kv("block_count")
        self.n_head = kv("attention.head_count")
        self.n_head_kv = kv("attention.head_count_kv", self.n_head)
        self.head_dim = kv("attention.key_length", self.n_embd // self.n_head)
        self.eps = kv("attention.layer_norm_rms_epsilon")
        self.rope_base = kv("rope.freq_base", 10000.0)
        self.window = kv("attention.sliding_window")
        if kv("rope.scaling.type") not in (None, "none"):
            sys.exit("RoPE scaling is not implemented here")
        self.t = {}
        for t in r.tensors:
            w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
            self.t[t.name] = w.reshape(tuple(int(x) for x in reversed(t.shape)) if w.ndim > 1 else -1)
        if "rope_freqs.weight" in self.t:
            sys.exit("Llama 3.1 RoPE factors are not implemented here")
        self.out = self.t.get("output.weight", self.t["token_embd.weight"])

    def rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def is_local(self, il):
        # Gemma 3: five sliding-window layers, then one global.
        return self.arch == "gemma3" and il % 6 < 5

    def rope(self, x, pos, base):
        # NeoX (halves) for qwen and gemma, interleaved pairs for llama; x: [T, H, D].
        d = self.head_dim
        inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        ang = pos[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        if self.arch == "llama":
            a, b = x[..., 0::2], x[..., 1::2]
            y = np.empty_like(x)
            y[..., 0::2] = a * cos - b * sin
            y[..., 1::2] = a * sin + b * cos
            return y
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)

    def forward(self, ids):
        """Logits of every position of `ids`, read from an empty cache: [T, n_vocab]."""
        t = self.t
        n = len(ids)
        pos = np.arange(n, dtype=np.float64)
        x = t["token_embd.weight"][ids]
        if self.arch == "gemma3":
            x = x * math.sqrt(self.n_embd)
        causal = pos[None, :] <= pos[:, None]
        group = self.n_head // self.n_head_kv
        for il in range(self.n_layer):
            p = f"blk.{il}."
            h = self.rms(x, t[p + "attn_norm.weight"])
            q = (h @ t[p + "attn_q.weight"].T)
            k = (h @ t[p + "attn_k.weight"].T)
            v = (h @ t[p + "attn_v.weight"].T)
            if p + "attn_q.bias" in t:
                q, k, v = q + t[p + "attn_q.bias"], k + t[p + "attn_k.bias"], v + t[p + "attn_v.bias"]
            q = q.reshape(n, self.n_head, self.head_dim)
            k = k.reshape(n, self.n_head_kv, self.head_dim)
            v = v.reshape(n, self.n_head_kv, -1)
            if p + "attn_q_norm.weight" in t:
                q = self.rms(q, t[p + "attn_q_norm.weight"])
                k = self.rms(k, t[p + "attn_k_norm.weight"])
            base = 10000.0 if self.is_local(il) else self.rope_base
            q, k = self.rope(q, pos, base), self.rope(k, pos, base)
            mask = causal
            if self.is_local(il):
                mask = causal & (pos[:, None] - pos[None, :] < self.window)
            out = np.empty((n, self.n_head, v.shape[-1]))
            for hh in range(self.n_head):
                s = q[:, hh] @ k[:, hh // group].T / math.sqrt(self.head_dim)
                s = np.where(mask, s, -np.inf)
                s = np.exp(s - s.max(-1, keepdims=True))
                out[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, hh // group]
            a = out.reshape(n, -1) @ t[p + "attn_output.weight"].T
            if self.arch == "gemma3":
                a = self.rms(a, t[p + "post_attention_norm.weight"])
            x = x + a
            h = self.rms(x, t[p + "ffn_norm.weight"])
            g = h @ t[p + "ffn_gate.weight"].T
            u = h @ t[p + "ffn_up.weight"].T
            if self.arch == "gemma3":
                g = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
            else:
                g = g / (1 + np.exp(-g))
            f = (g * u) @ t[p + "ffn_down.weight"].T
            if self.arch == "gemma3":
                f = self.rms(f, t[p + "post_ffw_norm.weight"])
            x = x + f
        return self.rms(x, t["output_norm.weight"]) @ self.out.T


def log_softmax_at(row, tok):
    m = row.max()
    return row[tok] - m - math.log(np.exp(row - m).sum())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("mode", choices=["perplexity", "logits"])
    ap.add_argument("ids")
    ap.add_argument("out", nargs="?")
    ap.add_argument("-c", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=1 << 30)
    a = ap.parse_args()
    ids = json.load(open(a.ids))
    m = Model(a.model)
    if a.mode == "logits":
        m.forward(ids)[-1].astype("<f4").tofile(a.out)
        return 0
    n_ctx, first = a.c, a.c // 2
    bos = ids[0]
    nll, nll2, count = 0.0, 0.0, 0
    for i in range(min(len(ids) // n_ctx, a.chunks)):
        chunk = ids[i * n_ctx : (i + 1) * n_ctx]
        chunk[0] = bos
        logits = m.forward(chunk)
        for p in range(first, n_ctx - 1):
            v = -log_softmax_at(logits[p], chunk[p + 1])
            nll, nll2, count = nll + v, nll2 + v * v, count + 1
        print(f"[{i + 1}]{math.exp(nll / count):.4f},", end="", flush=True)
    mean = nll / count
    err = math.sqrt((nll2 / count - mean * mean) / (count - 1))
    print(f"\nFinal estimate: PPL = {math.exp(mean):.4f} +/- {err * math.exp(mean):.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
