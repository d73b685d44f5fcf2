//! The HTTP routes and what they answer.
//!
//! Generation requests (`/v1/chat/completions`, `/v1/completions`) go through one path:
//! read the body under the size limit, parse and check it, find the model, build the prompt
//! tokens, check the context, take a queue place, then stream the sequence's events as SSE
//! chunks or collect them into one response. Everything that can be refused is refused before
//! the engine sees the request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use akunu_core::batch::{GeneratedToken, SeqEvent, SeqRequest, SeqSummary};
use akunu_core::generate::{GenerateParams, StopReason};
use akunu_tokenizer::{DecodeOptions, EncodeOptions, Tokenizer};
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::registry::LoadedModel;
use crate::request::{self, bool_field, string_field, Endpoint, GenRequest, Input};
use crate::AppState;

const PAGE: &str = include_str!("page.html");

type St = State<Arc<AppState>>;

pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/models/load", post(load))
        .route("/v1/models/unload", post(unload))
        .route("/v1/tokenize", post(tokenize))
        .route("/tokenize", post(tokenize))
        .route("/v1/detokenize", post(detokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .route("/", get(page))
        .route("/health", get(health))
        .merge(api)
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(state.clone(), log))
        .with_state(state)
}

async fn auth(State(st): St, request: Request, next: Next) -> Response {
    if let Some(key) = &st.config.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Counts every request by route and status and logs it.
async fn log(State(st): St, request: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let route = route_label(&path);
    let response = next.run(request).await;
    let status = response.status().as_u16();
    st.metrics.request(route, status);
    tracing::info!(
        %method,
        path,
        status,
        ms = start.elapsed().as_secs_f64() * 1e3,
        "request"
    );
    response
}

/// The metrics label of a path: a route of ours, or "other" (so that clients cannot grow
/// the label set).
fn route_label(path: &str) -> &'static str {
    const ROUTES: [&str; 15] = [
        "/",
        "/health",
        "/metrics",
        "/v1/chat/completions",
        "/chat/completions",
        "/v1/completions",
        "/completions",
        "/v1/models",
        "/v1/models/load",
        "/v1/models/unload",
        "/v1/tokenize",
        "/tokenize",
        "/v1/detokenize",
        "/detokenize",
        "/v1/models/{id}",
    ];
    ROUTES
        .iter()
        .find(|r| **r == path)
        .copied()
        .unwrap_or(if path.starts_with("/v1/models/") {
            "/v1/models/{id}"
        } else {
            "other"
        })
}

async fn page() -> Html<&'static str> {
    Html(PAGE)
}

async fn health(State(st): St) -> Response {
    if st.draining.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "shutting down"})),
        )
            .into_response();
    }
    if st.registry.list().is_empty() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "no model loaded"})),
        )
            .into_response();
    }
    Json(json!({"status": "ok"})).into_response()
}

async fn metrics(State(st): St) -> Response {
    let text = st.metrics.render(&st.registry.list());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

fn model_json(m: &LoadedModel) -> Value {
    let c = &m.model.config;
    json!({
        "id": m.id,
        "object": "model",
        "created": m.created,
        "owned_by": "akunu",
        "meta": {
            "path": m.path.display().to_string(),
            "architecture": m.model.arch.family.name(),
            "n_vocab": c.n_vocab,
            "n_ctx": m.engine.n_ctx,
            "n_ctx_train": c.n_ctx_train,
            "n_slots": m.engine.n_slots,
            "backend": m.engine.describe,
            "chat_template": m.template.is_ok(),
        }
    })
}

async fn models(State(st): St) -> Json<Value> {
    let data: Vec<Value> = st.registry.list().iter().map(|m| model_json(m)).collect();
    Json(json!({"object": "list", "data": data}))
}

async fn model(State(st): St, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let m = st.registry.resolve(Some(&id))?;
    Ok(Json(model_json(&m)))
}

/// Longest a client may take to send its request body.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

async fn read_json(body: Body, limit: usize) -> Result<Value, ApiError> {
    let bytes = tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| ApiError::body_timeout(BODY_TIMEOUT.as_secs()))?
        .map_err(|_| ApiError::too_large(limit))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}")))
}

