#!/usr/bin/env python3
"""MLX quantization fixtures for crates/akunu-formats, made by MLX itself.

Usage: python scripts/ref/mlx_fixtures.py OUTDIR   (also run by safetensors_fixtures.py)

Writes OUTDIR/mlx/model (single model.safetensors, config with a `quantization` section and
per-module overrides) and OUTDIR/mlx/sharded (two shards plus index, config with only
`quantization_config`, one module split across shards). Per quantized module, expected/ holds:
  <module>.f32    mx.dequantize(...) cast to float32 (exact: it is computed in the scale dtype)
  <module>.codes  the codes as uint8, recovered by MLX as mx.dequantize with scale 1 and bias 0
Weights are saved with mx.save_safetensors, as mlx-lm saves them.
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

RNG = np.random.default_rng(7)

BITS = [2, 3, 4, 5, 6, 8]
GROUP_SIZES = [32, 64, 128]
DTYPES = {"F16": mx.float16, "BF16": mx.bfloat16, "F32": mx.float32}
DEFAULT = {"group_size": 64, "bits": 4}


def random_weight(shape, dtype):
    # Offset and scale vary per row so groups differ in both scale and bias.
    rows = RNG.standard_normal(shape[:-1] + (1,)) * 0.5 + 1.0
    values = RNG.standard_normal(shape) * rows + RNG.standard_normal(shape[:-1] + (1,))
    values[values == 0] = 0.25
    return mx.array(values.astype(np.float32)).astype(dtype)


def quantize(weight, group_size, bits):
    q, scales, biases = mx.quantize(weight, group_size=group_size, bits=bits, mode="affine")
    deq = mx.dequantize(q, scales, biases, group_size=group_size, bits=bits, mode="affine")
    codes = mx.dequantize(
        q, mx.ones_like(scales), mx.zeros_like(biases), group_size=group_size, bits=bits
    )
    return q, scales, biases, deq, codes


def write_module(expected, arrays, manifest, module, weight, group_size, bits, dtype_name):
    q, scales, biases, deq, codes = quantize(weight, group_size, bits)
    arrays[f"{module}.weight"] = q
    arrays[f"{module}.scales"] = scales
    arrays[f"{module}.biases"] = biases
    (expected / f"{module}.f32").write_bytes(np.array(deq.astype(mx.float32)).tobytes())
    codes = np.array(codes.astype(mx.float32))
    assert codes.min() >= 0 and codes.max() < (1 << bits) and (codes != 0).any()
    (expected / f"{module}.codes").write_bytes(codes.astype(np.uint8).tobytes())
    manifest[module] = {
        "group_size": group_size,
        "bits": bits,
        "dtype": dtype_name,
        "shape": list(weight.shape),
    }


def write_single(root):
    model = root / "model"
    expected = model / "expected"
    expected.mkdir(parents=True, exist_ok=True)
    arrays, modules = {}, {}
    quantization = {**DEFAULT, "mode": "affine"}
    index = 0
    for bits in BITS:
        for group_size in GROUP_SIZES:
            for dtype_name, dtype in DTYPES.items():
                module = f"model.layers.{index}.proj"
                cols = 128 * (1 + index % 3)
                weight = random_weight((8 + index % 5, cols), dtype)
                write_module(expected, arrays, modules, module, weight, group_size, bits, dtype_name)
                # Modules with the model-wide parameters get no entry, as mlx-lm writes them.
                if {"group_size": group_size, "bits": bits} != DEFAULT:
                    quantization[module] = {"group_size": group_size, "bits": bits}
                index += 1
    # Stacked experts, as in a SwitchGLU: a leading expert dimension on every part.
    experts = "model.experts.switch_mlp.down_proj"
    weight = random_weight((4, 8, 256), mx.bfloat16)
    write_module(expected, arrays, modules, experts, weight, 32, 3, "BF16")
    quantization[experts] = {"group_size": 32, "bits": 3}
    # A module the config leaves unquantized, and a plain norm weight.
    arrays["lm_head.weight"] = random_weight((8, 64), mx.float16)
    quantization["lm_head"] = False
    arrays["model.norm.weight"] = random_weight((64,), mx.float32)

    config = {
        "model_type": "fixture",
        "quantization": quantization,
        "quantization_config": quantization,
    }
    (model / "config.json").write_text(json.dumps(config, indent=2))
    mx.save_safetensors(str(model / "model.safetensors"), arrays, metadata={"format": "mlx"})
    manifest = {"modules": modules, "unquantized": ["lm_head.weight", "model.norm.weight"]}
    (model / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return len(modules)


def write_sharded(root):
    model = root / "sharded"
    expected = model / "expected"
    expected.mkdir(parents=True, exist_ok=True)
    arrays, modules = {}, {}
    params = {"group_size": 32, "bits": 6}
    for layer, dtype_name in enumerate(["BF16", "F16", "F32", "BF16"]):
        weight = random_weight((6, 192), DTYPES[dtype_name])
        module = f"model.layers.{layer}.mlp.up_proj"
        write_module(expected, arrays, modules, module, weight, params["group_size"], params["bits"], dtype_name)
    # mlx-lm shards by tensor, so one module's parts can land in different files.
    split = "model.layers.1.mlp.up_proj"
    names = sorted(arrays)
    first = [n for n in names if n.startswith("model.layers.0.") or n == f"{split}.weight"]
    shards = {
        "model-00001-of-00002.safetensors": first,
        "model-00002-of-00002.safetensors": [n for n in names if n not in first],
    }
    weight_map = {}
    for file, members in shards.items():
        mx.save_safetensors(str(model / file), {n: arrays[n] for n in members}, metadata={"format": "mlx"})
        weight_map.update({n: file for n in members})
    total = sum(arrays[n].nbytes for n in names)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (model / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = {"model_type": "fixture", "quantization_config": params}
    (model / "config.json").write_text(json.dumps(config, indent=2))
    (model / "manifest.json").write_text(json.dumps({"modules": modules, "unquantized": []}, indent=2))
    return len(modules)


def write_mlx(out):
    mx.set_default_device(mx.cpu)
    root = Path(out) / "mlx"
    count = write_single(root) + write_sharded(root)
    print(f"mlx {mx.__version__}: {count} quantized modules in {root}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    write_mlx(sys.argv[1])
