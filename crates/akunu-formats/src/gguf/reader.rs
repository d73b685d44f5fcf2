use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::Path;

use akunu_quant::GgmlType;
use memmap2::Mmap;

use super::cursor::Cursor;
use super::value::{Value, ValueType};
use super::{tensor_extent, GgufError, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};

/// One tensor of the index. `dims[0]` is the contiguous (innermost) dimension, as in ggml: for a
/// linear layer's weight that is the input width, and `dims[1]` the number of outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of rows (the product of every dimension but the first).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}

enum Backing {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

struct KvEntry {
    key: String,
    ty: ValueType,
    span: Range<usize>,
}

/// An open GGUF file: the metadata and tensor index, validated, over the file's bytes.
pub struct GgufFile {
    backing: Backing,
    version: u32,
    alignment: u64,
    data_offset: u64,
    kvs: Vec<KvEntry>,
    kv_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Maps and validates a file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Model files are not expected
        // to change while open; if another process truncates one anyway, reads may fault, which
        // is the documented hazard of every memory-mapped model loader.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(Backing::Map(map))
    }

    /// Validates a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::parse(Backing::Owned(bytes))
    }

    fn parse(backing: Backing) -> Result<Self, GgufError> {
        let bytes = backing.bytes();
        let mut cur = Cursor::new(bytes, 0);
        let magic = cur.u32(|| "magic".into())?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = cur.u32(|| "version".into())?;
        match version {
            2 | 3 => {}
            // A big-endian writer stores the version's bytes reversed.
            v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => return Err(GgufError::BigEndian),
            v => return Err(GgufError::UnsupportedVersion(v)),
        }
        let n_tensors = cur.u64(|| "tensor count".into())?;
        let n_kvs = cur.u64(|| "metadata count".into())?;

        // Each KV takes at least 8 (key length) + 4 (type) + 1 bytes.
        check_count(&cur, n_kvs, 13, "metadata entries")?;
        let mut kvs = Vec::with_capacity(initial_capacity(n_kvs));
        let mut kv_index = HashMap::with_capacity(initial_capacity(n_kvs));
        for i in 0..n_kvs {
            let key = cur.string(|| format!("key of metadata entry {i}"))?;
            let code = cur.u32(|| format!("value type of {key:?}"))?;
            let ty = ValueType::from_code(code).ok_or_else(|| GgufError::BadValueType {
                key: key.to_owned(),
                code,
            })?;
            let start = cur.pos();
            Value::read(&mut cur, ty, key, 0)?;
            if kv_index.insert(key.to_owned(), kvs.len()).is_some() {
                return Err(GgufError::DuplicateKey {
                    key: key.to_owned(),
                });
            }
            kvs.push(KvEntry {
                key: key.to_owned(),
                ty,
                span: start..cur.pos(),
            });
        }

        let alignment = match kv_index.get("general.alignment").map(|&i| &kvs[i]) {
            None => DEFAULT_ALIGNMENT,
            Some(kv) => {
                let value = decode(bytes, kv);
                match value {
                    Some(Value::U32(a)) if a.is_power_of_two() => a.into(),
                    other => {
                        return Err(GgufError::BadAlignment {
                            found: other.map_or_else(|| "?".into(), |v| format!("{v:?}")),
                        })
                    }
                }
            }
        };

        // Each tensor info takes at least 8 (name length) + 4 + 4 + 8 bytes.
        check_count(&cur, n_tensors, 24, "tensor infos")?;
        let mut tensors = Vec::with_capacity(initial_capacity(n_tensors));
        let mut tensor_index = HashMap::with_capacity(initial_capacity(n_tensors));
        for i in 0..n_tensors {
            let info = read_tensor_info(&mut cur, i, alignment)?;
            if tensor_index
                .insert(info.name.clone(), tensors.len())
                .is_some()
            {
                return Err(GgufError::DuplicateTensor { name: info.name });
            }
            tensors.push(info);
        }

        let data_offset = align_up(cur.pos() as u64, alignment);
        check_tensor_extents(&tensors, bytes.len() as u64, data_offset)?;

        Ok(GgufFile {
            backing,
            version,
            alignment,
            data_offset,
            kvs,
            kv_index,
            tensors,
            tensor_index,
        })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Where the data section starts in the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Number of metadata entries.
    pub fn metadata_len(&self) -> usize {
        self.kvs.len()
    }

    /// The metadata in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, Value<'_>)> {
        let bytes = self.bytes();
        self.kvs
            .iter()
            .filter_map(move |kv| Some((kv.key.as_str(), decode(bytes, kv)?)))
    }

    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<Value<'_>> {
        let kv = &self.kvs[*self.kv_index.get(key)?];
        decode(self.bytes(), kv)
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// An integer value of any width that fits in u64.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_int()?.try_into().ok()
    }

    /// A numeric value of any type, as f64.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// A key of the model's architecture: `arch_key("block_count")` reads `gemma3.block_count`.
    pub fn arch_key(&self, suffix: &str) -> Option<Value<'_>> {
        self.get(&format!("{}.{suffix}", self.architecture()?))
    }

    /// The tensor index in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(*self.tensor_index.get(name)?)
    }

    /// The bytes of a tensor. Every tensor of this file's index has them (bounds were checked at
    /// open); `None` only for a `TensorInfo` that describes bytes this file does not have.
    pub fn tensor_data(&self, info: &TensorInfo) -> Option<&[u8]> {
        let start = usize::try_from(self.data_offset.checked_add(info.offset)?).ok()?;
        let end = start.checked_add(usize::try_from(info.n_bytes).ok()?)?;
        self.bytes().get(start..end)
    }
}

