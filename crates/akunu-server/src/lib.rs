//! `akunu serve`: an OpenAI-compatible HTTP server over the engine.
//!
//! Plan: axum on a tokio runtime handles HTTP; each loaded model has one engine thread (see
//! [`engine`]) that batches every request's sequence into shared forward passes (continuous
//! batching), so the async workers never run the model. A request is parsed and checked
//! completely (fields, model, chat template, context) before it is queued; past the queue's
//! bound it gets a 503 with `Retry-After`. Responses stream as server-sent events or return
//! whole; a client that disconnects drops its event channel, which cancels its sequence at the
//! next pass. Shutdown stops accepting, lets running requests finish for a grace period, then
//! cancels what is left.

pub mod engine;
pub mod error;
pub mod metrics;
pub mod registry;
pub mod request;
mod routes;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use akunu_core::sampling::SamplerParams;
use anyhow::Context;
use tokio::sync::Notify;

pub use registry::{Loaded, LoadedModel, Loader, Registry};

/// Server settings (the `serve` flags).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// Bearer token required on the API routes; `None` turns authentication off.
    pub api_key: Option<String>,
    /// Requests that may wait for a slot, per model; more get a 503.
    pub max_queue: usize,
    /// Largest request body accepted, in bytes.
    pub max_body: usize,
    /// Longest a generation request may take, in seconds.
    pub timeout: u64,
    /// Token limit of a request that gives none; `None` runs to the end of generation or of
    /// the context.
    pub default_max_tokens: Option<usize>,
    /// Sampling settings of a request that leaves them out.
    pub sampling: SamplerParams,
    /// How long running requests may take to finish after a shutdown signal.
    pub shutdown_grace: Duration,
    /// Allow `POST /v1/models/load` and `/v1/models/unload`.
    pub model_management: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            max_queue: 64,
            max_body: 4 << 20,
            timeout: 600,
            default_max_tokens: None,
            sampling: SamplerParams::default(),
            shutdown_grace: Duration::from_secs(10),
            model_management: true,
        }
    }
}

/// What every handler shares.
pub struct AppState {
    pub config: ServerConfig,
    pub registry: Registry,
    pub metrics: metrics::Metrics,
    /// Set once a shutdown signal arrived: new work is refused.
    pub draining: AtomicBool,
    next_id: AtomicU64,
}

impl AppState {
    pub fn new(config: ServerConfig, registry: Registry) -> Arc<Self> {
        Arc::new(Self {
            config,
            registry,
            metrics: metrics::Metrics::default(),
            draining: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
        })
    }
}

/// The router with every route, for [`serve`] and for tests that bind their own listener.
pub fn router(state: Arc<AppState>) -> axum::Router {
    routes::router(state)
}

/// Serves until `shutdown` is notified (or Ctrl-C / SIGTERM arrives), then drains.
pub async fn serve(state: Arc<AppState>, shutdown: Arc<Notify>) -> anyhow::Result<()> {
    let addr: SocketAddr = format!("{}:{}", state.config.host, state.config.port)
        .parse()
        .with_context(|| {
            format!(
                "bad listen address {}:{}",
                state.config.host, state.config.port
            )
        })?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    serve_on(listener, state, shutdown).await
}

/// [`serve`] on a listener the caller bound (port 0 in tests).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: Arc<Notify>,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "listening");
    let app = router(state.clone());
    let drain_state = state.clone();
    let signal = async move {
        tokio::select! {
            _ = shutdown.notified() => {}
            _ = ctrl_c_or_term() => {}
        }
        drain(drain_state).await;
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(signal)
        .await
        .context("serving")?;
    let stopper = state.clone();
    tokio::task::spawn_blocking(move || stopper.registry.stop_all("the server is shutting down"))
        .await
        .context("stopping the engines")?;
    tracing::info!("stopped");
    Ok(())
}

/// Refuses new work, gives running requests the grace period, then cancels the rest.
async fn drain(state: Arc<AppState>) {
    use std::sync::atomic::Ordering;
    state.draining.store(true, Ordering::SeqCst);
    let grace = state.config.shutdown_grace;
    tracing::info!(
        grace_s = grace.as_secs_f64(),
        "shutting down: finishing running requests"
    );
    let deadline = tokio::time::Instant::now() + grace;
    loop {
        let busy: usize = state
            .registry
            .list()
            .iter()
            .map(|m| m.engine.stats.in_flight.load(Ordering::Relaxed))
            .sum();
        if busy == 0 || tokio::time::Instant::now() >= deadline {
            if busy > 0 {
                tracing::warn!(busy, "cancelling requests still running");
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stopper = state.clone();
    let _ = tokio::task::spawn_blocking(move || {
        stopper.registry.stop_all("the server is shutting down")
    })
    .await;
}

async fn ctrl_c_or_term() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