/// The request body as a JSON object.
fn object(body: &Value) -> Result<&serde_json::Map<String, Value>, ApiError> {
    body.as_object()
        .ok_or_else(|| ApiError::invalid("the request body must be a JSON object"))
}

fn model_management(st: &AppState) -> Result<(), ApiError> {
    if st.config.model_management {
        Ok(())
    } else {
        Err(ApiError::not_found(
            "model management is turned off on this server",
        ))
    }
}

async fn load(State(st): St, body: Body) -> Result<Json<Value>, ApiError> {
    model_management(&st)?;
    let body = read_json(body, st.config.max_body).await?;
    let body = object(&body)?;
    let path = string_field(body, "model")?
        .ok_or_else(|| ApiError::param("model", "`model` (a path on the server) is missing"))?;
    let id = string_field(body, "id")?.map(str::to_string);
    let path = std::path::PathBuf::from(path);
    let worker = st.clone();
    let loaded = tokio::task::spawn_blocking(move || worker.registry.load(&path, id))
        .await
        .map_err(|e| ApiError::internal(format!("loading failed: {e}")))??;
    tracing::info!(id = loaded.id, path = %loaded.path.display(), "model loaded");
    Ok(Json(model_json(&loaded)))
}

async fn unload(State(st): St, body: Body) -> Result<Json<Value>, ApiError> {
    model_management(&st)?;
    let body = read_json(body, st.config.max_body).await?;
    let id = string_field(object(&body)?, "model")?
        .ok_or_else(|| ApiError::param("model", "`model` (an id) is missing"))?
        .to_string();
    let worker = st.clone();
    let gone = id.clone();
    tokio::task::spawn_blocking(move || worker.registry.unload(&gone))
        .await
        .map_err(|e| ApiError::internal(format!("unloading failed: {e}")))??;
    tracing::info!(id, "model unloaded");
    Ok(Json(json!({"id": id, "object": "model", "unloaded": true})))
}

async fn tokenize(State(st): St, body: Body) -> Result<Json<Value>, ApiError> {
    let body = read_json(body, st.config.max_body).await?;
    let body = object(&body)?;
    let m = st.registry.resolve(string_field(body, "model")?)?;
    let content = string_field(body, "content")?
        .ok_or_else(|| ApiError::param("content", "`content` (the text) is missing"))?;
    let tok = &m.model.tokenizer;
    let ids = tok.encode(
        content,
        EncodeOptions {
            add_special: bool_field(body, "add_special")?.unwrap_or(true),
            parse_special: bool_field(body, "parse_special")?.unwrap_or(true),
        },
    );
    if bool_field(body, "with_pieces")?.unwrap_or(false) {
        let pieces: Vec<Value> = ids
            .iter()
            .map(|&id| json!({"id": id, "piece": piece_text(tok, id)}))
            .collect();
        return Ok(Json(json!({"tokens": pieces})));
    }
    Ok(Json(json!({"tokens": ids})))
}

async fn detokenize(State(st): St, body: Body) -> Result<Json<Value>, ApiError> {
    let body = read_json(body, st.config.max_body).await?;
    let body = object(&body)?;
    let m = st.registry.resolve(string_field(body, "model")?)?;
    let bad = || ApiError::param("tokens", "`tokens` must be an array of token ids");
    let ids = body
        .get("tokens")
        .and_then(Value::as_array)
        .and_then(|ids| request::token_ids(ids))
        .ok_or_else(bad)?;
    check_ids(&ids, m.model.config.n_vocab, "tokens")?;
    let content = m.model.tokenizer.decode(
        &ids,
        DecodeOptions {
            remove_special: false,
            render_special: true,
            clean_spaces: false,
        },
    );
    Ok(Json(json!({"content": content})))
}

