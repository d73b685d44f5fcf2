//! One memory-mapped `.safetensors` file: header parsing and layout validation.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::fs::File;
use std::marker::PhantomData;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::dtype::f32_decoder;
use super::{Dtype, Error};

/// Largest header accepted, the same bound as the Hugging Face reader: it caps the memory spent
/// parsing a hostile header while leaving room for checkpoints with many thousands of tensors.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Bytes of the little-endian u64 header length that opens every file.
const LEN_PREFIX: usize = 8;

/// A validated, memory-mapped safetensors file.
pub struct SafetensorsFile {
    path: PathBuf,
    mmap: Mmap,
    header_len: usize,
    metadata: BTreeMap<String, String>,
    tensors: BTreeMap<String, TensorInfo>,
}

struct TensorInfo {
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    bytes: Range<usize>,
}

/// A zero-copy view of one tensor's bytes inside a mapped file.
#[derive(Clone, Copy)]
pub struct TensorView<'a> {
    name: &'a str,
    dtype: Dtype,
    shape: &'a [usize],
    data: &'a [u8],
}

impl SafetensorsFile {
    /// Maps and validates `path`. Nothing is read beyond the header until a view's bytes are
    /// touched.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        let io = |source| Error::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        // Checked before mapping: an empty file cannot be mapped on every platform.
        if len < LEN_PREFIX as u64 {
            return Err(Error::TooSmall { path, len });
        }
        // SAFETY: the map is read-only and lives as long as the views borrowed from it. As with
        // every mmap reader, truncating or rewriting the file while it is mapped is outside what
        // any check here can guard against.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        let layout = parse(&mmap, &path)?;
        Ok(SafetensorsFile {
            path,
            mmap,
            header_len: layout.header_len,
            metadata: layout.metadata,
            tensors: layout.tensors,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The header's `__metadata__` map (empty when absent).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Length of the JSON header in bytes, as declared by the 8-byte prefix.
    pub fn header_len(&self) -> usize {
        self.header_len
    }

    /// File offset of the data section, which tensor offsets are relative to.
    pub fn data_offset(&self) -> usize {
        LEN_PREFIX + self.header_len
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Tensor names in lexicographic order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.tensors
            .get_key_value(name)
            .map(|(name, info)| self.view(name, info))
    }

    /// Like [`SafetensorsFile::tensor`], with an error naming the file when absent.
    pub fn get(&self, name: &str) -> Result<TensorView<'_>, Error> {
        self.tensor(name).ok_or_else(|| Error::TensorNotFound {
            path: self.path.clone(),
            tensor: name.to_owned(),
        })
    }

    /// All tensors in name order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.tensors
            .iter()
            .map(|(name, info)| self.view(name, info))
    }

    fn view<'a>(&'a self, name: &'a str, info: &'a TensorInfo) -> TensorView<'a> {
        TensorView {
            name,
            dtype: info.dtype,
            shape: &info.shape,
            // In bounds: `parse` checked every range against the mapped length.
            data: &self.mmap[info.bytes.clone()],
        }
    }
}

impl fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("path", &self.path)
            .field("tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

impl<'a> TensorView<'a> {
    pub fn name(&self) -> &'a str {
        self.name
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    pub fn shape(&self) -> &'a [usize] {
        self.shape
    }

    /// The raw little-endian bytes, borrowed from the map.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Element count (1 for a scalar of shape `[]`).
    pub fn numel(&self) -> usize {
        self.data.len() / self.dtype.size()
    }

    /// The elements as f32: exact for every dtype but F64, which rounds to nearest. The 32- and
    /// 64-bit integer dtypes are refused (see [`Dtype::converts_to_f32`]).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>, Error> {
        let decode = f32_decoder(self.dtype).ok_or_else(|| Error::NotConvertible {
            tensor: self.name.to_owned(),
            dtype: self.dtype,
        })?;
        let mut out = vec![0f32; self.numel()];
        decode(self.data, &mut out);
        Ok(out)
    }
}

impl fmt::Debug for TensorView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorView")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("bytes", &self.data.len())
            .finish()
    }
}

struct Layout {
    header_len: usize,
    metadata: BTreeMap<String, String>,
    tensors: BTreeMap<String, TensorInfo>,
}

