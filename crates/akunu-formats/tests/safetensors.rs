//! safetensors reader tests that need no reference data: files written by the Hugging Face
//! `safetensors` crate and by hand, hostile headers, sharded checkpoints, and a differential check
//! against the Hugging Face reader on randomly corrupted files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use akunu_formats::safetensors::{Checkpoint, Dtype, Error, SafetensorsFile};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// A file image: little-endian header length, header, data.
fn image(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn open_image(bytes: &[u8]) -> Result<SafetensorsFile, Error> {
    let dir = tempfile::tempdir().unwrap();
    SafetensorsFile::open(write(dir.path(), "t.safetensors", bytes))
}

fn hf_dtype(dtype: Dtype) -> safetensors::Dtype {
    use safetensors::Dtype as H;
    match dtype {
        Dtype::Bool => H::BOOL,
        Dtype::U8 => H::U8,
        Dtype::I8 => H::I8,
        Dtype::I16 => H::I16,
        Dtype::U16 => H::U16,
        Dtype::F16 => H::F16,
        Dtype::Bf16 => H::BF16,
        Dtype::I32 => H::I32,
        Dtype::U32 => H::U32,
        Dtype::F32 => H::F32,
        Dtype::F64 => H::F64,
        Dtype::I64 => H::I64,
        Dtype::U64 => H::U64,
        Dtype::F8E4M3 => H::F8_E4M3,
        Dtype::F8E5M2 => H::F8_E5M2,
    }
}

fn random_bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    // Never zero, so that a zero-filled or shifted read cannot match.
    (0..len).map(|_| rng.random_range(1..=255u8)).collect()
}