fn check_ids(ids: &[u32], n_vocab: usize, param: &str) -> Result<(), ApiError> {
    match ids.iter().find(|&&id| id as usize >= n_vocab) {
        Some(id) => Err(ApiError::param(
            param,
            format!("token id {id} is outside the vocabulary of {n_vocab}"),
        )),
        None => Ok(()),
    }
}

/// A token's text for log-probability entries (control tokens spelled out).
fn piece_text(tok: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(tok.piece(id, true)).into_owned()
}

async fn chat(State(st): St, body: Body) -> Response {
    generate(st, Endpoint::Chat, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(st): St, body: Body) -> Response {
    generate(st, Endpoint::Completions, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// Identity and bookkeeping of one generation request.
struct Job {
    st: Arc<AppState>,
    model: Arc<LoadedModel>,
    endpoint: Endpoint,
    id: String,
    created: u64,
    started: Instant,
    deadline: Instant,
    logprobs: Option<usize>,
    user: Option<String>,
    first_token: Option<Instant>,
    /// Tokens received so far.
    tokens: usize,
    /// The sequence's end was seen (finished or failed); otherwise dropping the job means
    /// the client left.
    ended: bool,
}

async fn generate(st: Arc<AppState>, endpoint: Endpoint, body: Body) -> Result<Response, ApiError> {
    let started = Instant::now();
    if st.draining.load(Ordering::Relaxed) {
        return Err(ApiError::overloaded("the server is shutting down", 5));
    }
    let body = read_json(body, st.config.max_body).await?;
    let req = request::parse(&body, endpoint, &st.config.sampling)?;
    let model = st.registry.resolve(req.model.as_deref())?;
    let prompt = prompt_tokens(&model, &req)?;
    let n_ctx = model.engine.n_ctx;
    let max_tokens = req.max_tokens.or(st.config.default_max_tokens);
    let prompt_param = match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completions => "prompt",
    };
    check_context(prompt.len(), max_tokens, n_ctx, prompt_param)?;
    let engine = &model.engine;
    if engine.stats.in_flight.load(Ordering::Relaxed) >= engine.n_slots + st.config.max_queue {
        return Err(ApiError::overloaded(
            format!(
                "the server is busy ({} running, {} waiting); try again shortly",
                engine.n_slots, st.config.max_queue
            ),
            1,
        ));
    }
    let rx = engine
        .submit(SeqRequest {
            prompt,
            params: GenerateParams {
                max_tokens,
                sampler: req.sampler.clone(),
                stop: req.stop.clone(),
                ignore_eos: false,
            },
            logprobs: req.logprobs,
        })
        .ok_or_else(model_unloaded)?;
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    let job = Job {
        id: format!(
            "{prefix}-{:x}{:06x}",
            unix_time(),
            st.next_id.fetch_add(1, Ordering::Relaxed)
        ),
        st: st.clone(),
        model: model.clone(),
        endpoint,
        created: unix_time(),
        started,
        deadline: started + Duration::from_secs(st.config.timeout),
        logprobs: req.logprobs,
        user: req.user.clone(),
        first_token: None,
        tokens: 0,
        ended: false,
    };
    if req.stream {
        Ok(stream_response(job, rx, req.include_usage))
    } else {
        collect_response(job, rx).await
    }
}

/// Refuses a prompt that fills the context, or that leaves less room than `max_tokens`.
fn check_context(
    prompt: usize,
    max_tokens: Option<usize>,
    n_ctx: usize,
    prompt_param: &str,
) -> Result<(), ApiError> {
    if prompt >= n_ctx {
        return Err(ApiError::context_exceeded(
            prompt_param,
            format!("the prompt has {prompt} tokens; this model's context holds {n_ctx}"),
        ));
    }
    if let Some(m) = max_tokens.filter(|&m| m > n_ctx - prompt) {
        return Err(ApiError::context_exceeded("max_tokens", format!(
            "the prompt ({prompt} tokens) plus max_tokens ({m}) exceeds this model's context of {n_ctx} tokens"
        )));
    }
    Ok(())
}

fn model_unloaded() -> ApiError {
    let mut e = ApiError::overloaded("the model was unloaded", 1);
    e.code = Some("model_unloaded");
    e
}

fn prompt_tokens(model: &LoadedModel, req: &GenRequest) -> Result<Vec<u32>, ApiError> {
    let tok = &model.model.tokenizer;
    let ids = match &req.input {
        Input::Chat(chat) => {
            let template = model.template.as_ref().map_err(|why| {
                ApiError::invalid(format!(
                    "model `{}` has no usable chat template ({why}); use /v1/completions",
                    model.id
                ))
            })?;
            let text = template
                .render(chat)
                .map_err(|e| ApiError::param("messages", e.to_string()))?;
            // The template writes BOS itself when the model wants one.
            tok.encode(
                &text,
                EncodeOptions {
                    add_special: false,
                    parse_special: true,
                },
            )
        }
        Input::Text(text) => tok.encode(
            text,
            EncodeOptions {
                add_special: tok.add_bos(),
                parse_special: true,
            },
        ),
        Input::Tokens(ids) => {
            check_ids(ids, model.model.config.n_vocab, "prompt")?;
            ids.clone()
        }
    };
    if ids.is_empty() {
        return Err(ApiError::param("prompt", "the prompt has no tokens"));
    }
    Ok(ids)
}

fn unix_time() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::MaxTokens | StopReason::ContextFull => "length",
        StopReason::EndOfGeneration | StopReason::StopString | StopReason::Cancelled => "stop",
    }
}

