//! `akunu inspect`: what a model file holds, for people (a summary and a tensor table) and for
//! scripts (`--json`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use akunu_formats::gguf::{GgufFile, TensorInfo, Value, ValueType};
use akunu_formats::GgmlType;
use anyhow::{Context, Result};
use serde_json::{json, Map, Value as Json};

/// Arrays longer than this are summarised rather than listed in full.
const JSON_ARRAY_LIMIT: usize = 64;

pub struct InspectOptions {
    pub json: bool,
    /// List every metadata key, not only the architecture's hyperparameters.
    pub all_metadata: bool,
    /// Leave out the per-tensor table.
    pub no_tensors: bool,
}

pub fn run(path: &Path, opts: &InspectOptions) -> Result<()> {
    let file = GgufFile::open(path).with_context(|| format!("reading {}", path.display()))?;
    let report = Report::new(path, &file);
    let out = if opts.json {
        serde_json::to_string_pretty(&report.to_json(opts))? + "\n"
    } else {
        report.to_text(opts)
    };
    print!("{out}");
    Ok(())
}

struct TypeTotal {
    tensors: usize,
    elements: u64,
    bytes: u64,
}

struct Report<'a> {
    path: &'a Path,
    file: &'a GgufFile,
    arch: Option<&'a str>,
    totals: BTreeMap<u32, (GgmlType, TypeTotal)>,
}

impl<'a> Report<'a> {
    fn new(path: &'a Path, file: &'a GgufFile) -> Self {
        let mut totals = BTreeMap::new();
        for t in file.tensors() {
            let (_, total) = totals.entry(t.ty as u32).or_insert((
                t.ty,
                TypeTotal {
                    tensors: 0,
                    elements: 0,
                    bytes: 0,
                },
            ));
            total.tensors += 1;
            total.elements += t.n_elements;
            total.bytes += t.n_bytes;
        }
        Report {
            path,
            file,
            arch: file.architecture(),
            totals,
        }
    }

    /// `{arch}.*` keys with the prefix removed.
    fn hyperparameters(&self) -> Vec<(&'a str, Value<'a>)> {
        let Some(arch) = self.arch else {
            return Vec::new();
        };
        self.file
            .metadata()
            .filter_map(|(k, v)| Some((k.strip_prefix(arch)?.strip_prefix('.')?, v)))
            .collect()
    }

