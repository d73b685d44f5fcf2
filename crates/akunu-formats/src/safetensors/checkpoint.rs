//! Checkpoints spread over one or more safetensors files.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::de::MapAccess;
use serde::Deserialize;

use super::file::{MapValue, UniqueMap};
use super::{Error, SafetensorsFile, TensorView, MAX_HEADER_LEN};

/// Name of the shard index that Hugging Face and mlx-lm write next to sharded weights.
const INDEX_NAME: &str = "model.safetensors.index.json";

/// Index files are small JSON maps; the header limit is a generous bound on what is worth reading.
const MAX_INDEX_LEN: u64 = MAX_HEADER_LEN;

/// All tensors of a checkpoint, each name resolved to the one file that stores it.
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    files: Vec<SafetensorsFile>,
    locations: BTreeMap<String, usize>,
    index_metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

impl Checkpoint {
    /// Opens `path`, which is one of:
    /// - a `.safetensors` file;
    /// - a `model.safetensors.index.json` (or any index-shaped `.json`), whose `weight_map` names
    ///   shard files in the same directory;
    /// - a directory: its `model.safetensors.index.json` when present, else every
    ///   `model*.safetensors` file in it, which is how mlx-lm finds unindexed weights.
    ///
    /// Every file is validated, a tensor name may occur in only one file, and each index entry
    /// must point at the shard that really holds the tensor. Tensors a shard holds beyond its
    /// index entries are kept, since the shard header is the authority on what it contains.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        if path.is_dir() {
            let index = path.join(INDEX_NAME);
            if index.is_file() {
                Self::open_index(&index)
            } else {
                Self::open_directory(path)
            }
        } else if path.extension().is_some_and(|e| e == "json") {
            Self::open_index(path)
        } else {
            let file = SafetensorsFile::open(path)?;
            Self::assemble(path, vec![file], None)
        }
    }

    fn open_directory(dir: &Path) -> Result<Self, Error> {
        let io = |source| Error::Io {
            path: dir.to_path_buf(),
            source,
        };
        let mut shards = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("model") && name.ends_with(".safetensors") {
                shards.push(entry.path());
            }
        }
        if shards.is_empty() {
            return Err(Error::NoWeights {
                path: dir.to_path_buf(),
            });
        }
        shards.sort();
        let files = shards
            .iter()
            .map(SafetensorsFile::open)
            .collect::<Result<Vec<_>, _>>()?;
        Self::assemble(dir, files, None)
    }

    fn open_index(index: &Path) -> Result<Self, Error> {
        let io = |source| Error::Io {
            path: index.to_path_buf(),
            source,
        };
        let len = std::fs::metadata(index).map_err(io)?.len();
        if len > MAX_INDEX_LEN {
            return Err(Error::IndexTooLarge {
                path: index.to_path_buf(),
                len,
                limit: MAX_INDEX_LEN,
            });
        }
        let text = std::fs::read(index).map_err(io)?;
        let raw: RawIndex = serde_json::from_slice(&text).map_err(|source| Error::IndexJson {
            path: index.to_path_buf(),
            source,
        })?;
        let dir = index.parent().unwrap_or(Path::new(""));

        // Shard names must stay inside the index's directory: an index is data, and "../x" or an
        // absolute path would let it point the reader anywhere on disk.
        let mut shard_names: Vec<&str> = Vec::new();
        for (tensor, shard) in &raw.weight_map.0 {
            let mut components = Path::new(shard).components();
            let plain = matches!(components.next(), Some(Component::Normal(_)))
                && components.next().is_none();
            if !plain {
                return Err(Error::BadShardName {
                    path: index.to_path_buf(),
                    tensor: tensor.clone(),
                    shard: shard.clone(),
                });
            }
            shard_names.push(shard);
        }
        shard_names.sort_unstable();
        shard_names.dedup();

        let mut files = Vec::with_capacity(shard_names.len());
        for name in &shard_names {
            let shard = dir.join(name);
            if !shard.is_file() {
                return Err(Error::MissingShard {
                    index: index.to_path_buf(),
                    shard,
                });
            }
            files.push(SafetensorsFile::open(&shard)?);
        }
        let checkpoint = Self::assemble(index, files, raw.metadata)?;

        for (tensor, shard) in &raw.weight_map.0 {
            // `shard_names` is sorted and deduplicated and `files` follows its order.
            let listed = shard_names.binary_search(&shard.as_str()).ok();
            if checkpoint.locations.get(tensor).copied() != listed {
                return Err(Error::MissingFromShard {
                    index: index.to_path_buf(),
                    tensor: tensor.clone(),
                    shard: dir.join(shard),
                });
            }
        }
        Ok(checkpoint)
    }

    fn assemble(
        path: &Path,
        files: Vec<SafetensorsFile>,
        index_metadata: Option<serde_json::Map<String, serde_json::Value>>,
    ) -> Result<Self, Error> {
        let mut locations = BTreeMap::new();
        for (i, file) in files.iter().enumerate() {
            for name in file.names() {
                if let Some(first) = locations.insert(name.to_owned(), i) {
                    return Err(Error::DuplicateTensor {
                        tensor: name.to_owned(),
                        first: files[first].path().to_path_buf(),
                        second: file.path().to_path_buf(),
                    });
                }
            }
        }
        Ok(Checkpoint {
            path: path.to_path_buf(),
            files,
            locations,
            index_metadata,
        })
    }

    /// The path this checkpoint was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The files, in shard-name order.
    pub fn files(&self) -> &[SafetensorsFile] {
        &self.files
    }

    /// The index's `metadata` object (usually `total_size`), when opened through an index.
    pub fn index_metadata(&self) -> Option<&serde_json::Map<String, serde_json::Value>> {
        self.index_metadata.as_ref()
    }

    /// Number of tensors over all files.
    pub fn len(&self) -> usize {
        self.locations.len()
    }

    pub fn is_empty(&self) -> bool {
        self.locations.is_empty()
    }

    /// Tensor names in lexicographic order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.locations.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.locations.contains_key(name)
    }

    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let &file = self.locations.get(name)?;
        self.files[file].tensor(name)
    }

    /// Like [`Checkpoint::tensor`], with an error naming the checkpoint when absent.
    pub fn get(&self, name: &str) -> Result<TensorView<'_>, Error> {
        self.tensor(name).ok_or_else(|| Error::TensorNotFound {
            path: self.path.clone(),
            tensor: name.to_owned(),
        })
    }

    /// The file holding tensor `name`.
    pub fn file_of(&self, name: &str) -> Option<&SafetensorsFile> {
        self.locations.get(name).map(|&i| &self.files[i])
    }
}

#[derive(Deserialize)]
struct RawIndex {
    #[serde(default)]
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
    weight_map: UniqueMap<String>,
}

/// A `weight_map` value: the shard file holding the tensor. Repeated tensor names are rejected by
/// [`UniqueMap`], since the two entries may name different shards.
impl<'de> MapValue<'de> for String {
    const EXPECTING: &'static str = "an object mapping tensor names to shard file names";

    fn next_value<A: MapAccess<'de>>(_key: &str, map: &mut A) -> Result<Self, A::Error> {
        map.next_value()
    }
}
