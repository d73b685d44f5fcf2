//! `akunu perplexity`: the perplexity of a text file, computed as llama.cpp's `llama-perplexity`
//! computes it so that the two tools' numbers compare directly.
//!
//! The text is tokenized once, with BOS when the model adds one and special-token text read as
//! plain text. It is cut into `min(--chunks, n_tokens / n_ctx)` chunks of `n_ctx` tokens; each
//! chunk is read from an empty cache with its first token replaced by BOS (when the model adds
//! one), and only the second half is scored (positions `n_ctx / 2` to `n_ctx - 2`, each
//! predicting the next token), so every scored token has at least half a context behind it.
//! The log-softmax is llama.cpp's: maximum and differences in f32, the sum of exponentials in f64.
//! The running perplexity after each chunk goes to stdout as `[1]x.xxxx,[2]...`, then
//! `Final estimate: PPL = X +/- Y`, with llama.cpp's uncertainty: the standard error of the mean
//! negative log-likelihood, times the perplexity.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use akunu_core::session::Logits;
use akunu_tokenizer::EncodeOptions;
use anyhow::{bail, Context, Result};
use clap::Args;

use crate::device::Device;
use crate::engine::{self, EngineArgs};
use crate::ModelArg;

/// Upper bound on the logits held at once: rows of `n_vocab` floats are fetched in blocks of
/// this many bytes (64 rows on a 262,144-token vocabulary).
const LOGITS_BYTES: usize = 64 << 20;

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// The text to score.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,
    /// Tokens per chunk (llama-perplexity's default).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx_size: usize,
    /// Most tokens evaluated in one pass.
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    pub batch_size: usize,
    /// Threads (default: the number of physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Score at most this many chunks (-1 = every whole chunk of the text).
    #[arg(long = "chunks", default_value_t = -1, allow_negative_numbers = true)]
    pub chunks: i64,
    /// Layers to put on the GPU: 0 runs on the CPU; any other value puts the whole model on
    /// the GPU (the default when one can be used).
    #[arg(long = "n-gpu-layers", value_name = "N", allow_negative_numbers = true)]
    pub n_gpu_layers: Option<i64>,
    /// Where to run: auto (the GPU when one can be used), cpu or cuda. With cuda, a GPU that
    /// cannot be used is an error rather than a run on the CPU.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    /// on|off|auto. Accepted for compatibility; each backend has one attention path (flash
    /// attention on the GPU).
    #[arg(long = "flash-attn", value_name = "MODE")]
    pub flash_attn: Option<String>,
}