fn usage(s: &SeqSummary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": s.reused},
    })
}

impl Job {
    fn tokenizer(&self) -> &Tokenizer {
        &self.model.model.tokenizer
    }

    fn saw_tokens(&mut self, tokens: &[GeneratedToken]) {
        self.tokens += tokens.len();
        if !tokens.is_empty() && self.first_token.is_none() {
            self.first_token = Some(Instant::now());
            self.st.metrics.time_to_first_token(self.started.elapsed());
        }
    }

    /// Chat-style entries `{token, logprob, bytes, top_logprobs}`.
    fn chat_logprobs(&self, tokens: &[GeneratedToken]) -> Value {
        let tok = self.tokenizer();
        let entry = |id: u32, lp: f32| json!({"token": piece_text(tok, id), "logprob": lp, "bytes": tok.piece(id, true)});
        let content: Vec<Value> = tokens
            .iter()
            .filter_map(|t| {
                let l = t.logprob.as_ref()?;
                let mut e = entry(t.id, l.logprob);
                e["top_logprobs"] = l.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
                Some(e)
            })
            .collect();
        json!({"content": content, "refusal": null})
    }

    /// Completion-style `{tokens, token_logprobs, top_logprobs, text_offset}`, with offsets
    /// counted from `offset` (the characters of text already sent).
    fn completion_logprobs(&self, tokens: &[GeneratedToken], offset: &mut usize) -> Value {
        let tok = self.tokenizer();
        let (mut texts, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
        for t in tokens {
            let Some(l) = &t.logprob else { continue };
            let text = piece_text(tok, t.id);
            offsets.push(*offset);
            *offset += text.chars().count();
            texts.push(text);
            lps.push(l.logprob);
            let top: serde_json::Map<String, Value> = l
                .top
                .iter()
                .map(|&(id, lp)| (piece_text(tok, id), json!(lp)))
                .collect();
            tops.push(Value::Object(top));
        }
        json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
    }

    fn chunk(&self, choice: Value) -> Value {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model.id,
            "system_fingerprint": null,
            "choices": [choice],
        })
    }

    fn done(&mut self, summary: &SeqSummary) {
        self.ended = true;
        let elapsed = self.started.elapsed();
        self.st.metrics.generation(elapsed);
        let ttft = self.first_token.map(|t| t.duration_since(self.started));
        tracing::info!(
            id = self.id,
            model = self.model.id,
            user = self.user.as_deref().unwrap_or(""),
            prompt_tokens = summary.prompt_tokens,
            cached_tokens = summary.reused,
            completion_tokens = summary.completion_tokens,
            finish = finish_reason(summary.reason),
            queued_ms = summary.queued.as_secs_f64() * 1e3,
            ttft_ms = ttft.map_or(0.0, |t| t.as_secs_f64() * 1e3),
            gen_tps = rate(summary.completion_tokens, summary.gen_time),
            ms = elapsed.as_secs_f64() * 1e3,
            "generation"
        );
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if !self.ended {
            let elapsed = self.started.elapsed();
            self.st.metrics.generation(elapsed);
            tracing::info!(
                id = self.id,
                model = self.model.id,
                user = self.user.as_deref().unwrap_or(""),
                completion_tokens = self.tokens,
                ms = elapsed.as_secs_f64() * 1e3,
                "generation cancelled: the client went away"
            );
        }
    }
}