    fn tokenizer(&self) -> Option<TokenizerSummary<'a>> {
        let f = self.file;
        let model = f.get_str("tokenizer.ggml.model")?;
        let count = |key| f.get(key).and_then(|v| v.as_array()).map(|a| a.len());
        let special = [
            "bos_token_id",
            "eos_token_id",
            "eot_token_id",
            "unknown_token_id",
            "padding_token_id",
        ]
        .into_iter()
        .filter_map(|k| {
            let id = f.get_u64(&format!("tokenizer.ggml.{k}"))?;
            Some((k.trim_end_matches("_token_id"), id))
        })
        .collect();
        Some(TokenizerSummary {
            model,
            pre: f.get_str("tokenizer.ggml.pre"),
            tokens: count("tokenizer.ggml.tokens"),
            merges: count("tokenizer.ggml.merges"),
            special,
            chat_template: f.get_str("tokenizer.chat_template").map(str::len),
        })
    }

    fn to_text(&self, opts: &InspectOptions) -> String {
        let f = self.file;
        let mut s = String::new();
        let size = f.bytes().len() as u64;
        let _ = writeln!(
            s,
            "file           {} ({})",
            self.path.display(),
            human_bytes(size)
        );
        let _ = writeln!(
            s,
            "format         GGUF v{}, {} metadata keys, {} tensors, alignment {}, data at byte {}",
            f.version(),
            f.metadata_len(),
            f.tensors().len(),
            f.alignment(),
            f.data_offset()
        );
        let _ = writeln!(s, "architecture   {}", self.arch.unwrap_or("(none)"));
        if let Some(name) = f.get_str("general.name") {
            let _ = writeln!(s, "name           {name}");
        }
        if let Some(ft) = f.get_u64("general.file_type") {
            let _ = writeln!(s, "file type      {ft}");
        }
        let hp = self.hyperparameters();
        if !hp.is_empty() {
            let _ = writeln!(s, "\nhyperparameters");
            for (k, v) in hp {
                let _ = writeln!(s, "  {k:<36} {v}");
            }
        }
        let _ = writeln!(s, "\ntokenizer");
        match self.tokenizer() {
            Some(t) => {
                let _ = writeln!(s, "  model          {}", t.model);
                if let Some(pre) = t.pre {
                    let _ = writeln!(s, "  pre-tokenizer  {pre}");
                }
                if let Some(n) = t.tokens {
                    let _ = writeln!(s, "  tokens         {n}");
                }
                if let Some(n) = t.merges {
                    let _ = writeln!(s, "  merges         {n}");
                }
                for (name, id) in &t.special {
                    let _ = writeln!(s, "  {:<14} {id}", format!("{name} id"));
                }
                let template = match t.chat_template {
                    Some(n) => format!("present ({n} bytes)"),
                    None => "absent".into(),
                };
                let _ = writeln!(s, "  chat template  {template}");
            }
            None => {
                let _ = writeln!(s, "  (none)");
            }
        }
        if opts.all_metadata {
            let _ = writeln!(s, "\nmetadata");
            for (k, v) in f.metadata() {
                let _ = writeln!(s, "  {k:<44} {:<8} {v}", v.value_type());
            }
        }
        if !opts.no_tensors && !f.tensors().is_empty() {
            let width = f
                .tensors()
                .iter()
                .map(|t| t.name.len())
                .max()
                .unwrap_or(4)
                .max(4);
            let _ = writeln!(
                s,
                "\n{:<width$}  {:<7}  {:<22}  {:>12}",
                "name", "type", "shape", "bytes"
            );
            for t in f.tensors() {
                let _ = writeln!(
                    s,
                    "{:<width$}  {:<7}  {:<22}  {:>12}",
                    t.name,
                    t.ty.name(),
                    shape(t),
                    t.n_bytes
                );
            }
        }
        let _ = writeln!(
            s,
            "\n{:<8}  {:>7}  {:>14}  {:>12}",
            "type", "tensors", "elements", "bytes"
        );
        let (mut n, mut elements, mut bytes) = (0, 0, 0);
        for (ty, total) in self.totals.values() {
            let _ = writeln!(
                s,
                "{:<8}  {:>7}  {:>14}  {:>12}",
                ty.name(),
                total.tensors,
                total.elements,
                total.bytes
            );
            n += total.tensors;
            elements += total.elements;
            bytes += total.bytes;
        }
        let _ = writeln!(
            s,
            "{:<8}  {n:>7}  {elements:>14}  {bytes:>12}  ({:.1} M parameters, {})",
            "total",
            elements as f64 / 1e6,
            human_bytes(bytes)
        );
        s
    }

    fn to_json(&self, opts: &InspectOptions) -> Json {
        let f = self.file;
        let hyperparameters: Map<String, Json> = self
            .hyperparameters()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), value_json(&v)))
            .collect();
        let tokenizer = self.tokenizer().map(|t| {
            json!({
                "model": t.model,
                "pre": t.pre,
                "tokens": t.tokens,
                "merges": t.merges,
                "special": t.special.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<Map<_, _>>(),
                "chat_template": t.chat_template.is_some(),
            })
        });
        let totals: Map<String, Json> = self
            .totals
            .values()
            .map(|(ty, t)| {
                let v = json!({"tensors": t.tensors, "elements": t.elements, "bytes": t.bytes});
                (ty.name().to_owned(), v)
            })
            .collect();
        let mut out = json!({
            "file": self.path.display().to_string(),
            "file_bytes": f.bytes().len(),
            "gguf_version": f.version(),
            "alignment": f.alignment(),
            "data_offset": f.data_offset(),
            "architecture": self.arch,
            "name": f.get_str("general.name"),
            "hyperparameters": hyperparameters,
            "tokenizer": tokenizer,
            "chat_template": f.get_str("tokenizer.chat_template").is_some(),
            "tensor_count": f.tensors().len(),
            "totals_by_type": totals,
            "total_elements": f.tensors().iter().map(|t| t.n_elements).sum::<u64>(),
            "total_bytes": f.tensors().iter().map(|t| t.n_bytes).sum::<u64>(),
        });
        if opts.all_metadata {
            let metadata: Map<String, Json> = f
                .metadata()
                .map(|(k, v)| (k.to_owned(), value_json(&v)))
                .collect();
            out["metadata"] = Json::Object(metadata);
        }
        if !opts.no_tensors {
            out["tensors"] = f
                .tensors()
                .iter()
                .map(|t| {
                    json!({"name": t.name, "type": t.ty.name(), "shape": t.dims,
                           "offset": t.offset, "bytes": t.n_bytes})
                })
                .collect();
        }
        out
    }
}

struct TokenizerSummary<'a> {
    model: &'a str,
    pre: Option<&'a str>,
    tokens: Option<usize>,
    merges: Option<usize>,
    special: Vec<(&'static str, u64)>,
    chat_template: Option<usize>,
}

fn shape(t: &TensorInfo) -> String {
    let dims: Vec<String> = t.dims.iter().map(u64::to_string).collect();
    format!("[{}]", dims.join(", "))
}

fn value_json(v: &Value) -> Json {
    match v {
        Value::String(s) => json!(s),
        Value::Bool(b) => json!(b),
        // Through the shortest decimal that reads back as this f32, so 1e-6 is not shown as
        // 9.999999974752427e-7.
        Value::F32(x) => x
            .to_string()
            .parse::<f64>()
            .map_or(Json::Null, |x| json!(x)),
        Value::F64(x) => json!(x),
        Value::Array(a) if a.len() > JSON_ARRAY_LIMIT || a.elem_type() == ValueType::Array => {
            json!({"array_of": a.elem_type().name(), "len": a.len()})
        }
        Value::Array(a) => a.iter().map(|x| value_json(&x)).collect(),
        other => other.as_int().map_or(Json::Null, |i| {
            i64::try_from(i).map_or_else(|_| json!(i as u64), |i| json!(i))
        }),
    }
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = n as f64;
    let mut unit = 0;
    while x >= 1024.0 && unit + 1 < UNITS.len() {
        x /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{x:.2} {}", UNITS[unit])
    }
}