struct Tensor {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn random_tensors(rng: &mut StdRng, count: usize) -> Vec<Tensor> {
    (0..count)
        .map(|i| {
            let dtype = Dtype::ALL[rng.random_range(0..Dtype::ALL.len())];
            let rank = rng.random_range(0..4);
            let shape: Vec<usize> = (0..rank).map(|_| rng.random_range(1..6)).collect();
            let len = shape.iter().product::<usize>() * dtype.size();
            Tensor {
                name: format!("layer.{i}.weight"),
                dtype,
                shape,
                data: random_bytes(rng, len),
            }
        })
        .collect()
}

/// Serializes with the Hugging Face crate, an independent writer.
fn hf_serialize(tensors: &[Tensor], metadata: Option<HashMap<String, String>>) -> Vec<u8> {
    let views = tensors.iter().map(|t| {
        let view =
            safetensors::tensor::TensorView::new(hf_dtype(t.dtype), t.shape.clone(), &t.data);
        (t.name.clone(), view.unwrap())
    });
    safetensors::serialize(views, metadata).unwrap()
}

#[test]
fn reads_every_dtype_written_by_the_hf_crate() {
    let mut rng = StdRng::seed_from_u64(1);
    let tensors: Vec<Tensor> = Dtype::ALL
        .iter()
        .enumerate()
        .map(|(i, &dtype)| {
            let shape = vec![i % 3 + 1, 7, 2];
            let len = shape.iter().product::<usize>() * dtype.size();
            Tensor {
                name: format!("t.{}", dtype.name()),
                dtype,
                shape,
                data: random_bytes(&mut rng, len),
            }
        })
        .collect();
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    let file = open_image(&hf_serialize(&tensors, Some(metadata))).unwrap();
    assert_eq!(file.len(), Dtype::ALL.len());
    assert_eq!(
        file.metadata().get("format").map(String::as_str),
        Some("pt")
    );
    for t in &tensors {
        let view = file.get(&t.name).unwrap();
        assert_eq!(view.name(), t.name);
        assert_eq!(view.dtype(), t.dtype);
        assert_eq!(view.shape(), t.shape);
        assert_eq!(view.data(), t.data, "{}", t.name);
        assert_eq!(view.numel(), t.shape.iter().product::<usize>());
        assert_eq!(Dtype::from_name(t.dtype.name()), Some(t.dtype));
    }
    assert_eq!(file.data_offset(), 8 + file.header_len());
    assert!(matches!(
        file.get("absent"),
        Err(Error::TensorNotFound { .. })
    ));
}

#[test]
fn converts_floats_to_f32() {
    let mut rng = StdRng::seed_from_u64(2);
    let halves: Vec<f16> = (0..64)
        .map(|_| f16::from_f32(rng.random_range(-9.0..9.0)))
        .collect();
    let brains: Vec<bf16> = (0..64)
        .map(|_| bf16::from_f32(rng.random_range(-9e9..9e9)))
        .collect();
    let singles: Vec<f32> = (0..64).map(|_| rng.random_range(-1e6..1e6)).collect();
    let doubles: Vec<f64> = (0..64).map(|_| rng.random_range(-1e300..1e300)).collect();
    let tensors = [
        (
            Dtype::F16,
            halves
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        ),
        (
            Dtype::Bf16,
            brains.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        (
            Dtype::F32,
            singles.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        (
            Dtype::F64,
            doubles.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
    ]
    .into_iter()
    .map(|(dtype, data)| Tensor {
        name: dtype.name().to_owned(),
        dtype,
        shape: vec![8, 8],
        data,
    })
    .collect::<Vec<_>>();
    let file = open_image(&hf_serialize(&tensors, None)).unwrap();
    let got = |name| file.get(name).unwrap().to_f32_vec().unwrap();
    let want_f16: Vec<f32> = halves.iter().map(|h| h.to_f32()).collect();
    let want_bf16: Vec<f32> = brains.iter().map(|h| h.to_f32()).collect();
    let want_f64: Vec<f32> = doubles.iter().map(|&d| d as f32).collect();
    assert_eq!(got("F16"), want_f16);
    assert_eq!(got("BF16"), want_bf16);
    assert_eq!(got("F32"), singles);
    assert_eq!(got("F64"), want_f64);
}

#[test]
fn converts_fp8_and_small_integers_to_f32() {
    // FP8 bytes with values worked out from the OCP definitions: E4M3 (bias 7, no infinity,
    // S.1111.111 is NaN) and E5M2 (bias 15, IEEE-like).
    let e4m3: [(u8, f32); 8] = [
        (0x38, 1.0),
        (0xB8, -1.0),
        (0x7E, 448.0),
        (0x01, 1.0 / 512.0), // smallest subnormal, 2^-9
        (0x07, 7.0 / 512.0), // largest subnormal
        (0x08, 1.0 / 64.0),  // smallest normal, 2^-6
        (0x4B, 5.5),         // exponent 9 - 7 = 2, mantissa 1.375
        (0xD4, -12.0),       // exponent 10 - 7 = 3, mantissa 1.5
    ];
    let e5m2: [(u8, f32); 6] = [
        (0x3C, 1.0),
        (0x7B, 57344.0),
        (0x7C, f32::INFINITY),
        (0xFC, f32::NEG_INFINITY),
        (0x01, 1.0 / 65536.0), // 2^-16
        (0x42, 3.0),
    ];
    let i16s: [i16; 4] = [-32768, -3, 17, 32767];
    let mut data = Vec::new();
    data.extend(e4m3.iter().map(|p| p.0));
    data.extend(e5m2.iter().map(|p| p.0));
    data.extend(i16s.iter().flat_map(|v| v.to_le_bytes()));
    data.extend([1u8, 0, 1, 0xff]);
    data.extend([0xffu8, 0x80]);
    data.extend([7u8; 4]);
    let header = json!({
        "e4m3": {"dtype": "F8_E4M3", "shape": [8], "data_offsets": [0, 8]},
        "e5m2": {"dtype": "F8_E5M2", "shape": [6], "data_offsets": [8, 14]},
        "i16": {"dtype": "I16", "shape": [4], "data_offsets": [14, 22]},
        "b": {"dtype": "BOOL", "shape": [4], "data_offsets": [22, 26]},
        "i8": {"dtype": "I8", "shape": [2], "data_offsets": [26, 28]},
        "u32": {"dtype": "U32", "shape": [1], "data_offsets": [28, 32]},
    });
    let file = open_image(&image(&header.to_string(), &data)).unwrap();
    let got = |name| file.get(name).unwrap().to_f32_vec().unwrap();
    assert_eq!(got("e4m3"), e4m3.map(|p| p.1));
    assert_eq!(got("e5m2"), e5m2.map(|p| p.1));
    assert_eq!(got("i16"), i16s.map(f32::from));
    assert_eq!(got("b"), [1.0, 0.0, 1.0, 1.0]);
    assert_eq!(got("i8"), [-1.0, -128.0]);
    assert!(akunu_formats::safetensors::f8_e4m3_to_f32(0x7F).is_nan());
    assert!(akunu_formats::safetensors::f8_e5m2_to_f32(0x7D).is_nan());
    let err = file.get("u32").unwrap().to_f32_vec().unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotConvertible {
                dtype: Dtype::U32,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("u32"));
}

#[test]
fn accepts_scalars_empty_tensors_and_no_tensors() {
    let header = json!({
        "__metadata__": {"k": "v"},
        "empty": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]},
        "scalar": {"dtype": "F16", "shape": [], "data_offsets": [0, 2]},
    });
    let file = open_image(&image(&header.to_string(), &[0x00, 0x3C])).unwrap();
    assert_eq!(file.get("scalar").unwrap().to_f32_vec().unwrap(), [1.0]);
    assert_eq!(file.get("empty").unwrap().numel(), 0);
    assert_eq!(file.metadata()["k"], "v");
    let none = open_image(&image("{}", &[])).unwrap();
    assert!(none.is_empty());
}

/// Asserts that `bytes` is rejected with an error matching `check`, naming the file.
fn rejects(bytes: &[u8], check: impl Fn(&Error) -> bool) -> String {
    let err = open_image(bytes).expect_err("accepted a broken file");
    assert!(check(&err), "unexpected error: {err:?}");
    let text = err.to_string();
    assert!(
        text.contains("t.safetensors"),
        "error does not name the file: {text}"
    );
    text
}

#[test]
fn rejects_broken_length_prefix_and_header() {
    rejects(&[], |e| matches!(e, Error::TooSmall { len: 0, .. }));
    rejects(&[1, 0, 0], |e| matches!(e, Error::TooSmall { len: 3, .. }));
    let mut past_end = image("{}", &[]);
    past_end[0] = 3;
    rejects(&past_end, |e| {
        matches!(
            e,
            Error::HeaderPastEnd {
                declared: 3,
                available: 2,
                ..
            }
        )
    });
    let mut huge = image("{}", &[]);
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    rejects(&huge, |e| matches!(e, Error::HeaderTooLarge { .. }));
    let mut over_limit = image("{}", &[]);
    over_limit[..8].copy_from_slice(&100_000_001u64.to_le_bytes());
    rejects(&over_limit, |e| matches!(e, Error::HeaderTooLarge { .. }));
    let mut not_utf8 = image("{\"x\": 1}", &[]);
    not_utf8[10] = 0xC3; // a lone UTF-8 lead byte
    rejects(&not_utf8, |e| matches!(e, Error::HeaderNotUtf8 { .. }));
    for bad in [
        "",
        "[]",
        "{",
        "{\"a\": 1}",
        "{\"a\": {\"dtype\": \"F32\"}}",
        "{}\0",
    ] {
        rejects(&image(bad, &[]), |e| matches!(e, Error::HeaderJson { .. }));
    }
    let text = rejects(&image(r#"{"__metadata__": {"k": 1}}"#, &[]), |e| {
        matches!(e, Error::HeaderJson { .. })
    });
    assert!(text.contains("malformed header"));
    let dup = r#"{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                  "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}"#;
    let text = rejects(&image(dup, &[1, 2]), |e| {
        matches!(e, Error::HeaderJson { .. })
    });
    assert!(text.contains("duplicate key `w`"), "{text}");
}

#[test]
fn rejects_lying_tensor_entries() {
    let one = |dtype: &str, shape: &str, start: u64, end: u64| {
        format!(
            r#"{{"w": {{"dtype": "{dtype}", "shape": {shape}, "data_offsets": [{start}, {end}]}}}}"#
        )
    };
    let data = [9u8; 16];
    let text = rejects(
        &image(&one("F4", "[2]", 0, 1), &data[..1]),
        |e| matches!(e, Error::UnsupportedDtype { dtype, .. } if dtype == "F4"),
    );
    assert!(text.contains("`w`"));
    // F32 needs 4 bytes per element: 4 elements are 16 bytes, not 8.
    rejects(&image(&one("F32", "[4]", 0, 8), &data[..8]), |e| {
        matches!(
            e,
            Error::SizeMismatch {
                expected: 16,
                actual: 8,
                ..
            }
        )
    });
    // Same byte count, wrong dtype size.
    rejects(&image(&one("F16", "[4]", 0, 16), &data), |e| {
        matches!(
            e,
            Error::SizeMismatch {
                expected: 8,
                actual: 16,
                ..
            }
        )
    });
    rejects(&image(&one("U8", "[4]", 8, 4), &data), |e| {
        matches!(
            e,
            Error::ReversedOffsets {
                start: 8,
                end: 4,
                ..
            }
        )
    });
    rejects(&image(&one("U8", "[16]", 1, 17), &data), |e| {
        matches!(e, Error::OffsetsOutOfBounds { data_len: 16, .. })
    });
    let far = one("U8", "[1]", u64::MAX - 1, u64::MAX);
    rejects(&image(&far, &data), |e| {
        matches!(e, Error::OffsetsOutOfBounds { .. })
    });
    // Element count overflows u64, and the byte count of a dtype-sized product overflows.
    let big = format!("[{}, {}]", u64::MAX / 2, 3);
    rejects(&image(&one("U8", &big, 0, 16), &data), |e| {
        matches!(e, Error::ShapeOverflow { .. })
    });
    let big = format!("[{}]", u64::MAX / 4);
    rejects(&image(&one("F64", &big, 0, 16), &data), |e| {
        matches!(e, Error::ShapeOverflow { .. })
    });
    rejects(&image(&one("U8", "[-1]", 0, 16), &data), |e| {
        matches!(e, Error::HeaderJson { .. })
    });
}

#[test]
fn rejects_overlaps_gaps_and_trailing_bytes() {
    let two = |a: [u64; 2], b: [u64; 2]| {
        json!({
            "a": {"dtype": "U8", "shape": [a[1] - a[0]], "data_offsets": a},
            "b": {"dtype": "U8", "shape": [b[1] - b[0]], "data_offsets": b},
        })
        .to_string()
    };
    let data = [5u8; 8];
    let text = rejects(
        &image(&two([0, 6], [4, 8]), &data),
        |e| matches!(e, Error::Overlap { tensor, other, .. } if tensor == "b" && other == "a"),
    );
    assert!(text.contains("`a`") && text.contains("`b`"));
    rejects(&image(&two([0, 8], [0, 8]), &data), |e| {
        matches!(e, Error::Overlap { .. })
    });
    rejects(&image(&two([0, 3], [4, 8]), &data), |e| {
        matches!(
            e,
            Error::Gap {
                start: 3,
                end: 4,
                ..
            }
        )
    });
    rejects(&image(&two([0, 4], [4, 6]), &data), |e| {
        matches!(
            e,
            Error::Gap {
                start: 6,
                end: 8,
                ..
            }
        )
    });
    rejects(&image(&two([1, 4], [4, 8]), &data), |e| {
        matches!(
            e,
            Error::Gap {
                start: 0,
                end: 1,
                ..
            }
        )
    });
    // Offsets given out of order are fine as long as they tile the data.
    let file = open_image(&image(&two([4, 8], [0, 4]), &[1, 2, 3, 4, 5, 6, 7, 8])).unwrap();
    assert_eq!(file.get("a").unwrap().data(), [5, 6, 7, 8]);
    assert_eq!(file.get("b").unwrap().data(), [1, 2, 3, 4]);
}

#[test]
fn every_truncation_is_an_error() {
    let mut rng = StdRng::seed_from_u64(3);
    let tensors = random_tensors(&mut rng, 4);
    let full = hf_serialize(&tensors, None);
    assert!(open_image(&full).is_ok());
    let dir = tempfile::tempdir().unwrap();
    for len in 0..full.len() {
        // A fresh name each time: rewriting a file that was just mapped is slow on some hosts.
        let path = write(dir.path(), &format!("{len}.safetensors"), &full[..len]);
        assert!(
            SafetensorsFile::open(path).is_err(),
            "prefix of {len} bytes accepted"
        );
    }
}

/// Mutations applied to a valid file in the differential test.
fn mutate(rng: &mut StdRng, tensors: &mut [Tensor], offsets: &mut [[i64; 2]], data: &mut Vec<u8>) {
    let pick = rng.random_range(0..tensors.len());
    match rng.random_range(0..8) {
        0 => {}
        1 => offsets[pick][rng.random_range(0..2)] += rng.random_range(-3..=3),
        2 => {
            let other = rng.random_range(0..tensors.len());
            offsets.swap(pick, other);
        }
        3 => {
            if let Some(d) = tensors[pick].shape.first_mut() {
                *d = (*d as i64 + rng.random_range(-1..=1)).max(0) as usize;
            } else {
                tensors[pick].shape.push(rng.random_range(0..3));
            }
        }
        4 => tensors[pick].dtype = Dtype::ALL[rng.random_range(0..Dtype::ALL.len())],
        5 => {
            let n = rng.random_range(1..4);
            if rng.random() {
                data.extend(std::iter::repeat_n(7u8, n));
            } else {
                data.truncate(data.len().saturating_sub(n));
            }
        }
        6 => offsets[pick] = [offsets[pick][0] - 1, offsets[pick][1] + 1],
        _ => {
            // Move the last tensor up and extend the data to match: a gap and nothing else.
            let n = rng.random_range(1..4);
            let last = (0..offsets.len())
                .max_by_key(|&i| offsets[i][1])
                .unwrap_or(pick);
            offsets[last] = offsets[last].map(|o| o + n as i64);
            data.extend(std::iter::repeat_n(7u8, n));
        }
    }
}

/// Our reader must accept exactly the files the Hugging Face reader accepts, and see the same
/// tensors in them. Files are built from random tensors laid out in random order, then given one
/// random corruption: shifted or swapped offsets, a changed dimension or dtype, extra or missing
/// data bytes, a widened tensor, a tensor moved to leave a gap.
#[test]
fn agrees_with_the_hf_reader_on_corrupted_files() {
    let mut rng = StdRng::seed_from_u64(4);
    let dir = tempfile::tempdir().unwrap();
    let (mut accepted, mut rejected) = (0, 0);
    for round in 0..1500 {
        let count = rng.random_range(1..5);
        let mut tensors = random_tensors(&mut rng, count);
        let mut order: Vec<usize> = (0..count).collect();
        for i in (1..count).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let mut offsets = vec![[0i64; 2]; count];
        let mut data = Vec::new();
        for &i in &order {
            let start = data.len() as i64;
            data.extend_from_slice(&tensors[i].data);
            offsets[i] = [start, data.len() as i64];
        }
        mutate(&mut rng, &mut tensors, &mut offsets, &mut data);
        let mut header = serde_json::Map::new();
        for (t, o) in tensors.iter().zip(&offsets) {
            header.insert(
                t.name.clone(),
                json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": o}),
            );
        }
        if rng.random() {
            header.insert("__metadata__".into(), json!({"round": round.to_string()}));
        }
        let mut text = serde_json::Value::Object(header).to_string();
        // Pad like the Python writer does, so data starts 8-byte aligned.
        while !text.len().is_multiple_of(8) {
            text.push(' ');
        }
        let bytes = image(&text, &data);
        // A fresh name each round: rewriting a file that was just mapped is slow on some hosts.
        let path = write(dir.path(), &format!("{round}.safetensors"), &bytes);
        let ours = SafetensorsFile::open(path);
        let theirs = safetensors::SafeTensors::deserialize(&bytes);
        match (&ours, &theirs) {
            (Ok(ours), Ok(theirs)) => {
                accepted += 1;
                assert_eq!(ours.len(), theirs.len());
                for (name, view) in theirs.tensors() {
                    let mine = ours.get(&name).unwrap();
                    assert_eq!(hf_dtype(mine.dtype()), view.dtype());
                    assert_eq!(mine.shape(), view.shape());
                    assert_eq!(mine.data(), view.data());
                }
            }
            (Err(_), Err(_)) => rejected += 1,
            _ => panic!(
                "round {round}: readers disagree: ours {:?}, theirs {:?}",
                ours.as_ref().err(),
                theirs.as_ref().err()
            ),
        }
    }
    assert!(
        accepted > 200 && rejected > 200,
        "accepted {accepted}, rejected {rejected}"
    );
}

/// Writes a shard with the given tensors, each `[2, 2]` U8 with bytes derived from its name.
fn shard(dir: &Path, file: &str, names: &[&str]) -> PathBuf {
    let tensors: Vec<Tensor> = names
        .iter()
        .map(|n| Tensor {
            name: (*n).to_owned(),
            dtype: Dtype::U8,
            shape: vec![2, 2],
            data: name_bytes(n),
        })
        .collect();
    write(dir, file, &hf_serialize(&tensors, None))
}

fn name_bytes(name: &str) -> Vec<u8> {
    let h = name
        .bytes()
        .fold(17u8, |a, b| a.wrapping_mul(31).wrapping_add(b))
        | 1;
    vec![h, h ^ 0x20, h ^ 0x40, h ^ 0x80]
}

fn index(dir: &Path, map: &[(&str, &str)]) -> PathBuf {
    let weight_map: serde_json::Map<_, _> = map
        .iter()
        .map(|(t, f)| ((*t).to_owned(), json!(f)))
        .collect();
    let body = json!({"metadata": {"total_size": 4 * map.len()}, "weight_map": weight_map});
    write(
        dir,
        "model.safetensors.index.json",
        body.to_string().as_bytes(),
    )
}

#[test]
fn opens_sharded_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    shard(d, "model-00001-of-00002.safetensors", &["a", "b"]);
    shard(d, "model-00002-of-00002.safetensors", &["c", "extra"]);
    let idx = index(
        d,
        &[
            ("a", "model-00001-of-00002.safetensors"),
            ("b", "model-00001-of-00002.safetensors"),
            ("c", "model-00002-of-00002.safetensors"),
        ],
    );
    for path in [d.to_path_buf(), idx.clone()] {
        let ckpt = Checkpoint::open(&path).unwrap();
        assert_eq!(ckpt.names().collect::<Vec<_>>(), ["a", "b", "c", "extra"]);
        assert_eq!(ckpt.files().len(), 2);
        for name in ["a", "b", "c", "extra"] {
            assert_eq!(ckpt.get(name).unwrap().data(), name_bytes(name));
        }
        let file = ckpt.file_of("c").unwrap().path().file_name().unwrap();
        assert_eq!(file, "model-00002-of-00002.safetensors");
        assert_eq!(ckpt.index_metadata().unwrap()["total_size"], 12);
        let err = ckpt.get("zzz").unwrap_err();
        assert!(matches!(err, Error::TensorNotFound { .. }), "{err}");
    }
    // Without an index, a directory's model*.safetensors files are read, as mlx-lm does.
    std::fs::remove_file(&idx).unwrap();
    write(d, "other.safetensors", b"not even a safetensors file");
    let ckpt = Checkpoint::open(d).unwrap();
    assert_eq!(ckpt.len(), 4);
    assert!(ckpt.index_metadata().is_none());
    let single = Checkpoint::open(d.join("model-00001-of-00002.safetensors")).unwrap();
    assert_eq!(single.names().collect::<Vec<_>>(), ["a", "b"]);
}

#[test]
fn rejects_inconsistent_shards() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (one, two) = (
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    );
    shard(d, one, &["a", "b"]);
    shard(d, two, &["c"]);

