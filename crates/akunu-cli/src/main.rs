//! The `akunu` command-line tool.

mod bench;
mod chat;
mod device;
mod engine;
mod generate;
mod inspect;
mod perplexity;
mod profile;
mod serve;
mod tokenize;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "akunu", version, about = "Fast LLM inference on GPUs and CPUs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what a model file holds: architecture, hyperparameters, tokenizer, tensors.
    Inspect {
        #[command(flatten)]
        model: ModelArg,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
        /// List every metadata key.
        #[arg(long)]
        all_metadata: bool,
        /// Leave out the per-tensor table.
        #[arg(long)]
        no_tensors: bool,
    },
    /// Fetch a model into the cache (resumable, verified) and print its path.
    ///
    /// SPEC is a Hugging Face file (`owner/repo/file.gguf`, optionally `@revision`, or
    /// `hf://owner/repo/file.gguf`) or an http(s) URL. With no SPEC, the default model
    /// (Gemma 3 270M Q4_K_M) is fetched. The cache is `$AKUNU_CACHE`, else
    /// `$XDG_CACHE_HOME/akunu`, else `~/.cache/akunu`.
    Pull {
        spec: Option<String>,
        /// Expected sha256 of a URL or Hugging Face download.
        #[arg(long, value_name = "HEX")]
        sha256: Option<String>,
        /// Re-hash a cached copy before trusting it.
        #[arg(long)]
        verify: bool,
        /// No progress output.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Text to token ids, like llama.cpp's `llama-tokenize` (special tokens are parsed).
    ///
    /// MODEL is a GGUF file (a full model or vocabulary only) or a Hugging Face
    /// `tokenizer.json` or directory holding one. Prints `id -> 'piece'` lines, or with --ids a
    /// Python-style list.
    Tokenize {
        #[command(flatten)]
        model: ModelArg,
        /// The text (may start with '-').
        #[arg(short, long, allow_hyphen_values = true, conflicts_with_all = ["file", "stdin"])]
        prompt: Option<String>,
        /// Read the text from a file, byte for byte.
        #[arg(short, long, value_name = "FILE", conflicts_with = "stdin")]
        file: Option<PathBuf>,
        /// Read the text from standard input.
        #[arg(long)]
        stdin: bool,
        /// Print only the ids, as a list like [1, 2, 3].
        #[arg(long)]
        ids: bool,
        /// Do not add the BOS token even if the model normally does.
        #[arg(long)]
        no_bos: bool,
        /// Treat special-token text (`<|im_start|>`) as ordinary text.
        #[arg(long)]
        no_parse_special: bool,
        /// Also print the number of tokens.
        #[arg(long)]
        show_count: bool,
        /// Take the text as it is: no processing of escapes (\\n, \\t, \\xHH, ...), which
        /// are processed by default, as llama-tokenize does.
        #[arg(long)]
        no_escape: bool,
    },
    /// Answer a prompt: the prompt becomes a user message in the model's chat template, the
    /// reply streams to stdout and statistics go to stderr.
    Run {
        #[command(flatten)]
        model: ModelArg,
        #[command(flatten)]
        prompt: PromptArg,
        /// A system message ahead of the prompt.
        #[arg(long, value_name = "TEXT")]
        system: Option<String>,
        #[command(flatten)]
        engine: engine::EngineArgs,
        #[command(flatten)]
        gen: engine::GenArgs,
        /// No statistics on stderr.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Continue raw text (no chat template): the continuation streams to stdout.
    Complete {
        #[command(flatten)]
        model: ModelArg,
        #[command(flatten)]
        prompt: PromptArg,
        #[command(flatten)]
        engine: engine::EngineArgs,
        #[command(flatten)]
        gen: engine::GenArgs,
        /// No statistics on stderr.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Talk with the model: multi-turn, the KV cache is reused between turns.
    Chat {
        #[command(flatten)]
        model: ModelArg,
        /// A system message for the conversation.
        #[arg(long, value_name = "TEXT")]
        system: Option<String>,
        #[command(flatten)]
        engine: engine::EngineArgs,
        #[command(flatten)]
        gen: engine::GenArgs,
    },
    /// Perplexity of a text file, computed as llama-perplexity does (same chunking, same output).
    Perplexity(perplexity::PerplexityArgs),
    /// Prompt-processing and generation speed, as llama-bench measures and prints it.
    Bench(bench::BenchArgs),
    /// Serve the model over an OpenAI-compatible HTTP API, batching concurrent requests.
    Serve(serve::ServeArgs),
    /// Time every op of the plan over a prompt pass and decode steps, summed over layers.
    Profile {
        #[command(flatten)]
        model: ModelArg,
        /// Prompt tokens (random ids) for the prompt pass; 0 skips it.
        #[arg(short = 'p', long = "n-prompt", default_value_t = 128)]
        n_prompt: usize,
        /// Decode steps to time; 0 skips them.
        #[arg(short = 'n', long = "n-gen", default_value_t = 32)]
        n_gen: usize,
        #[command(flatten)]
        engine: engine::EngineArgs,
    },
}

/// The prompt of a generation command.
#[derive(Args)]
struct PromptArg {
    /// The prompt text.
    #[arg(
        short = 'p',
        long = "prompt",
        allow_hyphen_values = true,
        conflicts_with = "file"
    )]
    prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: Option<PathBuf>,
}

