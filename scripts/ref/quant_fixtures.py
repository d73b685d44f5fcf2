"""Reference data for akunu-quant: ggml's own dequantizers and quantizers (through ctypes on
libggml-base.so, built by build_ggml_ref.sh) and the `gguf` Python package's.

  quant_fixtures.py OUTDIR [--ggml-lib PATH]

The library is PATH, else $AKUNU_GGML_LIB, else OUTDIR/../ggml/libggml-base.so (the layout
scripts/test.sh uses: $AKUNU_REFDATA/ggml and $AKUNU_REFDATA/quant).

Per type NAME (lower case), raw little-endian files:
  NAME.blocks.bin         random blocks (scale fields replaced by finite values, some of them
                          negative, zero or f16-subnormal)
  NAME.dequant.f32        ggml's dequantization of NAME.blocks.bin
  NAME.dequant_alt.f32    an independent dequantization: gguf-py where it has the type, else numpy
  NAME.qin.f32            f32 rows to quantize (n_per_row each)
  NAME.qout.bin           ggml's quantization of NAME.qin.f32 (ggml_quantize_chunk without an
                          importance matrix; quantize_row_q8_1_ref / _q8_K_ref for Q8_1 / Q8_K)
  NAME.qout_gguf.bin      gguf-py's quantization, where it has one
and manifest.json describing them, including where the alternatives disagree with ggml.
"""
import argparse
import ctypes
import json
import os
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

LCP_VERSION = "0.3.36"
N_PER_ROW = 1024
# Elements of random blocks per type for the dequantization check.
DEQUANT_ELEMENTS = 65536
# Repetitions of the quantization row set (49 rows each). A single float operation evaluated in
# another order inside a scale search changes only a few blocks in ten thousand: eight sets catch
# such a change in make_qkx2_quants, one set does not.
ROW_SETS = 8

# Byte offsets of the f16 scale fields in each block (ggml-common.h); Q8_K's scale is an f32.
F16_FIELDS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0], Q.Q8_1: [0, 2],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
    Q.IQ4_NL: [0], Q.IQ4_XS: [0],
}
QUANTIZED = list(F16_FIELDS) + [Q.Q8_K]
FLOATS = [Q.F16, Q.BF16]
# Types ggml_quantize_chunk does not cover: they have an exported reference row quantizer.
ROW_REF = {Q.Q8_1: "quantize_row_q8_1_ref", Q.Q8_K: "quantize_row_q8_K_ref"}


class TypeTraits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