    let idx = index(d, &[("a", one), ("b", two), ("c", two)]);
    let err = Checkpoint::open(&idx).unwrap_err();
    assert!(
        matches!(&err, Error::MissingFromShard { tensor, .. } if tensor == "b"),
        "{err}"
    );
    assert!(err.to_string().contains(two), "{err}");

    index(d, &[("a", one), ("q", "model-00003-of-00003.safetensors")]);
    let err = Checkpoint::open(d).unwrap_err();
    assert!(matches!(err, Error::MissingShard { .. }), "{err}");
    assert!(err.to_string().contains("model-00003-of-00003"), "{err}");

    for bad in [
        "../model.safetensors",
        "/etc/passwd",
        "sub/x.safetensors",
        "",
        ".",
    ] {
        index(d, &[("a", bad)]);
        let err = Checkpoint::open(d).unwrap_err();
        assert!(matches!(err, Error::BadShardName { .. }), "{bad}: {err}");
    }

    shard(d, two, &["c", "a"]);
    index(d, &[("a", one), ("b", one), ("c", two)]);
    let err = Checkpoint::open(d).unwrap_err();
    assert!(
        matches!(&err, Error::DuplicateTensor { tensor, .. } if tensor == "a"),
        "{err}"
    );
    assert!(
        err.to_string().contains(one) && err.to_string().contains(two),
        "{err}"
    );