fn rate(n: usize, t: Duration) -> f64 {
    if t.is_zero() {
        0.0
    } else {
        n as f64 / t.as_secs_f64()
    }
}

async fn collect_response(
    mut job: Job,
    mut rx: UnboundedReceiver<SeqEvent>,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    loop {
        let Ok(event) = tokio::time::timeout_at(job.deadline.into(), rx.recv()).await else {
            job.ended = true;
            tracing::warn!(id = job.id, "generation timed out");
            return Err(ApiError::timeout(job.st.config.timeout));
        };
        match event {
            Some(SeqEvent::Delta {
                text: t,
                tokens: ts,
            }) => {
                job.saw_tokens(&ts);
                text.push_str(&t);
                tokens.extend(ts);
            }
            Some(SeqEvent::Finished(summary)) => {
                job.done(&summary);
                let reason = finish_reason(summary.reason);
                let choice = match job.endpoint {
                    Endpoint::Chat => json!({
                        "index": 0,
                        "message": {"role": "assistant", "content": text, "refusal": null},
                        "logprobs": job.logprobs.map(|_| job.chat_logprobs(&tokens)),
                        "finish_reason": reason,
                    }),
                    Endpoint::Completions => json!({
                        "index": 0,
                        "text": text,
                        "logprobs": job.logprobs.map(|_| job.completion_logprobs(&tokens, &mut 0)),
                        "finish_reason": reason,
                    }),
                };
                let mut body = job.chunk(choice);
                body["object"] = json!(match job.endpoint {
                    Endpoint::Chat => "chat.completion",
                    Endpoint::Completions => "text_completion",
                });
                body["usage"] = usage(&summary);
                return Ok(Json(body).into_response());
            }
            Some(SeqEvent::Failed(why)) => {
                job.ended = true;
                return Err(engine_failure(&why));
            }
            None => {
                job.ended = true;
                return Err(model_unloaded());
            }
        }
    }
}

fn engine_failure(why: &str) -> ApiError {
    if why.contains("unloaded") || why.contains("shutting down") {
        let mut e = ApiError::overloaded(why, 1);
        e.code = Some("model_unloaded");
        e
    } else {
        ApiError::internal(why)
    }
}

/// The state of one SSE response.
struct Streamer {
    job: Job,
    rx: UnboundedReceiver<SeqEvent>,
    include_usage: bool,
    out: VecDeque<Event>,
    /// Characters of completion text sent (for completion log-probability offsets).
    sent_chars: usize,
    ended: bool,
}