/// Validates the whole file image and resolves every tensor to an absolute byte range.
fn parse(file: &[u8], path: &Path) -> Result<Layout, Error> {
    let path_buf = || path.to_path_buf();
    let mut prefix = [0u8; LEN_PREFIX];
    prefix.copy_from_slice(&file[..LEN_PREFIX]);
    let declared = u64::from_le_bytes(prefix);
    let available = (file.len() - LEN_PREFIX) as u64;
    if declared > MAX_HEADER_LEN {
        return Err(Error::HeaderTooLarge {
            path: path_buf(),
            declared,
            limit: MAX_HEADER_LEN,
        });
    }
    if declared > available {
        return Err(Error::HeaderPastEnd {
            path: path_buf(),
            declared,
            available,
        });
    }
    // Both bounds above make this conversion and slice lossless and in range.
    let header_len = declared as usize;
    let data_start = LEN_PREFIX + header_len;
    let header = std::str::from_utf8(&file[LEN_PREFIX..data_start]).map_err(|source| {
        Error::HeaderNotUtf8 {
            path: path_buf(),
            source,
        }
    })?;
    let raw: RawHeader = serde_json::from_str(header).map_err(|source| Error::HeaderJson {
        path: path_buf(),
        source,
    })?;
    let data_len = (file.len() - data_start) as u64;

    let mut tensors = BTreeMap::new();
    let mut spans = Vec::with_capacity(raw.entries.len());
    for (name, entry) in raw.entries {
        let dtype = Dtype::from_name(&entry.dtype).ok_or_else(|| Error::UnsupportedDtype {
            path: path_buf(),
            tensor: name.clone(),
            dtype: entry.dtype.clone(),
        })?;
        let [start, end] = entry.data_offsets;
        let expected = entry
            .shape
            .iter()
            .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d));
        let shape: Option<Vec<usize>> = entry
            .shape
            .iter()
            .map(|&d| usize::try_from(d).ok())
            .collect();
        let (Some(expected), Some(shape)) = (expected, shape) else {
            return Err(Error::ShapeOverflow {
                path: path_buf(),
                tensor: name,
                shape: entry.shape,
            });
        };
        if end < start {
            return Err(Error::ReversedOffsets {
                path: path_buf(),
                tensor: name,
                start,
                end,
            });
        }
        if end > data_len {
            return Err(Error::OffsetsOutOfBounds {
                path: path_buf(),
                tensor: name,
                start,
                end,
                data_len,
            });
        }
        if end - start != expected {
            return Err(Error::SizeMismatch {
                path: path_buf(),
                tensor: name,
                dtype,
                shape: entry.shape,
                expected,
                actual: end - start,
            });
        }
        spans.push((start, end, name.clone()));
        // `end <= data_len`, so both offsets fit the mapped length.
        let bytes = data_start + start as usize..data_start + end as usize;
        tensors.insert(
            name,
            TensorInfo {
                dtype,
                shape,
                bytes,
            },
        );
    }

    // Sorted by offset, the tensors must tile the data section exactly. Overlaps would let two
    // tensors alias, and unclaimed bytes usually mean a truncated or hand-edited header.
    spans.sort_unstable();
    let mut cursor = 0u64;
    let mut previous: Option<&str> = None;
    for (start, end, name) in &spans {
        if *start < cursor {
            return Err(Error::Overlap {
                path: path_buf(),
                tensor: name.clone(),
                other: previous.unwrap_or_default().to_owned(),
            });
        }
        if *start > cursor {
            return Err(Error::Gap {
                path: path_buf(),
                start: cursor,
                end: *start,
            });
        }
        cursor = *end;
        previous = Some(name);
    }
    if cursor != data_len {
        return Err(Error::Gap {
            path: path_buf(),
            start: cursor,
            end: data_len,
        });
    }

    Ok(Layout {
        header_len,
        metadata: raw.metadata.unwrap_or_default(),
        tensors,
    })
}

#[derive(Deserialize)]
struct RawEntry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// The header as written, in file order.
#[derive(Deserialize)]
#[serde(from = "UniqueMap<HeaderValue>")]
struct RawHeader {
    metadata: Option<BTreeMap<String, String>>,
    entries: Vec<(String, RawEntry)>,
}

/// One header value: its key decides whether it is the metadata or a tensor.
enum HeaderValue {
    Metadata(Option<BTreeMap<String, String>>),
    Tensor(RawEntry),
}

impl<'de> MapValue<'de> for HeaderValue {
    const EXPECTING: &'static str =
        "an object mapping tensor names to {dtype, shape, data_offsets}";

    fn next_value<A: MapAccess<'de>>(key: &str, map: &mut A) -> Result<Self, A::Error> {
        if key == "__metadata__" {
            map.next_value().map(HeaderValue::Metadata)
        } else {
            map.next_value().map(HeaderValue::Tensor)
        }
    }
}

impl From<UniqueMap<HeaderValue>> for RawHeader {
    fn from(map: UniqueMap<HeaderValue>) -> Self {
        let mut header = RawHeader {
            metadata: None,
            entries: Vec::with_capacity(map.0.len()),
        };
        for (key, value) in map.0 {
            match value {
                // `UniqueMap` guarantees at most one `__metadata__`.
                HeaderValue::Metadata(metadata) => header.metadata = metadata,
                HeaderValue::Tensor(entry) => header.entries.push((key, entry)),
            }
        }
        header
    }
}

/// A JSON object's entries in file order. Deserialized by hand because a derived map would keep
/// only the last of two entries with the same key, silently dropping a tensor (or, in a sharded
/// index, picking one of two shards); a repeated key is an error instead.
pub(super) struct UniqueMap<V>(pub(super) Vec<(String, V)>);

/// How the values of a [`UniqueMap`] are read; the key is passed along because what a value must
/// look like can depend on it.
pub(super) trait MapValue<'de>: Sized {
    /// What the whole object should be, for error messages.
    const EXPECTING: &'static str;

    fn next_value<A: MapAccess<'de>>(key: &str, map: &mut A) -> Result<Self, A::Error>;
}

impl<'de, V: MapValue<'de>> Deserialize<'de> for UniqueMap<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct UniqueVisitor<V>(PhantomData<V>);

        impl<'de, V: MapValue<'de>> Visitor<'de> for UniqueVisitor<V> {
            type Value = UniqueMap<V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(V::EXPECTING)
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueMap<V>, A::Error> {
                let mut seen = HashSet::new();
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    if !seen.insert(key.clone()) {
                        return Err(de::Error::custom(format!("duplicate key `{key}`")));
                    }
                    let value = V::next_value(&key, &mut map)?;
                    entries.push((key, value));
                }
                Ok(UniqueMap(entries))
            }
        }

        deserializer.deserialize_map(UniqueVisitor(PhantomData))
    }
}
