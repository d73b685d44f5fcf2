//! `akunu bench`: prompt-processing and generation speed, measured and printed as llama.cpp's
//! `llama-bench` does, so that the two tools' tables and JSON line up.
//!
//! Every combination of the list flags is one test, run on a fresh cache of
//! `depth + prompt + gen` positions. A prompt test (`ppN`) evaluates N random token ids, BOS
//! first when the model adds one, in batches of `-b` (each pass at most `-ub` tokens); a
//! generation test (`tgN`) decodes N single tokens, BOS then random ids. One warm-up run (the
//! whole prompt, one generated token) precedes the `-r` timed repetitions; the cache is
//! cleared before each repetition and a `-d` prefix is evaluated before the clock starts.
//! Speed is computed per repetition (`(prompt + gen) / time`), then averaged, with the sample
//! standard deviation.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::device::{AnyBackend, Device};
use akunu_core::session::Logits;
use akunu_core::Backend;
use akunu_core::{Model, Session};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::{json, Value as Json};

use crate::engine::{self, EngineArgs};
use crate::ModelArg;

/// llama-bench's defaults, which decide which optional columns the table shows.
const DEFAULT_BATCH: usize = 2048;
const DEFAULT_UBATCH: usize = 512;
const FA_AUTO: i64 = -1;

#[derive(Args)]
pub struct BenchArgs {
    /// Models: files, Hugging Face files (`owner/repo/file.gguf`) or URLs (default: the default
    /// model, fetched on first use).
    #[arg(value_name = "MODEL")]
    pub positional: Vec<String>,
    /// More models; may be repeated or comma-separated.
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Vec<String>,
    /// Prompt lengths (default 512; 0 = no prompt test).
    ///
    /// Every list flag takes comma-separated values and ranges, `first-last`,
    /// `first-last+step` or `first-last*factor`, and may be repeated.
    #[arg(short = 'p', long = "n-prompt", value_name = "N")]
    pub n_prompt: Vec<String>,
    /// Generation lengths (default 128; 0 = no generation test).
    #[arg(short = 'n', long = "n-gen", value_name = "N")]
    pub n_gen: Vec<String>,
    /// A prompt followed by generation, timed together: `PP,TG`; may be repeated.
    #[arg(long = "pg", value_name = "PP,TG")]
    pub pg: Vec<String>,
    /// Tokens already in the cache when a test starts (default 0).
    #[arg(short = 'd', long = "n-depth", value_name = "N")]
    pub n_depth: Vec<String>,
    /// Tokens handed to the engine at once during prompt processing (default 2048).
    #[arg(short = 'b', long = "batch-size", value_name = "N")]
    pub batch_size: Vec<String>,
    /// Most tokens in one forward pass (default 512).
    #[arg(long = "ubatch-size", value_name = "N")]
    pub ubatch_size: Vec<String>,
    /// Threads (default: the number of physical cores).
    #[arg(short = 't', long = "threads", value_name = "N")]
    pub threads: Vec<String>,
    /// Layers to put on the GPU, reported: 0 runs on the CPU; any other value puts the whole
    /// model on the GPU (the default when one can be used).
    #[arg(long = "n-gpu-layers", value_name = "N", allow_negative_numbers = true)]
    pub n_gpu_layers: Vec<String>,
    /// Where to run: auto (the GPU when one can be used), cpu or cuda. With cuda, a GPU that
    /// cannot be used is an error rather than a run on the CPU.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    /// on|off|auto. Accepted for compatibility and reported; each backend has one attention
    /// path (flash attention on the GPU).
    #[arg(
        long = "flash-attn",
        value_name = "MODE",
        allow_negative_numbers = true
    )]
    pub flash_attn: Vec<String>,
    /// Timed repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub repetitions: usize,
    /// Format of the results on stdout.
    #[arg(short = 'o', long = "output", value_enum, default_value = "md")]
    pub output: Format,
    /// Also print the results on stderr, in this format.
    #[arg(long = "output-err", value_enum, value_name = "FORMAT")]
    pub output_err: Option<Format>,
    /// Report each step on stderr.
    #[arg(long)]
    pub progress: bool,
    /// Skip the warm-up run before each test.
    #[arg(long)]
    pub no_warmup: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Md,
    Json,
    Jsonl,
    Csv,
}

