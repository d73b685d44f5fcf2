#!/usr/bin/env python3
"""Reference fixtures for the safetensors and MLX readers in crates/akunu-formats.

Usage: python scripts/ref/safetensors_fixtures.py OUTDIR

Writes OUTDIR/safetensors (files written by the `safetensors` Python package, expected values
converted by numpy and ml_dtypes) and OUTDIR/mlx (see mlx_fixtures.py). The Rust tests read them
from $AKUNU_REFDATA. Every value is random and non-zero, so a reader that drops, shifts or
zero-fills data cannot pass.

Needs: numpy, ml_dtypes, safetensors, mlx (on Linux: mlx[cpu]).
"""

import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

import mlx_fixtures

RNG = np.random.default_rng(20240617)


def random_bits(shape, dtype, bad):
    """Random bit patterns of a float dtype, redrawing NaNs, zeros and anything `bad` flags.

    Raw bits rather than rounded normals reach subnormals, the largest finite values and (where
    the dtype has them) infinities, which a conversion is most likely to get wrong.
    """
    width = np.dtype(dtype).itemsize
    uint = {1: np.uint8, 2: np.uint16}[width]
    out = RNG.integers(0, 1 << (8 * width), size=shape, dtype=uint)
    while True:
        values = out.view(dtype).astype(np.float32)
        redo = np.isnan(values) | (values == 0) | bad(values)
        if not redo.any():
            return out.view(dtype)
        out[redo] = RNG.integers(0, 1 << (8 * width), size=int(redo.sum()), dtype=uint)


def nonzero_ints(shape, dtype):
    info = np.iinfo(dtype)
    values = RNG.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    values[values == 0] = 1
    return values


def normals(shape, dtype):
    values = RNG.standard_normal(shape) * 3.0
    values[values == 0] = 0.5
    return values.astype(dtype)


def nothing(values):
    return np.zeros(values.shape, bool)


def dtype_tensors():
    """One tensor per safetensors dtype, with varied ranks including a scalar."""
    bools = RNG.integers(0, 2, size=(7, 3)).astype(bool)
    bools[0, 0] = True
    return {
        "t_bool": bools,
        "t_u8": nonzero_ints((5, 6), np.uint8),
        "t_i8": nonzero_ints((4, 9), np.int8),
        "t_i16": nonzero_ints((3, 4, 5), np.int16),
        "t_u16": nonzero_ints((33,), np.uint16),
        "t_f16": random_bits((6, 17), np.float16, nothing),
        "t_bf16": random_bits((4, 4, 8), ml_dtypes.bfloat16, nothing),
        "t_i32": nonzero_ints((2, 11), np.int32),
        "t_u32": nonzero_ints((3, 7), np.uint32),
        "t_f32": normals((8, 16), np.float32),
        # Wider than f32 in both range and precision, so conversion must round.
        "t_f64": (RNG.standard_normal((5, 5)) * 1e3 + 1e-9).astype(np.float64),
        "t_i64": nonzero_ints((3, 3), np.int64),
        "t_u64": nonzero_ints((4,), np.uint64),
        "t_f8_e4m3": random_bits((9, 4), ml_dtypes.float8_e4m3fn, nothing),
        "t_f8_e5m2": random_bits((3, 10), ml_dtypes.float8_e5m2, nothing),
        "t_scalar": np.array(RNG.standard_normal() + 2.0, dtype=np.float32),
    }


SAFETENSORS_NAMES = {
    np.dtype(bool): "BOOL",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8",
    np.dtype(np.int16): "I16",
    np.dtype(np.uint16): "U16",
    np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.int32): "I32",
    np.dtype(np.uint32): "U32",
    np.dtype(np.float32): "F32",
    np.dtype(np.float64): "F64",
    np.dtype(np.int64): "I64",
    np.dtype(np.uint64): "U64",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
    np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2",
}

# The integer dtypes the reader refuses to convert to f32 (not exactly representable).
NOT_CONVERTIBLE = {"I32", "U32", "I64", "U64"}


def write_expected(directory, name, array):
    """Raw little-endian bytes, and the f32 values where the reader offers a conversion."""
    dtype = SAFETENSORS_NAMES[array.dtype]
    (directory / f"{name}.bin").write_bytes(np.ascontiguousarray(array).tobytes())
    convertible = dtype not in NOT_CONVERTIBLE
    if convertible:
        (directory / f"{name}.f32").write_bytes(array.astype("<f4").tobytes())
    return {"dtype": dtype, "shape": list(array.shape), "f32": convertible}


def write_safetensors(out):
    root = out / "safetensors"
    expected = root / "expected"
    expected.mkdir(parents=True, exist_ok=True)
    manifest = {}

    tensors = dtype_tensors()
    metadata = {"format": "pt", "written_by": "safetensors_fixtures.py"}
    save_file(tensors, str(root / "dtypes.safetensors"), metadata=metadata)
    manifest["dtypes.safetensors"] = {
        "metadata": metadata,
        "tensors": {k: write_expected(expected, k, v) for k, v in tensors.items()},
    }

    # A three-shard checkpoint with its index, laid out as transformers writes one.
    sharded = root / "sharded"
    sharded.mkdir(exist_ok=True)
    shard_dtypes = [np.float32, np.float16, ml_dtypes.bfloat16]
    weight_map, entries, total = {}, {}, 0
    shards = 3
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {}
        for layer in range(s * 2, s * 2 + 2):
            name = f"model.layers.{layer}.mlp.weight"
            part[name] = normals((16, 8 + layer), shard_dtypes[layer % 3])
        part[f"model.norm_{s}.weight"] = normals((16,), np.float32)
        save_file(part, str(sharded / file), metadata={"format": "pt"})
        for name, array in part.items():
            weight_map[name] = file
            entries[name] = write_expected(expected, name, array)
            total += array.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    manifest["sharded"] = {"index_metadata": index["metadata"], "weight_map": weight_map, "tensors": entries}

    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    count = len(manifest["dtypes.safetensors"]["tensors"]) + len(entries)
    print(f"safetensors: {count} tensors in {root}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    # Expected values are written as native numpy bytes, which must be the file's little-endian.
    assert sys.byteorder == "little"
    out = Path(sys.argv[1])
    write_safetensors(out)
    mlx_fixtures.write_mlx(out)


if __name__ == "__main__":
    main()
