use std::borrow::Cow;
use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use akunu_quant::GgmlType;

use super::value::MetaValue;
use super::{tensor_extent, GgufError, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH};

struct PendingTensor<'a> {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Cow<'a, [u8]>,
}

/// Builds a GGUF file: metadata and tensors are checked as they are added, so a written file
/// always reads back. Tensor data may be borrowed (from another file's map, say) to avoid copies.
pub struct GgufWriter<'a> {
    version: u32,
    alignment: u64,
    kvs: Vec<(String, MetaValue)>,
    keys: HashSet<String>,
    tensors: Vec<PendingTensor<'a>>,
    names: HashSet<String>,
}

impl Default for GgufWriter<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> GgufWriter<'a> {
    /// A writer for version 3.
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            kvs: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// Writes version 2 instead of 3 (the two share one little-endian layout).
    pub fn with_version(mut self, version: u32) -> Result<Self, GgufError> {
        if !matches!(version, 2 | 3) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        self.version = version;
        Ok(self)
    }

    /// Adds a metadata entry. `general.alignment` also sets the alignment used for tensor data.
    pub fn add(&mut self, key: &str, value: impl Into<MetaValue>) -> Result<(), GgufError> {
        let value = value.into();
        check_value(key, &value, 0)?;
        if self.keys.contains(key) {
            return Err(GgufError::DuplicateKey {
                key: key.to_owned(),
            });
        }
        if key == "general.alignment" {
            match value {
                MetaValue::U32(a) if a.is_power_of_two() => self.alignment = a.into(),
                ref other => {
                    return Err(GgufError::BadAlignment {
                        found: format!("{other:?}"),
                    })
                }
            }
        }
        self.keys.insert(key.to_owned());
        self.kvs.push((key.to_owned(), value));
        Ok(())
    }

    /// Adds a tensor; `dims[0]` is the innermost dimension and `data` must be exactly its bytes.
    pub fn add_tensor(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[u64],
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<(), GgufError> {
        let data = data.into();
        let bad = |reason: String| GgufError::BadTensor {
            name: name.to_owned(),
            reason,
        };
        let (n_elements, expected) = tensor_extent(ty, dims).map_err(bad)?;
        if data.len() as u64 != expected {
            return Err(bad(format!(
                "{} bytes of data given, {n_elements} {ty} elements take {expected}",
                data.len()
            )));
        }
        if !self.names.insert(name.to_owned()) {
            return Err(GgufError::DuplicateTensor {
                name: name.to_owned(),
            });
        }
        self.tensors.push(PendingTensor {
            name: name.to_owned(),
            dims: dims.to_vec(),
            ty,
            data,
        });
        Ok(())
    }

    /// Writes the whole file.
    pub fn write_to(&self, out: impl Write) -> Result<(), GgufError> {
        let mut w = CountingWriter {
            inner: out,
            written: 0,
        };
        w.put(&GGUF_MAGIC.to_le_bytes())?;
        w.put(&self.version.to_le_bytes())?;
        w.put(&(self.tensors.len() as u64).to_le_bytes())?;
        w.put(&(self.kvs.len() as u64).to_le_bytes())?;
        for (key, value) in &self.kvs {
            write_string(&mut w, key)?;
            w.put(&(value.value_type() as u32).to_le_bytes())?;
            write_value(&mut w, value)?;
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            write_string(&mut w, &t.name)?;
            w.put(&(t.dims.len() as u32).to_le_bytes())?;
            for d in &t.dims {
                w.put(&d.to_le_bytes())?;
            }
            w.put(&(t.ty as u32).to_le_bytes())?;
            w.put(&offset.to_le_bytes())?;
            offset = (offset + t.data.len() as u64).next_multiple_of(self.alignment);
        }
        if !self.tensors.is_empty() {
            w.pad(self.alignment)?;
        }
        for t in &self.tensors {
            w.put(&t.data)?;
            w.pad(self.alignment)?;
        }
        w.inner.flush()?;
        Ok(())
    }

    /// Writes the file to `path`.
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<(), GgufError> {
        let path = path.as_ref();
        let file = File::create(path).map_err(|source| GgufError::Io {
            path: path.to_owned(),
            source,
        })?;
        self.write_to(BufWriter::new(file))
    }

    /// The file as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }
}

fn check_value(key: &str, value: &MetaValue, depth: usize) -> Result<(), GgufError> {
    let MetaValue::Array(array) = value else {
        return Ok(());
    };
    if depth >= MAX_ARRAY_DEPTH {
        return Err(GgufError::ArrayTooDeep {
            key: key.to_owned(),
            max: MAX_ARRAY_DEPTH,
        });
    }
    for item in &array.items {
        if item.value_type() != array.elem {
            return Err(GgufError::Invalid(format!(
                "metadata key {key:?}: {} item in an array of {}",
                item.value_type(),
                array.elem
            )));
        }
        check_value(key, item, depth + 1)?;
    }
    Ok(())
}

struct CountingWriter<W> {
    inner: W,
    written: u64,
}

impl<W: Write> CountingWriter<W> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        self.inner.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self, alignment: u64) -> Result<(), GgufError> {
        const ZEROS: [u8; 64] = [0; 64];
        let mut n = self.written.next_multiple_of(alignment) - self.written;
        while n > 0 {
            let chunk = n.min(ZEROS.len() as u64);
            self.put(&ZEROS[..chunk as usize])?;
            n -= chunk;
        }
        Ok(())
    }
}

fn write_string<W: Write>(w: &mut CountingWriter<W>, s: &str) -> Result<(), GgufError> {
    w.put(&(s.len() as u64).to_le_bytes())?;
    w.put(s.as_bytes())
}

fn write_value<W: Write>(w: &mut CountingWriter<W>, value: &MetaValue) -> Result<(), GgufError> {
    match value {
        MetaValue::U8(v) => w.put(&v.to_le_bytes()),
        MetaValue::I8(v) => w.put(&v.to_le_bytes()),
        MetaValue::U16(v) => w.put(&v.to_le_bytes()),
        MetaValue::I16(v) => w.put(&v.to_le_bytes()),
        MetaValue::U32(v) => w.put(&v.to_le_bytes()),
        MetaValue::I32(v) => w.put(&v.to_le_bytes()),
        MetaValue::F32(v) => w.put(&v.to_le_bytes()),
        MetaValue::Bool(v) => w.put(&[u8::from(*v)]),
        MetaValue::String(s) => write_string(w, s),
        MetaValue::U64(v) => w.put(&v.to_le_bytes()),
        MetaValue::I64(v) => w.put(&v.to_le_bytes()),
        MetaValue::F64(v) => w.put(&v.to_le_bytes()),
        MetaValue::Array(a) => {
            w.put(&(a.elem as u32).to_le_bytes())?;
            w.put(&(a.items.len() as u64).to_le_bytes())?;
            a.items.iter().try_for_each(|item| write_value(w, item))
        }
    }
}