ROW_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class Ggml:
    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        self.lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
        self.lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
        self.lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        self.lib.ggml_quantize_chunk.argtypes = [
            ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
            ctypes.c_int64, ctypes.c_void_p]

    def traits(self, t: Q) -> TypeTraits:
        return self.lib.ggml_get_type_traits(int(t)).contents

    def sizes(self, t: Q) -> tuple[int, int]:
        tr = self.traits(t)
        return tr.blck_size, tr.type_size

    def row_fn(self, name: str):
        fn = getattr(self.lib, name)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        return fn

    def dequantize(self, t: Q, blocks: np.ndarray, n: int) -> np.ndarray:
        out = np.zeros(n, dtype=np.float32)
        if t == Q.Q8_1:
            # ggml has no Q8_1 dequantizer; without its `s` field a Q8_1 block is a Q8_0 block.
            b = blocks.reshape(-1, 36)
            blocks = np.ascontiguousarray(np.concatenate([b[:, :2], b[:, 4:]], axis=1))
            t = Q.Q8_0
        if t == Q.Q8_K:
            fn = self.row_fn("dequantize_row_q8_K")
        else:
            ptr = self.traits(t).to_float
            assert ptr, f"ggml has no to_float for {t.name}"
            fn = ROW_FN(ptr)
        fn(blocks.ctypes.data, out.ctypes.data, n)
        return out

    def quantize(self, t: Q, x: np.ndarray) -> np.ndarray:
        block, size = self.sizes(t)
        out = np.zeros(x.size // block * size, dtype=np.uint8)
        if t in ROW_REF:
            self.row_fn(ROW_REF[t])(x.ctypes.data, out.ctypes.data, x.size)
        else:
            rows = x.size // N_PER_ROW
            written = self.lib.ggml_quantize_chunk(int(t), x.ctypes.data, out.ctypes.data, 0, rows,
                                                   N_PER_ROW, None)
            assert written == out.size, (t.name, written, out.size)
        return out


def random_scales(rng, n: int, dtype) -> np.ndarray:
    """Finite scales spanning f16 subnormals to ~100, both signs, a few exact zeros."""
    mag = np.exp2(rng.uniform(-20, 7, n))
    v = (mag * rng.choice([-1.0, 1.0], n)).astype(dtype)
    v[rng.random(n) < 0.02] = 0
    return v


def random_blocks(rng, t: Q, n_blocks: int, size: int) -> np.ndarray:
    b = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    if t == Q.Q8_K:
        b[:, 0:4] = random_scales(rng, n_blocks, np.float32).view(np.uint8).reshape(-1, 4)
    else:
        for off in F16_FIELDS[t]:
            b[:, off:off + 2] = random_scales(rng, n_blocks, np.float16).view(np.uint8).reshape(-1, 2)
    return b.reshape(-1)


def random_float_bits(rng, t: Q, n: int) -> np.ndarray:
    """Random F16/BF16 bit patterns with NaNs replaced by finite values (infinities stay)."""
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    exp_mask, man_mask = (0x7C00, 0x03FF) if t == Q.F16 else (0x7F80, 0x007F)
    nan = ((bits & exp_mask) == exp_mask) & ((bits & man_mask) != 0)
    bits[nan] &= ~np.uint16(exp_mask)
    return bits.view(np.uint8)


def alt_dequantize(t: Q, blocks: np.ndarray, n: int) -> tuple[np.ndarray, str]:
    if t == Q.Q8_1:
        b = blocks.reshape(-1, 36)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        return (b[:, 4:].view(np.int8).astype(np.float32) * d).reshape(-1), "numpy"
    if t == Q.Q8_K:
        b = blocks.reshape(-1, 292)
        d = b[:, 0:4].copy().view(np.float32)
        return (d * b[:, 4:260].view(np.int8).astype(np.float32)).reshape(-1), "numpy"
    return gguf.quants.dequantize(blocks, t).reshape(-1).astype(np.float32), "gguf-py"


def gguf_quantize(t: Q, x: np.ndarray):
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            out = gguf.quants.quantize(x.reshape(-1, N_PER_ROW), t)
    except NotImplementedError:
        return None
    return np.ascontiguousarray(out).view(np.uint8).reshape(-1)


def quantize_rows(rng) -> np.ndarray:
    """ROW_SETS times the same recipe of N_PER_ROW-value rows."""
    return np.concatenate([quantize_row_set(rng) for _ in range(ROW_SETS)])


def quantize_row_set(rng) -> np.ndarray:
    """Rows of N_PER_ROW values: Gaussian at several scales, outliers, heavy tails, one-signed
    rows, mixed sub-block magnitudes, near-zero groups, a constant row and one zero row."""
    rows = []
    for scale in [1e-3, 0.02, 0.3, 1.0, 50.0]:
        for _ in range(4):
            rows.append(rng.standard_normal(N_PER_ROW) * scale)
    for _ in range(6):
        r = rng.standard_normal(N_PER_ROW) * 0.02
        idx = rng.choice(N_PER_ROW, rng.integers(1, 8), replace=False)
        r[idx] *= rng.uniform(20, 200, idx.size)
        rows.append(r)
    for _ in range(4):
        rows.append(rng.laplace(0, 0.05, N_PER_ROW))
        rows.append(rng.standard_t(2.5, N_PER_ROW) * 0.1)
    for _ in range(3):
        rows.append(np.abs(rng.standard_normal(N_PER_ROW)) * 0.5 + 0.1)
        rows.append(-np.abs(rng.standard_normal(N_PER_ROW)) * 0.5 - 0.1)
        rows.append(rng.uniform(-1, 1, N_PER_ROW))
    for _ in range(4):
        # Each group of 16 on its own scale, some of them (numerically) zero.
        groups = np.exp2(rng.uniform(-60, 4, N_PER_ROW // 16))
        groups[rng.random(groups.size) < 0.1] = 0
        rows.append(rng.standard_normal(N_PER_ROW) * np.repeat(groups, 16))
    rows.append(np.full(N_PER_ROW, 0.37))
    rows.append(np.zeros(N_PER_ROW))
    return np.concatenate(rows).astype(np.float32)


def float_inputs(rng) -> np.ndarray:
    """Values for F16/BF16 rounding: random bit patterns over all exponents, ties, specials."""
    n = 64 * N_PER_ROW
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32).copy()
    # Values in the f16 range (normal and subnormal) and exact ties of both formats.
    k = n // 4
    x[:k] = (rng.standard_normal(k) * np.exp2(rng.uniform(-26, 17, k))).astype(np.float32)
    ties = rng.integers(0, 1 << 32, k, dtype=np.uint64).astype(np.uint32)
    x[k:2 * k] = ((ties & np.uint32(0xFFFF0000)) | np.uint32(0x8000)).view(np.float32)
    # Midpoints between neighbouring halves (subnormal ones included), exact in f32.
    lo = rng.integers(0, 0x7C00, k, dtype=np.uint16).view(np.float16)
    hi = np.nextafter(lo, np.float16(np.inf))
    x[2 * k:3 * k] = ((lo.astype(np.float64) + hi.astype(np.float64)) / 2).astype(np.float32)
    x[3 * k:3 * k + 8] = [np.inf, -np.inf, np.nan, -np.nan, 65504, 65520, -0.0, 1e-8]
    return x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--ggml-lib", type=Path, default=os.environ.get("AKUNU_GGML_LIB"))
    args = ap.parse_args()
    out: Path = args.outdir
    lib = args.ggml_lib or out.resolve().parent / "ggml" / "libggml-base.so"
    if not Path(lib).is_file():
        print(f"{lib} not found: build it with scripts/ref/build_ggml_ref.sh", file=sys.stderr)
        return 1
    ggml = Ggml(Path(lib))
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20240611)
    manifest = {"ggml": f"llama-cpp-python {LCP_VERSION}", "n_per_row": N_PER_ROW, "types": {}}
    notes = []

    for t in QUANTIZED + FLOATS:
        name = t.name.lower()
        block, size = ggml.sizes(t)
        entry = {"type": t.name, "block_size": block, "type_size": size}
        if gguf.GGML_QUANT_SIZES[t] != (block, size):
            notes.append(f"{t.name}: gguf-py's GGML_QUANT_SIZES says {gguf.GGML_QUANT_SIZES[t]}, "
                         f"ggml says {(block, size)}")

        if t in FLOATS:
            blocks = random_float_bits(rng, t, 16 * N_PER_ROW)
            n = blocks.size // 2
        else:
            n_blocks = DEQUANT_ELEMENTS // block
            blocks = random_blocks(rng, t, n_blocks, size)
            n = n_blocks * block
        want = ggml.dequantize(t, blocks, n)
        alt, alt_name = alt_dequantize(t, blocks, n)
        assert not np.isnan(want).any(), f"{t.name}: NaN in dequantized reference"
        alt_diff = int((want.view(np.uint32) != alt.view(np.uint32)).sum())
        blocks.tofile(out / f"{name}.blocks.bin")
        want.tofile(out / f"{name}.dequant.f32")
        alt.tofile(out / f"{name}.dequant_alt.f32")
        entry["dequant"] = {"elements": n, "alt": alt_name, "alt_mismatches": alt_diff}
        if alt_diff:
            notes.append(f"{t.name}: {alt_name} dequantize differs from ggml in {alt_diff} of {n}")

        x = float_inputs(rng) if t in FLOATS else quantize_rows(rng)
        want = ggml.quantize(t, x)
        x.tofile(out / f"{name}.qin.f32")
        want.tofile(out / f"{name}.qout.bin")
        entry["quantize"] = {"elements": x.size, "gguf": None}
        got = gguf_quantize(t, x)
        if got is not None:
            diff = int((got != want).sum())
            got.tofile(out / f"{name}.qout_gguf.bin")
            entry["quantize"]["gguf"] = {"byte_mismatches": diff}
            if diff:
                notes.append(f"{t.name}: gguf-py quantize differs from ggml in {diff} of {want.size} bytes")
        manifest["types"][name] = entry

    manifest["notes"] = notes
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for line in notes:
        print("note:", line)
    print(f"wrote {len(manifest['types'])} types to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
