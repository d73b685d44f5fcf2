//! Malformed, truncated and hostile GGUF files are refused with an error that names the fault,
//! never a panic, an out-of-bounds read or an allocation sized by a lying count.

use akunu_formats::gguf::{GgufError, GgufFile, GgufWriter, MetaValue};
use akunu_formats::GgmlType;
use rand::{Rng, SeedableRng};

/// Hand-assembled GGUF bytes, so tests can write what no writer would.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kvs: u64) -> Self {
        let mut r = Raw::default();
        r.bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kvs);
        r
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A tensor info: name, dims, type code, offset.
    fn tensor(&mut self, name: &str, dims: &[u64], code: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(code).u64(offset)
    }
    fn pad_to(&mut self, alignment: usize) -> &mut Self {
        while !self.0.len().is_multiple_of(alignment) {
            self.0.push(0);
        }
        self
    }
    fn parse(&self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.0.clone())
    }
}

fn err(r: &Raw) -> String {
    match r.parse() {
        Ok(_) => panic!("a malformed file was accepted"),
        Err(e) => e.to_string(),
    }
}

fn valid_file() -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").unwrap();
    w.add("llama.block_count", 2u32).unwrap();
    w.add(
        "tokenizer.ggml.tokens",
        MetaValue::strings(["a", "bc", "<0x0A>"]),
    )
    .unwrap();
    w.add("tokenizer.ggml.scores", MetaValue::f32s([0.5, -1.0, 2.0]))
        .unwrap();
    let q: Vec<u8> = (0..2 * 18).map(|_| rng.random()).collect();
    let f: Vec<u8> = (0..3 * 4).map(|_| rng.random()).collect();
    w.add_tensor("blk.0.w", GgmlType::Q4_0, &[32, 2], q)
        .unwrap();
    w.add_tensor("blk.0.norm", GgmlType::F32, &[3], f).unwrap();
    w.to_bytes().unwrap()
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = valid_file();
    let full = GgufFile::from_bytes(bytes.clone()).unwrap();
    // Bytes after the last tensor's data are only padding.
    let needed = full
        .tensors()
        .iter()
        .map(|t| full.data_offset() + t.offset + t.n_bytes)
        .max()
        .unwrap() as usize;
    for len in 0..bytes.len() {
        let result = GgufFile::from_bytes(bytes[..len].to_vec());
        assert_eq!(result.is_ok(), len >= needed, "truncated to {len} bytes");
    }
}

#[test]
fn random_corruption_never_panics() {
    let bytes = valid_file();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut accepted = 0;
    for _ in 0..20_000 {
        let mut b = bytes.clone();
        for _ in 0..rng.random_range(1..4) {
            let i = rng.random_range(0..b.len());
            b[i] = match rng.random_range(0..3) {
                0 => rng.random(),
                1 => 0xFF,
                _ => b[i] ^ (1 << rng.random_range(0..8)),
            };
        }
        if let Ok(file) = GgufFile::from_bytes(b) {
            // Whatever was accepted must be fully readable.
            accepted += 1;
            for (_, v) in file.metadata() {
                let _ = v.to_owned_value();
            }
            for t in file.tensors() {
                assert_eq!(file.tensor_data(t).map(|d| d.len() as u64), Some(t.n_bytes));
            }
        }
    }
    // Flips in tensor data and string contents are harmless, so some files must survive.
    assert!(accepted > 0);
}

#[test]
fn header_faults() {
    assert!(err(&Raw(b"GGU".to_vec())).contains("magic"));
    assert!(err(&Raw::header(3, 0, 0).bytes(b"").clone_with_magic(b"GGML")).contains("not a GGUF"));
    assert!(err(&Raw::header(1, 0, 0)).contains("version 1"));
    assert!(err(&Raw::header(4, 0, 0)).contains("version 4"));
    assert!(err(&Raw::header(3u32.swap_bytes(), 0, 0)).contains("big-endian"));
    assert!(Raw::header(2, 0, 0).parse().is_ok());
    assert!(Raw::header(3, 0, 0).parse().is_ok());
}

trait WithMagic {
    fn clone_with_magic(&self, magic: &[u8; 4]) -> Raw;
}

impl WithMagic for Raw {
    fn clone_with_magic(&self, magic: &[u8; 4]) -> Raw {
        let mut b = self.0.clone();
        b[..4].copy_from_slice(magic);
        Raw(b)
    }
}

#[test]
fn lying_counts_and_lengths() {
    // Counts far beyond what the file could hold are refused before anything is allocated.
    for n in [u64::MAX, 1 << 40, 1000] {
        assert!(
            err(&Raw::header(3, 0, n)).contains("metadata entries"),
            "kv count {n}"
        );
        assert!(
            err(&Raw::header(3, n, 0)).contains("tensor infos"),
            "tensor count {n}"
        );
    }
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX).bytes(b"key and then some");
    assert!(err(&r).contains("key of metadata entry 0"));

    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).u64(1 << 50).bytes(b"short");
    assert!(err(&r).contains("value of \"k\""));

    for count in [u64::MAX, u64::MAX / 4 + 1, 1 << 33] {
        let mut r = Raw::header(3, 0, 1);
        r.str("k").u32(9).u32(8).u64(count).str("x");
        assert!(err(&r).contains("array \"k\""), "array count {count}");
    }
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(4).u64(3).u32(1).u32(2);
    assert!(err(&r).contains("array \"k\""));
}