    for body in [
        "{",
        "{\"metadata\": {}}",
        "{\"weight_map\": {\"a\": 3}}",
        "[]",
    ] {
        write(d, "model.safetensors.index.json", body.as_bytes());
        let err = Checkpoint::open(d).unwrap_err();
        assert!(matches!(err, Error::IndexJson { .. }), "{body}: {err}");
    }
    let dup = format!(r#"{{"weight_map": {{"a": "{one}", "a": "{two}"}}}}"#);
    write(d, "model.safetensors.index.json", dup.as_bytes());
    let err = Checkpoint::open(d).unwrap_err();
    assert!(err.to_string().contains("duplicate key `a`"), "{err}");

    // A broken shard is reported with its own path.
    shard(d, two, &["c"]);
    write(d, one, &image("{}", &[1]));
    index(d, &[("a", one), ("c", two)]);
    let err = Checkpoint::open(d).unwrap_err();
    assert!(
        matches!(err, Error::Gap { .. }) && err.to_string().contains(one),
        "{err}"
    );

    let empty = tempfile::tempdir().unwrap();
    let err = Checkpoint::open(empty.path()).unwrap_err();
    assert!(matches!(err, Error::NoWeights { .. }), "{err}");
    let err = Checkpoint::open(d.join("absent.safetensors")).unwrap_err();
    assert!(
        matches!(err, Error::Io { .. }) && err.to_string().contains("absent"),
        "{err}"
    );
}
