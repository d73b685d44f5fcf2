//! `akunu serve`: the OpenAI-compatible server on the CPU engine, with llama-server's flag
//! names where they exist.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use akunu_server::{AppState, Loaded, Registry, ServerConfig};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};

use crate::engine::{self, EngineArgs, SamplingArgs};
use crate::ModelArg;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Address to listen on (0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences decoded together (KV-cache slots); each holds up to -c tokens.
    #[arg(long = "parallel", default_value_t = 4)]
    parallel: usize,
    /// Requests that may wait for a free slot; past this the server answers 503.
    #[arg(long = "max-queue", default_value_t = 64)]
    max_queue: usize,
    /// Require `Authorization: Bearer KEY` on the API routes.
    #[arg(long = "api-key", value_name = "KEY", env = "AKUNU_API_KEY")]
    api_key: Option<String>,
    /// The model's id in the API (default: the file name without .gguf).
    #[arg(short = 'a', long = "alias", value_name = "ID")]
    alias: Option<String>,
    /// Token limit of a request that sets none (-1 = until the model stops or the context is
    /// full).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    n_predict: i64,
    /// Longest a generation request may run, in seconds.
    #[arg(long = "timeout", default_value_t = 600)]
    timeout: u64,
    /// Largest request body, in bytes.
    #[arg(long = "max-body", default_value_t = 4 << 20)]
    max_body: usize,
    /// Seconds running requests get to finish after Ctrl-C or SIGTERM.
    #[arg(long = "shutdown-grace", default_value_t = 10.0)]
    shutdown_grace: f64,
    /// Turn off POST /v1/models/load and /v1/models/unload.
    #[arg(long = "no-model-management")]
    no_model_management: bool,
    /// Request log format on stderr.
    #[arg(long = "log-format", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

/// Longest `--timeout` and `--shutdown-grace`: a year.
const MAX_SECONDS: u64 = 365 * 24 * 3600;

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

pub fn run(args: ServeArgs) -> Result<()> {
    init_logging(args.log_format);
    if args.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    if args.n_predict < -1 {
        bail!(
            "-n must be -1 (no limit) or a token count, not {}",
            args.n_predict
        );
    }
    if !(1..=MAX_SECONDS).contains(&args.timeout) {
        bail!(
            "--timeout must be from 1 to {MAX_SECONDS} seconds (a year), not {}",
            args.timeout
        );
    }
    if !(0.0..=MAX_SECONDS as f64).contains(&args.shutdown_grace) {
        bail!(
            "--shutdown-grace must be from 0 to {MAX_SECONDS} seconds (a year), not {}",
            args.shutdown_grace
        );
    }
    let path = args.model.resolve()?;
    let config = ServerConfig {
        host: args.host.clone(),
        port: args.port,
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        max_queue: args.max_queue,
        max_body: args.max_body,
        timeout: args.timeout,
        default_max_tokens: usize::try_from(args.n_predict).ok(),
        sampling: args.sampling.params()?,
        shutdown_grace: Duration::from_secs_f64(args.shutdown_grace),
        model_management: !args.no_model_management,
    };
    let engine_args = args.engine.clone();
    let parallel = args.parallel;
    let registry = Registry::new(Arc::new(move |p: &Path| load(p, &engine_args, parallel)));
    let model = registry
        .load(&path, args.alias.clone())
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    tracing::info!(
        id = model.id,
        backend = model.engine.describe,
        slots = model.engine.n_slots,
        ctx = model.engine.n_ctx,
        "model ready"
    );
    let state = AppState::new(config, registry);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(akunu_server::serve(
        state,
        Arc::new(tokio::sync::Notify::new()),
    ))
}

fn load(path: &Path, args: &EngineArgs, parallel: usize) -> Result<Loaded> {
    if args.batch_size < parallel {
        bail!(
            "-b ({}) must be at least --parallel ({parallel})",
            args.batch_size
        );
    }
    let loaded = engine::load(path, args, parallel)?;
    let engine = akunu_server::engine::spawn(loaded.model.clone(), loaded.session)?;
    Ok(Loaded {
        model: loaded.model,
        template: loaded.template.map_err(|e| e.to_string()),
        engine,
    })
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("AKUNU_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
