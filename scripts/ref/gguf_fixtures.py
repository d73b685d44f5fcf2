"""GGUF cross-checks against the `gguf` Python package (the reference reader and writer).

  gguf_fixtures.py write OUTDIR        a GGUF written by gguf-py, and the values it holds as JSON
  gguf_fixtures.py check FILE JSON     read FILE with gguf-py and compare it with JSON
  gguf_fixtures.py digests MODEL OUT   sha256 of every tensor of MODEL dequantized by gguf-py

JSON form of a value: {"type": NAME, "value": V}; arrays: {"type": "array", "elem": NAME,
"items": [values of the same form]}. Tensors: {name: {"type": ggml name, "dims": [...],
"sha256": digest of the raw bytes}}.
"""
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q, GGUFValueType as V

NAMES = {V.UINT8: "u8", V.INT8: "i8", V.UINT16: "u16", V.INT16: "i16", V.UINT32: "u32",
         V.INT32: "i32", V.FLOAT32: "f32", V.BOOL: "bool", V.STRING: "string", V.ARRAY: "array",
         V.UINT64: "u64", V.INT64: "i64", V.FLOAT64: "f64"}


def scalar(t, v):
    return {"type": NAMES[t], "value": v}


def array(elem, items):
    return {"type": "array", "elem": NAMES[elem], "items": items}


def write(outdir: Path):
    rng = np.random.default_rng(1234)
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / "pywritten.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    expected = {"general.architecture": scalar(V.STRING, "llama")}

    def kv(key, t, v):
        w.add_key_value(key, v, t)
        expected[key] = scalar(t, v)

    kv("x.u8", V.UINT8, 200)
    kv("x.i8", V.INT8, -100)
    kv("x.u16", V.UINT16, 60000)
    kv("x.i16", V.INT16, -30000)
    kv("x.u32", V.UINT32, 4_000_000_000)
    kv("x.i32", V.INT32, -2_000_000_000)
    kv("x.f32", V.FLOAT32, float(np.float32(0.1)))
    kv("x.bool", V.BOOL, True)
    kv("x.string", V.STRING, "Grüße, 世界 🌍\n\ttabs")
    kv("x.u64", V.UINT64, 2**63 + 12345)
    kv("x.i64", V.INT64, -(2**62))
    kv("x.f64", V.FLOAT64, 2.718281828459045)
    tokens = ["<s>", "</s>", "▁the", "<0x0A>", "日本", "🦀"]
    w.add_key_value("x.tokens", tokens, V.ARRAY, V.STRING)
    expected["x.tokens"] = array(V.STRING, [scalar(V.STRING, s) for s in tokens])
    scores = [float(x) for x in rng.standard_normal(6).astype(np.float32)]
    w.add_key_value("x.scores", scores, V.ARRAY, V.FLOAT32)
    expected["x.scores"] = array(V.FLOAT32, [scalar(V.FLOAT32, s) for s in scores])
    ints = [int(x) for x in rng.integers(-1000, 1000, 5)]
    w.add_key_value("x.ints", ints, V.ARRAY, V.INT32)
    expected["x.ints"] = array(V.INT32, [scalar(V.INT32, i) for i in ints])
    nested = [["a", "b"], ["ç"]]
    w.add_key_value("x.nested", nested, V.ARRAY, V.ARRAY)
    expected["x.nested"] = array(V.ARRAY, [array(V.STRING, [scalar(V.STRING, s) for s in row])
                                           for row in nested])

    tensors = {}
    for qt, shape in [(Q.F32, (3, 8)), (Q.F16, (2, 16)), (Q.Q8_0, (2, 64)), (Q.Q4_K, (1, 512)),
                      (Q.Q6_K, (2, 256)), (Q.Q5_0, (4, 32))]:
        name = f"t.{qt.name.lower()}"
        data = rng.standard_normal(shape).astype(np.float32)
        if qt == Q.F32:
            raw = data
        elif qt == Q.F16:
            raw = data.astype(np.float16)
        else:
            block, size = gguf.GGML_QUANT_SIZES[qt]
            raw = rng.integers(0, 256, (shape[0], shape[1] // block * size), dtype=np.uint8)
        w.add_tensor(name, raw, raw_dtype=qt)
        tensors[name] = {"type": qt.name, "dims": [shape[1], shape[0]],
                         "sha256": hashlib.sha256(raw.tobytes()).hexdigest()}
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (outdir / "pywritten.json").write_text(json.dumps({"metadata": expected, "tensors": tensors},
                                                      indent=1, ensure_ascii=False))


def field_json(field):
    main = field.types[0]
    if main != V.ARRAY:
        v = field.contents()
        if main == V.FLOAT32:
            v = float(np.float32(v))
        return scalar(main, v)
    elem = field.types[-1]
    if len(field.types) > 2:
        raise SystemExit(f"{field.name}: gguf-py cannot read nested arrays; leave them out")
    items = field.contents()
    if elem == V.FLOAT32:
        items = [float(np.float32(x)) for x in items]
    return array(elem, [scalar(elem, x) for x in items])


def check(path: Path, expected_path: Path):
    expected = json.loads(expected_path.read_text())
    r = gguf.GGUFReader(str(path))
    got = {f.name: field_json(f) for f in r.fields.values() if not f.name.startswith("GGUF.")}
    problems = []
    for k, v in expected["metadata"].items():
        if got.get(k) != v:
            problems.append(f"key {k}: expected {v}, gguf-py read {got.get(k)}")
    for k in set(got) - set(expected["metadata"]):
        problems.append(f"unexpected key {k}")
    tensors = {t.name: t for t in r.tensors}
    for name, t in expected["tensors"].items():
        rt = tensors.get(name)
        if rt is None:
            problems.append(f"tensor {name} missing")
            continue
        desc = {"type": rt.tensor_type.name, "dims": [int(d) for d in rt.shape],
                "sha256": hashlib.sha256(rt.data.tobytes()).hexdigest()}
        if desc != t:
            problems.append(f"tensor {name}: expected {t}, gguf-py read {desc}")
    if len(tensors) != len(expected["tensors"]):
        problems.append(f"{len(tensors)} tensors, expected {len(expected['tensors'])}")
    if problems:
        raise SystemExit("\n".join(problems))
    print(f"gguf-py agrees: {len(expected['metadata'])} keys, {len(tensors)} tensors")


def digests(model: Path, out: Path):
    r = gguf.GGUFReader(str(model))
    result = {}
    for t in r.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype("<f4", copy=False)
        result[t.name] = {"type": t.tensor_type.name, "elements": int(values.size),
                          "sha256": hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"{len(result)} tensor digests of {model.name} written to {out}")


if __name__ == "__main__":
    match sys.argv[1:]:
        case ["write", outdir]:
            write(Path(outdir))
        case ["check", path, expected]:
            check(Path(path), Path(expected))
        case ["digests", model, out]:
            digests(Path(model), Path(out))
        case _:
            raise SystemExit(__doc__)