fn stream_response(job: Job, rx: UnboundedReceiver<SeqEvent>, include_usage: bool) -> Response {
    let mut s = Streamer {
        job,
        rx,
        include_usage,
        out: VecDeque::new(),
        sent_chars: 0,
        ended: false,
    };
    if s.job.endpoint == Endpoint::Chat {
        let first = s.job.chunk(json!({
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": null,
            "finish_reason": null,
        }));
        s.push(first);
    }
    Sse::new(events(s))
        .keep_alive(KeepAlive::default())
        .into_response()
}

impl Streamer {
    fn push(&mut self, mut chunk: Value) {
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        self.out.push_back(Event::default().data(chunk.to_string()));
    }

    fn end_with_error(&mut self, e: ApiError) {
        self.job.ended = true;
        tracing::warn!(id = self.job.id, error = e.message, "generation failed");
        self.out
            .push_back(Event::default().data(e.body().to_string()));
        self.out.push_back(Event::default().data("[DONE]"));
        self.ended = true;
    }

    fn on_event(&mut self, event: Option<SeqEvent>) {
        match event {
            Some(SeqEvent::Delta { text, tokens }) => {
                self.job.saw_tokens(&tokens);
                let want_lp = self.job.logprobs.is_some() && !tokens.is_empty();
                if text.is_empty() && !want_lp {
                    return;
                }
                let choice = match self.job.endpoint {
                    Endpoint::Chat => json!({
                        "index": 0,
                        "delta": {"content": text},
                        "logprobs": want_lp.then(|| self.job.chat_logprobs(&tokens)),
                        "finish_reason": null,
                    }),
                    Endpoint::Completions => {
                        let lp = want_lp
                            .then(|| self.job.completion_logprobs(&tokens, &mut self.sent_chars));
                        if !want_lp {
                            self.sent_chars += text.chars().count();
                        }
                        json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": null})
                    }
                };
                let chunk = self.job.chunk(choice);
                self.push(chunk);
            }
            Some(SeqEvent::Finished(summary)) => {
                self.job.done(&summary);
                let reason = finish_reason(summary.reason);
                let choice = match self.job.endpoint {
                    Endpoint::Chat => {
                        json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": reason})
                    }
                    Endpoint::Completions => {
                        json!({"index": 0, "text": "", "logprobs": null, "finish_reason": reason})
                    }
                };
                let chunk = self.job.chunk(choice);
                self.push(chunk);
                if self.include_usage {
                    let mut last = self.job.chunk(json!(null));
                    last["choices"] = json!([]);
                    last["usage"] = usage(&summary);
                    self.out.push_back(Event::default().data(last.to_string()));
                }
                self.out.push_back(Event::default().data("[DONE]"));
                self.ended = true;
            }
            Some(SeqEvent::Failed(why)) => self.end_with_error(engine_failure(&why)),
            None => self.end_with_error(model_unloaded()),
        }
    }
}

fn events(s: Streamer) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold(s, |mut s| async move {
        loop {
            if let Some(e) = s.out.pop_front() {
                return Some((Ok(e), s));
            }
            if s.ended {
                return None;
            }
            let deadline = s.job.deadline;
            match tokio::time::timeout_at(deadline.into(), s.rx.recv()).await {
                Ok(event) => s.on_event(event),
                Err(_) => {
                    let timeout = s.job.st.config.timeout;
                    s.end_with_error(ApiError::timeout(timeout));
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_check_refuses_any_max_tokens_that_does_not_fit() {
        assert!(check_context(10, Some(4086), 4096, "prompt").is_ok());
        assert!(check_context(10, None, 4096, "prompt").is_ok());
        for max_tokens in [4087, usize::MAX - 5, usize::MAX] {
            let e = check_context(10, Some(max_tokens), 4096, "prompt").unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{max_tokens}");
            assert_eq!(e.param.as_deref(), Some("max_tokens"), "{max_tokens}");
            assert_eq!(e.code, Some("context_length_exceeded"), "{max_tokens}");
        }
        let e = check_context(4096, Some(1), 4096, "messages").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
    }
}