#[test]
fn bad_types_utf8_and_nesting() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(13).u32(0);
    assert!(err(&r).contains("unknown value type 13"));

    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(99).u64(0);
    assert!(err(&r).contains("unknown value type 99"));

    let mut r = Raw::header(3, 0, 1);
    r.u64(2).bytes(&[0xC3, 0x28]).u32(4).u32(1);
    assert!(err(&r).contains("UTF-8"));

    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).u64(1).bytes(&[0xFF]);
    assert!(err(&r).contains("UTF-8"));

    let mut r = Raw::header(3, 0, 1);
    r.str("k");
    r.u32(9);
    for _ in 0..1000 {
        r.u32(9).u64(1);
    }
    r.u32(4).u64(0);
    assert!(err(&r).contains("deeper"));

    let mut r = Raw::header(3, 0, 2);
    r.str("k").u32(4).u32(1).str("k").u32(4).u32(2);
    assert!(err(&r).contains("twice"));
}

#[test]
fn bad_alignment() {
    for (ty, value) in [(4u32, 0u32), (4, 3), (4, 48)] {
        let mut r = Raw::header(3, 0, 1);
        r.str("general.alignment").u32(ty).u32(value);
        assert!(err(&r).contains("alignment"), "{value}");
    }
    let mut r = Raw::header(3, 0, 1);
    r.str("general.alignment").u32(10).u64(32);
    assert!(err(&r).contains("alignment"), "u64 alignment");
}

/// A file with one tensor info and `data_len` bytes of data.
fn one_tensor(dims: &[u64], code: u32, offset: u64, data_len: usize) -> Raw {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("w", dims, code, offset).pad_to(32);
    r.bytes(&vec![0x5A; data_len]);
    r
}

#[test]
fn tensor_faults() {
    assert!(one_tensor(&[32, 2], 2, 0, 36).parse().is_ok());
    assert!(err(&one_tensor(&[32, 2], 2, 0, 35)).contains("outside"));
    assert!(err(&one_tensor(&[32, 2], 2, 32, 36)).contains("outside"));
    assert!(err(&one_tensor(&[32, 2], 2, 1, 64)).contains("alignment"));
    assert!(err(&one_tensor(&[32, 2], 2, u64::MAX - 31, 64)).contains("outside"));
    assert!(err(&one_tensor(&[16, 2], 2, 0, 64)).contains("block size"));
    assert!(err(&one_tensor(&[1, 1, 1, 1, 1], 0, 0, 4)).contains("dimensions"));
    assert!(err(&one_tensor(&[u64::MAX, 2], 0, 0, 4)).contains("overflow"));
    assert!(err(&one_tensor(&[1 << 32, 1 << 32], 0, 0, 4)).contains("overflow"));
    // A zero dimension must not hide a product of the others that overflows.
    assert!(err(&one_tensor(&[0, 1 << 32, 1 << 32], 0, 0, 4)).contains("overflow"));
    assert!(err(&one_tensor(&[0, u64::MAX], 0, 0, 4)).contains("overflow"));
    let empty = one_tensor(&[0, 3, 5], 0, 0, 0).parse().unwrap();
    assert_eq!(
        (empty.tensors()[0].n_elements, empty.tensors()[0].n_rows()),
        (0, 15)
    );
    assert!(err(&one_tensor(&[], 2, 0, 64)).contains("not a multiple of the Q4_0 block size"));
    for code in [4, 5, 31, 36, 1000] {
        assert!(
            err(&one_tensor(&[32], code, 0, 64)).contains("unknown ggml type"),
            "{code}"
        );
    }
    // A recognised type without a dequantizer is still readable: inspect must list it.
    let file = one_tensor(&[256], 16, 0, 66).parse().unwrap();
    assert_eq!(file.tensors()[0].ty, GgmlType::IQ2_XXS);

    // An empty tensor still needs the data section to start inside the file.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("empty", &[0, 4], 0, 0);
    assert!(err(&r).contains("padding before the data section"));
    assert!(r.pad_to(32).parse().is_ok());

    let mut r = Raw::header(3, 1, 0);
    r.tensor("w", &[u64::MAX], 0, 0).pad_to(32).bytes(&[0; 64]);
    assert!(err(&r).contains("overflow"));

    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[8], 0, 0)
        .tensor("b", &[8], 0, 0)
        .pad_to(32)
        .bytes(&[0; 64]);
    assert!(err(&r).contains("overlap"));

    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[8], 0, 0)
        .tensor("a", &[8], 0, 32)
        .pad_to(32)
        .bytes(&[0; 64]);
    assert!(err(&r).contains("twice"));

    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[8], 0, 0)
        .tensor("b", &[8], 0, 32)
        .pad_to(32)
        .bytes(&[0; 64]);
    let file = r.parse().unwrap();
    assert_eq!(file.tensor("b").unwrap().offset, 32);
}

#[test]
fn tensor_data_refuses_foreign_infos() {
    let file = GgufFile::from_bytes(valid_file()).unwrap();
    let mut info = file.tensors()[0].clone();
    info.offset = u64::MAX - 4;
    assert_eq!(file.tensor_data(&info), None);
    info.offset = 0;
    info.n_bytes = 1 << 40;
    assert_eq!(file.tensor_data(&info), None);
}

#[test]
fn missing_file_is_an_io_error_naming_the_path() {
    let e = GgufFile::open("/nonexistent/model.gguf").err().unwrap();
    assert!(e.to_string().contains("/nonexistent/model.gguf"));
}