fn decode<'a>(bytes: &'a [u8], kv: &KvEntry) -> Option<Value<'a>> {
    let mut cur = Cursor::new(&bytes[..kv.span.end], kv.span.start);
    Value::read(&mut cur, kv.ty, &kv.key, 0).ok()
}

fn check_count(cur: &Cursor, count: u64, min_size: u64, what: &str) -> Result<(), GgufError> {
    let available = cur.remaining() as u64;
    match count.checked_mul(min_size) {
        Some(needed) if needed <= available => Ok(()),
        needed => Err(GgufError::Truncated {
            what: format!("{count} {what}"),
            offset: cur.pos() as u64,
            needed: needed.unwrap_or(u64::MAX),
            available,
        }),
    }
}

/// Room reserved before parsing `count` entries. A count is only known to fit the file's bytes,
/// and each entry takes far more memory than its smallest encoding, so a hostile count could
/// still ask for many times the file's size: reserve a little and let the collections grow with
/// what actually parses.
fn initial_capacity(count: u64) -> usize {
    count.min(4096) as usize
}

fn align_up(x: u64, alignment: u64) -> u64 {
    x.div_ceil(alignment).saturating_mul(alignment)
}

fn read_tensor_info(cur: &mut Cursor, i: u64, alignment: u64) -> Result<TensorInfo, GgufError> {
    let name = cur.string(|| format!("name of tensor {i}"))?.to_owned();
    let bad = |reason: String| GgufError::BadTensor {
        name: name.clone(),
        reason,
    };
    let n_dims = cur.u32(|| format!("dimension count of tensor {name:?}"))?;
    if n_dims as usize > MAX_DIMS {
        return Err(bad(format!(
            "{n_dims} dimensions, at most {MAX_DIMS} allowed"
        )));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(cur.u64(|| format!("dimension {d} of tensor {name:?}"))?);
    }
    let code = cur.u32(|| format!("type of tensor {name:?}"))?;
    let offset = cur.u64(|| format!("offset of tensor {name:?}"))?;

    let ty = GgmlType::from_code(code).ok_or_else(|| GgufError::UnknownTensorType {
        name: name.clone(),
        code,
    })?;
    let (n_elements, n_bytes) = tensor_extent(ty, &dims).map_err(bad)?;
    if offset % alignment != 0 {
        return Err(bad(format!(
            "offset {offset} is not a multiple of the alignment {alignment}"
        )));
    }
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        n_elements,
        n_bytes,
    })
}

/// Every tensor must lie inside the data section, and no two may share bytes.
fn check_tensor_extents(
    tensors: &[TensorInfo],
    file_len: u64,
    data_offset: u64,
) -> Result<(), GgufError> {
    if !tensors.is_empty() && data_offset > file_len {
        return Err(GgufError::Truncated {
            what: "padding before the data section".into(),
            offset: file_len,
            needed: data_offset - file_len,
            available: 0,
        });
    }
    let data_len = file_len - data_offset.min(file_len);
    for t in tensors {
        let end = t.offset.checked_add(t.n_bytes);
        if end.is_none_or(|end| end > data_len) {
            return Err(GgufError::BadTensor {
                name: t.name.clone(),
                reason: format!(
                    "data [{}, +{}) lies outside the {data_len}-byte data section \
                     (file truncated?)",
                    t.offset, t.n_bytes
                ),
            });
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        if pair[0].offset + pair[0].n_bytes > pair[1].offset {
            return Err(GgufError::OverlappingTensors {
                first: pair[0].name.clone(),
                second: pair[1].name.clone(),
            });
        }
    }
    Ok(())
}