impl PromptArg {
    fn text(&self) -> Result<String> {
        match (&self.prompt, &self.file) {
            (Some(p), _) => Ok(p.clone()),
            (_, Some(f)) => std::fs::read_to_string(f)
                .with_context(|| format!("reading the prompt from {}", f.display())),
            _ => bail!("give the prompt with -p TEXT or -f FILE"),
        }
    }
}

/// The model a command works on.
#[derive(Args)]
pub(crate) struct ModelArg {
    /// Model file, Hugging Face file (`owner/repo/file.gguf`) or URL; the default model is
    /// fetched on first use when none is given.
    #[arg(value_name = "MODEL")]
    positional: Option<String>,
    #[arg(
        short = 'm',
        long = "model",
        value_name = "MODEL",
        conflicts_with = "positional"
    )]
    flag: Option<String>,
}

impl ModelArg {
    pub(crate) fn resolve(&self) -> Result<PathBuf> {
        if let Some(local) = self.spec().map(std::path::Path::new).filter(|p| p.is_dir()) {
            return Ok(local.to_path_buf());
        }
        Ok(akunu_hub::resolve(
            self.spec(),
            &akunu_hub::FetchOptions::default(),
        )?)
    }
}

impl ModelArg {
    fn spec(&self) -> Option<&str> {
        self.flag.as_deref().or(self.positional.as_deref())
    }
}

fn pull(spec: Option<&str>, sha256: Option<String>, verify: bool, quiet: bool) -> Result<()> {
    if sha256.is_some() {
        if let Some(spec) = spec {
            if std::path::Path::new(spec).exists() {
                bail!("--sha256 applies to downloads; {spec} is a local file");
            }
        } else {
            bail!("--sha256 applies to downloads; the default model carries its own digest");
        }
    }
    let opts = akunu_hub::FetchOptions {
        sha256,
        verify_cached: verify,
        quiet,
        ..Default::default()
    };
    let path = akunu_hub::resolve(spec, &opts)?;
    println!("{}", path.display());
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Inspect {
            model,
            json,
            all_metadata,
            no_tensors,
        } => inspect::run(
            &model.resolve()?,
            &inspect::InspectOptions {
                json,
                all_metadata,
                no_tensors,
            },
        ),
        Command::Pull {
            spec,
            sha256,
            verify,
            quiet,
        } => pull(spec.as_deref(), sha256, verify, quiet),
        Command::Tokenize {
            model,
            prompt,
            file,
            stdin,
            ids,
            no_bos,
            no_parse_special,
            show_count,
            no_escape,
        } => {
            let input = match (&prompt, &file, stdin) {
                (Some(p), _, _) => tokenize::Input::Prompt(p),
                (_, Some(f), _) => tokenize::Input::File(f),
                (_, _, true) => tokenize::Input::Stdin,
                _ => bail!("give the text with -p TEXT, -f FILE or --stdin"),
            };
            let tok = tokenize::load(&model.resolve()?)?;
            let opts = tokenize::TokenizeOptions {
                ids,
                no_bos,
                no_parse_special,
                show_count,
                escape: !no_escape,
            };
            tokenize::run(&tok, input, &opts)
        }
        Command::Run {
            model,
            prompt,
            system,
            engine,
            gen,
            quiet,
        } => generate::run(
            &model.resolve()?,
            &prompt.text()?,
            generate::Mode::Chat { system },
            &engine,
            &gen,
            quiet,
        ),
        Command::Chat {
            model,
            system,
            engine,
            gen,
        } => chat::run(&model.resolve()?, system, &engine, &gen),
        Command::Perplexity(args) => perplexity::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Serve(args) => serve::run(args),
        Command::Profile {
            model,
            n_prompt,
            n_gen,
            engine,
        } => profile::run(&model.resolve()?, n_prompt, n_gen, &engine),
        Command::Complete {
            model,
            prompt,
            engine,
            gen,
            quiet,
        } => generate::run(
            &model.resolve()?,
            &prompt.text()?,
            generate::Mode::Raw,
            &engine,
            &gen,
            quiet,
        ),
    }
}

/// llama.cpp spells some long options with one dash (`-ngl 99`); clap reads those as bundles
/// of short flags, so they are rewritten to their long names first.
fn llama_style_args() -> Vec<std::ffi::OsString> {
    const ALIASES: &[(&str, &str)] = &[
        ("-ngl", "--n-gpu-layers"),
        ("-fa", "--flash-attn"),
        ("-ub", "--ubatch-size"),
        ("-pg", "--pg"),
        ("-oe", "--output-err"),
        ("-np", "--parallel"),
    ];
    std::env::args_os()
        .map(
            |a| match ALIASES.iter().find(|(short, _)| a.to_str() == Some(short)) {
                Some((_, long)) => long.into(),
                None => a,
            },
        )
        .collect()
}

fn main() -> ExitCode {
    match run(Cli::parse_from(llama_style_args())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