/// One test: a point of the parameter grid.
#[derive(Clone, Debug)]
struct Instance {
    model: usize,
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
    n_batch: usize,
    n_ubatch: usize,
    n_threads: usize,
    n_gpu_layers: i64,
    flash_attn: i64,
}

/// What the table and JSON say about a model, as llama.cpp reports it.
struct ModelInfo {
    filename: String,
    /// `arch size quantization`, as `llama_model_desc` writes it.
    desc: String,
    /// Bytes of tensor data.
    size: u64,
    n_params: u64,
}

struct TestResult<'a> {
    model: &'a ModelInfo,
    inst: &'a Instance,
    cpu_info: &'a str,
    /// The GPU's name, empty on the CPU.
    gpu_info: String,
    test_time: String,
    samples_ns: Vec<u64>,
}

pub fn run(args: &BenchArgs) -> Result<()> {
    if args.repetitions == 0 {
        bail!("-r must be at least 1");
    }
    let models = model_specs(args);
    let n_prompt = list(&args.n_prompt, "-p", false, 512)?;
    let n_gen = list(&args.n_gen, "-n", false, 128)?;
    let n_depth = list(&args.n_depth, "-d", false, 0)?;
    let n_batch = list(&args.batch_size, "-b", false, DEFAULT_BATCH as i64)?;
    let n_ubatch = list(&args.ubatch_size, "-ub", false, DEFAULT_UBATCH as i64)?;
    let threads = list(&args.threads, "-t", false, engine::default_threads() as i64)?;
    let ngl = list(&args.n_gpu_layers, "-ngl", true, -1)?;
    let fa = flash_attn_modes(&args.flash_attn)?;
    let pg = args
        .pg
        .iter()
        .map(|s| parse_pair(s))
        .collect::<Result<Vec<_>>>()?;
    for (flag, values) in [("-b", &n_batch), ("-ub", &n_ubatch), ("-t", &threads)] {
        if values.contains(&0) {
            bail!("{flag} must be at least 1");
        }
    }

    let as_usize = |v: &[i64]| v.iter().map(|&x| x as usize).collect::<Vec<_>>();
    let (n_prompt, n_gen, n_depth) = (as_usize(&n_prompt), as_usize(&n_gen), as_usize(&n_depth));
    let (n_batch, n_ubatch, threads) =
        (as_usize(&n_batch), as_usize(&n_ubatch), as_usize(&threads));
    let mut instances = Vec::new();
    for model in 0..models.len() {
        for &n_gpu_layers in &ngl {
            for &nb in &n_batch {
                for &nub in &n_ubatch {
                    for &flash_attn in &fa {
                        for &nt in &threads {
                            for &nd in &n_depth {
                                let base = Instance {
                                    model,
                                    n_prompt: 0,
                                    n_gen: 0,
                                    n_depth: nd,
                                    n_batch: nb,
                                    n_ubatch: nub,
                                    n_threads: nt,
                                    n_gpu_layers,
                                    flash_attn,
                                };
                                let tests = n_prompt
                                    .iter()
                                    .map(|&p| (p, 0))
                                    .chain(n_gen.iter().map(|&n| (0, n)))
                                    .chain(pg.iter().copied());
                                for (p, n) in tests {
                                    if nd.checked_add(p).and_then(|c| c.checked_add(n)).is_none() {
                                        bail!(
                                            "depth {nd} + prompt {p} + generation {n} tokens \
                                             overflows a token count"
                                        );
                                    }
                                    if p + n > 0 {
                                        if instances.len() == MAX_LIST {
                                            bail!("these lists make more than {MAX_LIST} tests");
                                        }
                                        instances.push(Instance {
                                            n_prompt: p,
                                            n_gen: n,
                                            ..base.clone()
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    let columns = Columns {
        n_batch: n_batch != [DEFAULT_BATCH],
        n_ubatch: n_ubatch != [DEFAULT_UBATCH],
        flash_attn: fa != [FA_AUTO],
    };
    let mut printers: Vec<(Format, Box<dyn std::io::Write>)> =
        vec![(args.output, Box::new(std::io::stdout()))];
    if let Some(f) = args.output_err {
        printers.push((f, Box::new(std::io::stderr())));
    }
    for (format, out) in &mut printers {
        write!(out, "{}", header(*format, &columns))?;
        out.flush()?;
    }

    let cpu_info = cpu_info();
    let mut infos: Vec<Option<ModelInfo>> = models.iter().map(|_| None).collect();
    let mut paths = Vec::new();
    for spec in &models {
        paths.push(spec.resolve()?);
    }
    let count = instances.len();
    for (idx, inst) in instances.iter().enumerate() {
        let progress = |what: &str| {
            if args.progress {
                eprintln!("akunu bench: benchmark {}/{count}: {what}", idx + 1);
            }
        };
        progress("starting");
        let engine_args = EngineArgs {
            ctx_size: inst.n_depth + inst.n_prompt + inst.n_gen,
            threads: Some(inst.n_threads),
            batch_size: inst.n_ubatch.min(inst.n_batch),
            n_gpu_layers: Some(inst.n_gpu_layers),
            device: args.device,
        };
        let loaded = engine::load(&paths[inst.model], &engine_args, 1)?;
        let gpu_info = loaded.session.backend().gpu_name().unwrap_or_default();
        let model = &loaded.model;
        let mut session = loaded.session;
        let info = infos[inst.model].get_or_insert_with(|| model_info(&paths[inst.model], model));

        if !args.no_warmup {
            if inst.n_prompt > 0 {
                progress("warmup prompt run");
                test_prompt(&mut session, model, inst.n_prompt, inst.n_batch)?;
            }
            if inst.n_gen > 0 {
                progress("warmup generation run");
                test_gen(&mut session, model, 1)?;
            }
        }
        let mut samples_ns = Vec::new();
        for rep in 1..=args.repetitions {
            session.clear(0)?;
            if inst.n_depth > 0 {
                progress(&format!("depth run {rep}/{}", args.repetitions));
                test_prompt(&mut session, model, inst.n_depth, inst.n_batch)?;
            }
            let t = Instant::now();
            if inst.n_prompt > 0 {
                progress(&format!("prompt run {rep}/{}", args.repetitions));
                test_prompt(&mut session, model, inst.n_prompt, inst.n_batch)?;
            }
            if inst.n_gen > 0 {
                progress(&format!("generation run {rep}/{}", args.repetitions));
                test_gen(&mut session, model, inst.n_gen)?;
            }
            samples_ns.push(t.elapsed().as_nanos().max(1) as u64);
        }
        let result = TestResult {
            model: info,
            inst,
            cpu_info: &cpu_info,
            gpu_info: gpu_info.clone(),
            test_time: rfc3339_now(),
            samples_ns,
        };
        for (format, out) in &mut printers {
            write!(out, "{}", result.format(*format, &columns, idx == 0))?;
            out.flush()?;
        }
    }
    for (format, out) in &mut printers {
        write!(out, "{}", footer(*format))?;
        out.flush()?;
    }
    Ok(())
}

/// Evaluates `n` random tokens from where the cache is, in batches of `n_batch`, as
/// llama-bench's `test_prompt` does (each batch returns the logits of its last token).
fn test_prompt(
    session: &mut Session<AnyBackend>,
    model: &Model,
    n: usize,
    n_batch: usize,
) -> Result<()> {
    for batch in engine::synthetic_tokens(model, n).chunks(n_batch) {
        session.eval(0, batch, Logits::Last)?;
    }
    Ok(())
}

/// `n` single-token decode steps, BOS first: llama-bench's `test_gen`. A backend that
/// chooses tokens on the device generates them as `generate` does, in greedy chains (each
/// step still one full pass of one token); otherwise random ids are fed as llama-bench does.
fn test_gen(session: &mut Session<AnyBackend>, model: &Model, n: usize) -> Result<()> {
    let tokens = engine::synthetic_tokens(model, n);
    if let Some((_, len)) = session.backend().chain_lengths() {
        let mut next = tokens[0];
        let mut done = 0;
        while done < n {
            let k = len.min(n - done);
            let chain = session
                .greedy_chain(0, next, k)
                .ok_or_else(|| anyhow::anyhow!("the backend stopped chaining"))??;
            next = chain[k - 1];
            done += k;
        }
        return Ok(());
    }
    for tok in tokens {
        session.eval(0, &[tok], Logits::Last)?;
    }
    Ok(())
}

/// The positional models then the `-m` ones, with `-m a,b` split as llama-bench splits it;
/// none means the default model.
fn model_specs(args: &BenchArgs) -> Vec<ModelArg> {
    let specs: Vec<ModelArg> = args
        .positional
        .iter()
        .map(String::as_str)
        .chain(args.model.iter().flat_map(|m| m.split(',')))
        .filter(|s| !s.is_empty())
        .map(|s| ModelArg {
            positional: Some(s.to_owned()),
            flag: None,
        })
        .collect();
    if specs.is_empty() {
        vec![ModelArg {
            positional: None,
            flag: None,
        }]
    } else {
        specs
    }
}

/// Every value of a list flag, or `default` when the flag was not given.
fn list(values: &[String], flag: &str, allow_negative: bool, default: i64) -> Result<Vec<i64>> {
    if values.is_empty() {
        return Ok(vec![default]);
    }
    let mut out = Vec::new();
    for v in values {
        out.extend(parse_range(v, allow_negative).with_context(|| format!("{flag} {v}"))?);
    }
    Ok(out)
}

/// Most values one list may give, and most tests all the lists may make together: far past any
/// real benchmark, where a range like `1-1000000000000` would otherwise fill memory.
const MAX_LIST: usize = 10_000;

/// llama-bench's value lists: comma-separated items, each `first`, `first-last`,
/// `first-last+step` or `first-last*factor`.
fn parse_range(s: &str, allow_negative: bool) -> Result<Vec<i64>> {
    let num = |t: &str| -> Result<i64> {
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            bail!("expected a number, found {t:?}");
        }
        Ok(t.parse()?)
    };
    let mut out = Vec::new();
    for item in s.split(',') {
        let (sign, body) = match item.strip_prefix('-') {
            Some(rest) if allow_negative => (-1, rest),
            _ => (1, item),
        };
        let Some((first, rest)) = body.split_once('-') else {
            out.push(sign * num(body)?);
            continue;
        };
        let first = sign * num(first)?;
        let (last, step, mult) = match rest.find(['+', '*']) {
            Some(i) => (num(&rest[..i])?, num(&rest[i + 1..])?, &rest[i..=i] == "*"),
            None => (num(rest)?, 1, false),
        };
        let mut i = first;
        while i <= last {
            if out.len() == MAX_LIST {
                bail!("{s} lists more than {MAX_LIST} values");
            }
            out.push(i);
            let next = if mult {
                i.checked_mul(step)
            } else {
                i.checked_add(step)
            };
            match next {
                Some(next) if next > i => i = next,
                // Past the largest number: every value up to `last` is in.
                None if i > 0 => break,
                _ => bail!("the range {item} does not increase"),
            }
        }
    }
    Ok(out)
}

/// `PP,TG` of `--pg`.
fn parse_pair(s: &str) -> Result<(usize, usize)> {
    let parsed = s
        .split_once(',')
        .and_then(|(p, n)| Some((p.trim().parse().ok()?, n.trim().parse().ok()?)));
    parsed.with_context(|| format!("--pg takes PP,TG (two token counts), not {s:?}"))
}

/// `-fa` values as llama.cpp numbers them: -1 auto, 0 off, 1 on.
fn flash_attn_modes(values: &[String]) -> Result<Vec<i64>> {
    if values.is_empty() {
        return Ok(vec![FA_AUTO]);
    }
    values
        .iter()
        .flat_map(|v| v.split(','))
        .map(|v| match v {
            "on" | "enabled" | "true" | "1" => Ok(1),
            "off" | "disabled" | "false" | "0" => Ok(0),
            "auto" | "-1" => Ok(FA_AUTO),
            _ => bail!("-fa takes on, off or auto, not {v:?}"),
        })
        .collect()
}

fn model_info(path: &std::path::Path, model: &Model) -> ModelInfo {
    let file = &model.file;
    let size = file.tensors().iter().map(|t| t.n_bytes).sum();
    let n_params = file.tensors().iter().map(|t| t.n_elements).sum();
    let arch = file.architecture().unwrap_or("unknown");
    let size_label = file
        .get_str("general.size_label")
        .map_or_else(|| params_label(n_params), str::to_owned);
    let desc = match file.get_u64("general.file_type").map(ftype_name) {
        Some(ftype) => format!("{arch} {size_label} {ftype}"),
        None => format!("{arch} {size_label}"),
    };
    ModelInfo {
        filename: path.display().to_string(),
        desc,
        size,
        n_params,
    }
}

/// A parameter count to two significant figures: 268,098,176 is "270M".
fn params_label(n: u64) -> String {
    let (div, unit) = match n {
        0..1_000_000 => (1e3, "K"),
        1_000_000..1_000_000_000 => (1e6, "M"),
        _ => (1e9, "B"),
    };
    let v = n as f64 / div;
    let digits = v.abs().log10().floor().max(0.0) as i32;
    let scale = 10f64.powi(digits - 1);
    let rounded = (v / scale).round() * scale;
    if rounded < 10.0 {
        format!("{rounded:.1}{unit}")
    } else {
        format!("{rounded:.0}{unit}")
    }
}

/// llama.cpp's names of `general.file_type` values (`llama_ftype_name`).
fn ftype_name(ftype: u64) -> &'static str {
    match ftype {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        19 => "IQ2_XXS - 2.0625 bpw",
        20 => "IQ2_XS - 2.3125 bpw",
        21 => "Q2_K - Small",
        22 => "IQ3_XS - 3.3 bpw",
        23 => "IQ3_XXS - 3.0625 bpw",
        24 => "IQ1_S - 1.5625 bpw",
        25 => "IQ4_NL - 4.5 bpw",
        26 => "IQ3_S - 3.4375 bpw",
        27 => "IQ3_S mix - 3.66 bpw",
        28 => "IQ2_S - 2.5 bpw",
        29 => "IQ2_M - 2.7 bpw",
        30 => "IQ4_XS - 4.25 bpw",
        31 => "IQ1_M - 1.75 bpw",
        32 => "BF16",
        36 => "TQ1_0 - 1.69 bpw ternary",
        37 => "TQ2_0 - 2.06 bpw ternary",
        38 => "MXFP4 MoE",
        _ => "unknown, may not work",
    }
}

/// The CPU's model name, for llama-bench's `cpu_info` field.
fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, name)| name.trim().to_owned())
        })
        .unwrap_or_default()
}

/// The current UTC time as llama-bench writes it (`%FT%TZ`).
fn rfc3339_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The sample standard deviation, in llama-bench's form (0 for fewer than two samples).
fn stddev(v: &[f64]) -> f64 {
    let n = v.len() as f64;
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    let sq: f64 = v.iter().map(|x| x * x).sum();
    (sq / (n - 1.0) - m * m * n / (n - 1.0)).max(0.0).sqrt()
}

/// The optional columns of the markdown table: those whose flag differs from llama-bench's
/// default.
struct Columns {
    n_batch: bool,
    n_ubatch: bool,
    flash_attn: bool,
}

impl Columns {
    /// (field, heading, width): a negative width is left-aligned, as in llama-bench.
    fn list(&self) -> Vec<(&'static str, &'static str, i32)> {
        let mut cols = vec![
            ("model", "model", -30),
            ("size", "size", 10),
            ("params", "params", 10),
            ("backend", "backend", -10),
            ("n_threads", "threads", 7),
        ];
        if self.n_batch {
            cols.push(("n_batch", "n_batch", 7));
        }
        if self.n_ubatch {
            cols.push(("n_ubatch", "n_ubatch", 8));
        }
        if self.flash_attn {
            cols.push(("flash_attn", "fa", 3));
        }
        cols.push(("test", "test", 15));
        cols.push(("t/s", "t/s", 20));
        cols
    }
}

fn pad(s: &str, width: i32) -> String {
    let w = width.unsigned_abs() as usize;
    if width < 0 {
        format!("{s:<w$}")
    } else {
        format!("{s:>w$}")
    }
}

fn header(format: Format, columns: &Columns) -> String {
    match format {
        Format::Md => {
            let cols = columns.list();
            let mut s = String::from("|");
            for (_, name, w) in &cols {
                let _ = write!(s, " {} |", pad(name, *w));
            }
            s.push_str("\n|");
            for (_, _, w) in &cols {
                let dashes = "-".repeat(w.unsigned_abs() as usize - 1);
                let _ = write!(s, " {dashes}{} |", if *w > 0 { ':' } else { '-' });
            }
            s.push('\n');
            s
        }
        Format::Json => "[\n".into(),
        Format::Jsonl => String::new(),
        Format::Csv => {
            let names: Vec<&str> = TestResult::FIELDS.to_vec();
            format!("{}\n", names.join(","))
        }
    }
}

fn footer(format: Format) -> String {
    match format {
        Format::Md => format!("\nbuild: akunu {}\n", env!("CARGO_PKG_VERSION")),
        Format::Json => "\n]\n".into(),
        Format::Jsonl | Format::Csv => String::new(),
    }
}

impl TestResult<'_> {
    /// llama-bench's field names, in its order, for the fields that mean something here.
    const FIELDS: [&'static str; 24] = [
        "build_commit",
        "build_number",
        "cpu_info",
        "gpu_info",
        "backends",
        "model_filename",
        "model_type",
        "model_size",
        "model_n_params",
        "n_batch",
        "n_ubatch",
        "n_threads",
        "type_k",
        "type_v",
        "n_gpu_layers",
        "flash_attn",
        "n_prompt",
        "n_gen",
        "n_depth",
        "test_time",
        "avg_ns",
        "stddev_ns",
        "avg_ts",
        "stddev_ts",
    ];

    fn backend(&self) -> &'static str {
        if self.gpu_info.is_empty() {
            "CPU"
        } else {
            "CUDA"
        }
    }

    fn values(&self) -> [Json; 24] {
        let i = self.inst;
        let ns: Vec<f64> = self.samples_ns.iter().map(|&t| t as f64).collect();
        let ts = self.samples_ts();
        [
            json!(format!("akunu-{}", env!("CARGO_PKG_VERSION"))),
            json!(0),
            json!(self.cpu_info),
            json!(self.gpu_info),
            json!(self.backend()),
            json!(self.model.filename),
            json!(self.model.desc),
            json!(self.model.size),
            json!(self.model.n_params),
            json!(i.n_batch),
            json!(i.n_ubatch),
            json!(i.n_threads),
            // The CPU backend keeps K and V in f16.
            json!("f16"),
            json!("f16"),
            json!(i.n_gpu_layers),
            json!(i.flash_attn),
            json!(i.n_prompt),
            json!(i.n_gen),
            json!(i.n_depth),
            json!(self.test_time),
            json!(mean(&ns).round() as u64),
            json!(stddev(&ns).round() as u64),
            json!(mean(&ts)),
            json!(stddev(&ts)),
        ]
    }

    /// Tokens per second of each repetition: the depth prefix is not counted.
    fn samples_ts(&self) -> Vec<f64> {
        let n = (self.inst.n_prompt + self.inst.n_gen) as f64;
        self.samples_ns
            .iter()
            .map(|&t| 1e9 * n / t as f64)
            .collect()
    }

    fn test_name(&self) -> String {
        let i = self.inst;
        let mut name = match (i.n_prompt, i.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, n) => format!("tg{n}"),
            (p, n) => format!("pp{p}+tg{n}"),
        };
        if i.n_depth > 0 {
            let _ = write!(name, " @ d{}", i.n_depth);
        }
        name
    }

    fn format(&self, format: Format, columns: &Columns, first: bool) -> String {
        let fields = Self::FIELDS.iter().zip(self.values());
        let samples = |sep: &str| {
            let ns: Vec<String> = self.samples_ns.iter().map(u64::to_string).collect();
            let ts: Vec<String> = self
                .samples_ts()
                .iter()
                .map(|t| json!(t).to_string())
                .collect();
            format!(
                "\"samples_ns\": [ {} ]{sep}\"samples_ts\": [ {} ]",
                ns.join(", "),
                ts.join(", ")
            )
        };
        match format {
            Format::Md => {
                let mut s = String::from("|");
                for (field, _, w) in columns.list() {
                    let value = match field {
                        "model" => self.model.desc.clone(),
                        "size" => human_size(self.model.size),
                        "params" => human_params(self.model.n_params),
                        "backend" => self.backend().into(),
                        "n_threads" => self.inst.n_threads.to_string(),
                        "n_batch" => self.inst.n_batch.to_string(),
                        "n_ubatch" => self.inst.n_ubatch.to_string(),
                        "flash_attn" => self.inst.flash_attn.to_string(),
                        "test" => self.test_name(),
                        _ => {
                            let ts = self.samples_ts();
                            format!("{:.2} ± {:.2}", mean(&ts), stddev(&ts))
                        }
                    };
                    let _ = write!(s, " {} |", pad(&value, w));
                }
                s.push('\n');
                s
            }
            Format::Json => {
                let mut s = String::from(if first { "  {\n" } else { ",\n  {\n" });
                for (k, v) in fields {
                    let _ = writeln!(s, "    \"{k}\": {v},");
                }
                let _ = write!(s, "    {}\n  }}", samples(",\n    "));
                s
            }
            Format::Jsonl => {
                let parts: Vec<String> = fields.map(|(k, v)| format!("\"{k}\": {v}")).collect();
                format!("{{{}, {}}}\n", parts.join(", "), samples(","))
            }
            Format::Csv => {
                let cells: Vec<String> = fields
                    .map(|(_, v)| {
                        let text = match v {
                            Json::String(s) => s,
                            other => other.to_string(),
                        };
                        format!("\"{}\"", text.replace('"', "\"\""))
                    })
                    .collect();
                format!("{}\n", cells.join(","))
            }
        }
    }
}

fn human_size(bytes: u64) -> String {
    let mib = bytes as f64 / (1024.0 * 1024.0);
    if bytes < 1 << 30 {
        format!("{mib:.2} MiB")
    } else {
        format!("{:.2} GiB", mib / 1024.0)
    }
}

fn human_params(n: u64) -> String {
    if n < 1_000_000_000 {
        format!("{:.2} M", n as f64 / 1e6)
    } else {
        format!("{:.2} B", n as f64 / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_like_llama_bench() {
        assert_eq!(parse_range("512", false).unwrap(), [512]);
        assert_eq!(parse_range("1,2,4", false).unwrap(), [1, 2, 4]);
        assert_eq!(parse_range("1-4", false).unwrap(), [1, 2, 3, 4]);
        assert_eq!(parse_range("0-8+4", false).unwrap(), [0, 4, 8]);
        assert_eq!(parse_range("16-128*2", false).unwrap(), [16, 32, 64, 128]);
        assert_eq!(parse_range("-1,99", true).unwrap(), [-1, 99]);
        assert!(parse_range("-1", false).is_err());
        assert!(parse_range("1-4*1", false).is_err());
        assert!(parse_range("a", false).is_err());
        assert!(parse_range("1,", false).is_err());
    }

    #[test]
    fn a_list_of_more_than_max_list_values_is_refused() {
        assert_eq!(parse_range("1-10000", false).unwrap().len(), MAX_LIST);
        for s in ["1-10001", "1-1000000000000", "0,1-10000"] {
            let e = parse_range(s, false).unwrap_err().to_string();
            assert!(e.contains("more than 10000 values"), "{s}: {e}");
        }
    }

    #[test]
    fn ranges_end_at_the_largest_number() {
        let max = i64::MAX;
        assert_eq!(
            parse_range(&format!("{}-{max}", max - 1), false).unwrap(),
            [max - 1, max]
        );
        assert_eq!(
            parse_range(&format!("{}-{max}+2", max - 1), false).unwrap(),
            [max - 1]
        );
        let doubling = parse_range(&format!("1-{max}*2"), false).unwrap();
        assert_eq!((doubling.len(), doubling.last()), (63, Some(&(1 << 62))));
    }

    #[test]
    fn labels_and_stats() {
        assert_eq!(params_label(268_098_176), "270M");
        assert_eq!(params_label(8_030_261_248), "8.0B");
        assert_eq!(params_label(494_032_768), "490M");
        assert_eq!(human_size(246_587_904), "235.16 MiB");
        assert_eq!(human_params(268_098_176), "268.10 M");
        assert_eq!(stddev(&[1.0]), 0.0);
        assert!((stddev(&[2.0, 4.0]) - 2f64.sqrt()).abs() < 1e-12);
        assert_eq!(parse_pair("512,128").unwrap(), (512, 128));
        assert!(parse_pair("512").is_err());
        assert_eq!(flash_attn_modes(&["on,off".into()]).unwrap(), [1, 0]);
    }

    #[test]
    fn timestamps_are_rfc3339() {
        let t = rfc3339_now();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.starts_with("20") && t.ends_with('Z') && t.as_bytes()[10] == b'T');
    }

    #[test]
    fn markdown_header_matches_llama_bench() {
        let cols = Columns {
            n_batch: false,
            n_ubatch: false,
            flash_attn: false,
        };
        assert_eq!(
            header(Format::Md, &cols),
            "| model                          |       size |     params | backend    | threads \
             |            test |                  t/s |\n| ------------------------------ | \
             ---------: | ---------: | ---------- | ------: | --------------: | \
             -------------------: |\n"
        );
    }
}