pub fn run(args: &PerplexityArgs) -> Result<()> {
    let n_ctx = args.ctx_size;
    // A chunk scores n_ctx - 1 - n_ctx / 2 tokens: at least one needs n_ctx >= 3.
    if n_ctx < 3 {
        bail!("-c must be at least 3 (a chunk scores the tokens of its second half)");
    }
    let max_chunks = match args.chunks {
        -1 => usize::MAX,
        n if n > 0 => n as usize,
        n => bail!("--chunks must be -1 (all) or a positive count, not {n}"),
    };
    // Read the text before loading the model, so a bad path fails at once.
    let text = read_text(&args.file)?;
    let path = args.model.resolve()?;
    let engine_args = EngineArgs {
        ctx_size: n_ctx,
        threads: args.threads,
        batch_size: args.batch_size,
        n_gpu_layers: args.n_gpu_layers,
        device: args.device,
    };
    let threads = args.threads.unwrap_or_else(engine::default_threads);
    let loaded = engine::load(&path, &engine_args, 1)?;
    let model = &loaded.model;
    let mut session = loaded.session;
    let tok = &model.tokenizer;
    if tok.add_eos() {
        bail!("the model's tokenizer appends EOS to every text, which perplexity does not support");
    }
    if n_ctx > model.config.n_ctx_train {
        eprintln!(
            "perplexity: warning: model was trained on only {} context tokens ({n_ctx} specified)",
            model.config.n_ctx_train
        );
    }

    eprintln!("perplexity: tokenizing the input ..");
    let t = Instant::now();
    let tokens = tok.encode(
        &text,
        EncodeOptions {
            add_special: true,
            parse_special: false,
        },
    );
    eprintln!(
        "perplexity: tokenization took {:.3} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    if tokens.len() < 2 * n_ctx {
        bail!(
            "you need at least {} tokens to evaluate perplexity with a context of {n_ctx}; {} \
             tokenizes to only {} tokens",
            2 * n_ctx,
            args.file.display(),
            tokens.len()
        );
    }

    let n_chunk = (tokens.len() / n_ctx).min(max_chunks);
    let n_vocab = model.config.n_vocab;
    let bos = tok.special_tokens().bos.filter(|_| tok.add_bos());
    let first = n_ctx / 2;
    let max_rows = (LOGITS_BYTES / (n_vocab * 4)).max(1);
    eprintln!(
        "perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={}, \
         n_seq=1",
        args.batch_size.min(n_ctx)
    );

    let mut nll = 0.0f64;
    let mut nll2 = 0.0f64;
    let mut count = 0usize;
    let mut logits: Vec<f32> = Vec::with_capacity(max_rows * n_vocab);
    let mut out = std::io::stdout().lock();
    let t_all = Instant::now();
    for i in 0..n_chunk {
        let t_chunk = Instant::now();
        let mut chunk = tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        session.clear(0)?;
        session.eval(0, &chunk[..first], Logits::None)?;
        // The last token is only ever a target: no pass needs it as an input.
        let inputs = &chunk[first..n_ctx - 1];
        for (b, block) in inputs.chunks(max_rows).enumerate() {
            logits.clear();
            session.eval_all(0, block, max_rows, |_, row| logits.extend_from_slice(row))?;
            let at = first + 1 + b * max_rows;
            let targets = &chunk[at..at + block.len()];
            for v in token_nlls(&logits, n_vocab, targets, threads) {
                nll += v;
                nll2 += v * v;
            }
            count += block.len();
        }
        if i == 0 {
            let secs = t_chunk.elapsed().as_secs_f64();
            let mut total = (secs * n_chunk as f64) as u64;
            let mut eta = String::new();
            if total >= 3600 {
                eta = format!("{} hours ", total / 3600);
                total %= 3600;
            }
            eprintln!(
                "perplexity: {secs:.2} seconds per pass - ETA {eta}{:.2} minutes",
                total as f64 / 60.0
            );
        }
        write!(out, "[{}]{:.4},", i + 1, (nll / count as f64).exp())?;
        out.flush()?;
    }
    writeln!(out)?;

    let elapsed = t_all.elapsed().as_secs_f64();
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    if var > 0.0 {
        let err = (var / (count - 1) as f64).sqrt();
        writeln!(out, "Final estimate: PPL = {ppl:.4} +/- {:.5}", err * ppl)?;
    } else {
        eprintln!("Unexpected negative standard deviation of log(prob)");
    }
    eprintln!(
        "\nperplexity: load time = {:.2} ms\nperplexity: eval time = {:.2} ms / {} tokens \
         ({:.2} tokens per second), {count} scored",
        loaded.load_time.as_secs_f64() * 1e3,
        elapsed * 1e3,
        n_chunk * (n_ctx - 1),
        (n_chunk * (n_ctx - 1)) as f64 / elapsed
    );
    Ok(())
}

/// The text as llama.cpp's `-f` reads it: the whole file, less one trailing newline.
fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut text =
        String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))?;
    if text.ends_with('\n') {
        text.pop();
    }
    Ok(text)
}

/// The negative log-likelihood of each target under its row of `logits`, rows spread over
/// `threads` threads; the values come back in order, so sums over them do not depend on the
/// thread count.
fn token_nlls(logits: &[f32], n_vocab: usize, targets: &[u32], threads: usize) -> Vec<f64> {
    let rows: Vec<&[f32]> = logits.chunks_exact(n_vocab).collect();
    let mut nlls = vec![0.0; targets.len()];
    let per = targets.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for ((out, rows), targets) in nlls
            .chunks_mut(per)
            .zip(rows.chunks(per))
            .zip(targets.chunks(per))
        {
            s.spawn(move || {
                for ((o, row), &t) in out.iter_mut().zip(rows).zip(targets) {
                    *o = -log_softmax(row, t as usize);
                }
            });
        }
    });
    nlls
}

/// log p(tok) as llama.cpp's perplexity tool computes it: the maximum and the differences in
/// f32, the sum of `expf` terms in f64.
fn log_softmax(row: &[f32], tok: usize) -> f64 {
    let max = row.iter().copied().fold(row[0], f32::max);
    let sum: f64 = row.iter().map(|&l| f64::from((l - max).exp())).sum();
    f64::from(row[tok] - max) - sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_matches_the_definition() {
        let row = [1.0f32, 2.0, 3.0, -4.0];
        let z: f64 = row.iter().map(|&l| f64::from(l).exp()).sum();
        for (i, &l) in row.iter().enumerate() {
            let want = f64::from(l) - z.ln();
            assert!((log_softmax(&row, i) - want).abs() < 1e-6);
        }
    }

    #[test]
    fn nlls_do_not_depend_on_threads() {
        let n_vocab = 7;
        let logits: Vec<f32> = (0..n_vocab * 10)
            .map(|i| ((i * 37) % 11) as f32 * 0.3)
            .collect();
        let targets: Vec<u32> = (0..10).map(|i| (i * 3 % n_vocab) as u32).collect();
        let one = token_nlls(&logits, n_vocab, &targets, 1);
        assert_eq!(one.len(), 10);
        for threads in [2, 3, 16] {
            assert_eq!(token_nlls(&logits, n_vocab, &targets, threads), one);
        }
    }
}
