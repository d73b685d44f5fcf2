//! Request bodies of `/v1/chat/completions` and `/v1/completions`, checked field by field.
//!
//! Every field a client sends is either honoured or refused with a 400 that names it: the
//! honoured ones are read with their types and ranges checked, a short list of OpenAI fields
//! this server does not implement gets "not supported", and anything else "unrecognized"
//! (as OpenAI answers). `null` counts as absent. Sampling fields a request leaves out take the
//! server's defaults (llama.cpp's, or the `serve` flags), not OpenAI's.

use std::collections::BTreeSet;

use akunu_core::batch::MAX_TOP_LOGPROBS;
use akunu_core::sampling::SamplerParams;
use akunu_tokenizer::chat::ChatRequest;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Most stop strings a request may give.
const MAX_STOPS: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

#[derive(Debug, Clone)]
pub enum Input {
    Chat(ChatRequest),
    Text(String),
    Tokens(Vec<u32>),
}

/// A checked generation request.
#[derive(Debug, Clone)]
pub struct GenRequest {
    pub model: Option<String>,
    pub input: Input,
    pub stream: bool,
    pub include_usage: bool,
    pub max_tokens: Option<usize>,
    pub sampler: SamplerParams,
    pub stop: Vec<String>,
    /// Alternatives per token when log-probabilities are wanted.
    pub logprobs: Option<usize>,
    pub user: Option<String>,
}

/// Reads a body; `defaults` are the server's sampling settings.
pub fn parse(
    body: &Value,
    endpoint: Endpoint,
    defaults: &SamplerParams,
) -> Result<GenRequest, ApiError> {
    let map = body
        .as_object()
        .ok_or_else(|| ApiError::invalid("the request body must be a JSON object"))?;
    let mut f = Fields::new(map);
    let model = f.string("model")?;
    let input = match endpoint {
        Endpoint::Chat => {
            for key in ["messages", "add_generation_prompt", "chat_template_kwargs"] {
                f.used.insert(key);
            }
            let request = ChatRequest::from_json(body)
                .map_err(|e| ApiError::param("messages", e.to_string()))?;
            if request.messages.is_empty() {
                return Err(ApiError::param("messages", "`messages` must not be empty"));
            }
            Input::Chat(request)
        }
        Endpoint::Completions => prompt(&mut f)?,
    };
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.take("stream_options") {
        None => false,
        Some(Value::Object(o)) => {
            let mut g = Fields::nested(o, "stream_options.");
            let v = g.bool("include_usage")?.unwrap_or(false);
            g.finish(&[])?;
            v
        }
        Some(_) => {
            return Err(ApiError::param(
                "stream_options",
                "`stream_options` must be an object",
            ))
        }
    };
    let max_tokens = match (f.uint("max_tokens")?, f.uint("max_completion_tokens")?) {
        (Some(_), Some(_)) => {
            return Err(ApiError::param(
                "max_tokens",
                "give `max_tokens` or `max_completion_tokens`, not both",
            ))
        }
        (a, b) => a.or(b),
    };
    let mut sampler = defaults.clone();
    if let Some(t) = f.number("temperature", 0.0, 2.0)? {
        sampler.temperature = t;
    }
    if let Some(p) = f.number("top_p", 0.0, 1.0)? {
        sampler.top_p = p;
    }
    if let Some(k) = f.uint("top_k")? {
        sampler.top_k = k;
    }
    if let Some(p) = f.number("min_p", 0.0, 1.0)? {
        sampler.min_p = p;
    }
    if let Some(p) = f.number("presence_penalty", -2.0, 2.0)? {
        sampler.presence_penalty = p;
    }
    if let Some(p) = f.number("frequency_penalty", -2.0, 2.0)? {
        sampler.frequency_penalty = p;
    }
    if let Some(p) = f.number("repeat_penalty", 0.0, 10.0)? {
        if p == 0.0 {
            return Err(ApiError::param(
                "repeat_penalty",
                "`repeat_penalty` must be above 0",
            ));
        }
        sampler.repeat_penalty = p;
    }
    if let Some(seed) = f.take("seed") {
        sampler.seed = match (seed.as_u64(), seed.as_i64()) {
            (Some(s), _) => s,
            (None, Some(s)) => s as u64,
            _ => return Err(ApiError::param("seed", "`seed` must be an integer")),
        };
    }
    let stop = stops(&mut f)?;
    if let Some(n) = f.uint("n")? {
        if n != 1 {
            return Err(ApiError::param("n", "only `n` = 1 is supported"));
        }
    }
    let logprobs = match endpoint {
        Endpoint::Chat => {
            let on = f.bool("logprobs")?.unwrap_or(false);
            let top = f.uint("top_logprobs")?;
            match (on, top) {
                (false, Some(_)) => {
                    return Err(ApiError::param(
                        "top_logprobs",
                        "`top_logprobs` needs `logprobs: true`",
                    ))
                }
                (false, None) => None,
                (true, top) => Some(top.unwrap_or(0)),
            }
        }
        Endpoint::Completions => {
            if f.bool("echo")? == Some(true) {
                return Err(ApiError::param("echo", "`echo` is not supported"));
            }
            if f.string("suffix")?.is_some() {
                return Err(ApiError::param("suffix", "`suffix` is not supported"));
            }
            if f.uint("best_of")?.is_some_and(|b| b != 1) {
                return Err(ApiError::param(
                    "best_of",
                    "only `best_of` = 1 is supported",
                ));
            }
            f.uint("logprobs")?
        }
    };
    if let Some(n) = logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
        let param = if endpoint == Endpoint::Chat {
            "top_logprobs"
        } else {
            "logprobs"
        };
        return Err(ApiError::param(
            param,
            format!("`{param}` must be at most {MAX_TOP_LOGPROBS}, got {n}"),
        ));
    }
    if let Some(format) = f.take("response_format") {
        if format.get("type").and_then(Value::as_str) != Some("text") {
            return Err(ApiError::param(
                "response_format",
                "only `response_format` {\"type\": \"text\"} is supported",
            ));
        }
    }
    let user = f.string("user")?;
    f.finish(&[
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "functions",
        "function_call",
        "logit_bias",
        "audio",
        "modalities",
        "prediction",
        "reasoning_effort",
        "web_search_options",
    ])?;
    sampler
        .validate()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok(GenRequest {
        model,
        input,
        stream,
        include_usage,
        max_tokens,
        sampler,
        stop,
        logprobs,
        user,
    })
}

fn prompt(f: &mut Fields) -> Result<Input, ApiError> {
    let bad = || {
        ApiError::param(
            "prompt",
            "`prompt` must be a string, an array of one string, or an array of token ids",
        )
    };
    match f.take("prompt") {
        None => Err(ApiError::param("prompt", "`prompt` is missing")),
        Some(Value::String(s)) => Ok(Input::Text(s.clone())),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(s)] => Ok(Input::Text(s.clone())),
            [Value::Array(ids)] => token_ids(ids).ok_or_else(bad).map(Input::Tokens),
            [] => Err(ApiError::param("prompt", "`prompt` must not be empty")),
            ids if ids.iter().all(Value::is_number) => {
                token_ids(ids).ok_or_else(bad).map(Input::Tokens)
            }
            _ if items.iter().all(|v| v.is_string() || v.is_array()) => Err(ApiError::param(
                "prompt",
                "only one prompt per request is supported",
            )),
            _ => Err(bad()),
        },
        Some(_) => Err(bad()),
    }
}

/// The field `key` of `body` as a string; absent and `null` give `None`.
pub(crate) fn string_field<'a>(
    body: &'a Map<String, Value>,
    key: &str,
) -> Result<Option<&'a str>, ApiError> {
    as_string(body.get(key), key)
}

/// The field `key` of `body` as a boolean; absent and `null` give `None`.
pub(crate) fn bool_field(body: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    as_bool(body.get(key), key)
}

/// A field's value as a string, refused under its full `name`; absent and `null` give `None`.
fn as_string<'a>(v: Option<&'a Value>, name: &str) -> Result<Option<&'a str>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::param(name, format!("`{name}` must be a string"))),
    }
}

/// A field's value as a boolean, refused under its full `name`; absent and `null` give `None`.
fn as_bool(v: Option<&Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::param(name, format!("`{name}` must be a boolean"))),
    }
}

/// Token ids that fit 32 bits, or `None` if any is not one.
pub(crate) fn token_ids(ids: &[Value]) -> Option<Vec<u32>> {
    ids.iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

fn stops(f: &mut Fields) -> Result<Vec<String>, ApiError> {
    let list = match f.take("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::param("stop", "`stop` must be a string or an array of strings")
            })?,
        Some(_) => {
            return Err(ApiError::param(
                "stop",
                "`stop` must be a string or an array of strings",
            ))
        }
    };
    if list.len() > MAX_STOPS {
        return Err(ApiError::param(
            "stop",
            format!("at most {MAX_STOPS} stop strings, got {}", list.len()),
        ));
    }
    Ok(list)
}

/// The fields of one JSON object, remembering which were read. A nested object's fields are
/// named in errors by their path from the body (`prefix`, such as "stream_options.").
struct Fields<'a> {
    map: &'a Map<String, Value>,
    used: BTreeSet<&'a str>,
    prefix: &'static str,
}

impl<'a> Fields<'a> {
    fn new(map: &'a Map<String, Value>) -> Self {
        Self::nested(map, "")
    }

    fn nested(map: &'a Map<String, Value>, prefix: &'static str) -> Self {
        Self {
            map,
            used: BTreeSet::new(),
            prefix,
        }
    }

    /// `key`'s full name, as errors give it.
    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn take(&mut self, key: &'a str) -> Option<&'a Value> {
        self.used.insert(key);
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn string(&mut self, key: &'a str) -> Result<Option<String>, ApiError> {
        let v = self.take(key);
        Ok(as_string(v, &self.name(key))?.map(str::to_string))
    }

    fn bool(&mut self, key: &'a str) -> Result<Option<bool>, ApiError> {
        let v = self.take(key);
        as_bool(v, &self.name(key))
    }

    fn uint(&mut self, key: &'a str) -> Result<Option<usize>, ApiError> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        let name = self.name(key);
        v.as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                ApiError::param(&name, format!("`{name}` must be a non-negative integer"))
            })
    }

    fn number(&mut self, key: &'a str, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        let name = self.name(key);
        match v.as_f64() {
            Some(x) if (f64::from(lo)..=f64::from(hi)).contains(&x) => Ok(Some(x as f32)),
            Some(x) => Err(ApiError::param(
                &name,
                format!("`{name}` must be between {lo} and {hi}, got {x}"),
            )),
            None => Err(ApiError::param(&name, format!("`{name}` must be a number"))),
        }
    }

    /// Refuses every field that was not read: `unsupported` ones as such, others as unknown.
    fn finish(&self, unsupported: &[&str]) -> Result<(), ApiError> {
        let unread = |(k, v): &(&String, &Value)| !v.is_null() && !self.used.contains(k.as_str());
        let Some((key, _)) = self.map.iter().find(unread) else {
            return Ok(());
        };
        let name = self.name(key);
        if unsupported.contains(&key.as_str()) {
            Err(ApiError::param(
                &name,
                format!("`{name}` is not supported by this server"),
            ))
        } else {
            Err(ApiError::param(
                &name,
                format!("unrecognized request argument `{name}`"),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn defaults() -> SamplerParams {
        SamplerParams {
            seed: 5,
            ..SamplerParams::default()
        }
    }

    fn chat(extra: Value) -> Result<GenRequest, ApiError> {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        parse(&body, Endpoint::Chat, &defaults())
    }

    fn refused_param(r: Result<GenRequest, ApiError>) -> String {
        let e = r.expect_err("should be refused");
        assert_eq!(e.status, 400, "{}", e.message);
        e.param.unwrap_or_default()
    }

    #[test]
    fn a_nested_field_is_refused_by_its_path() {
        let e = chat(json!({"stream_options": {"include_usage": 1}})).expect_err("refused");
        assert_eq!(e.param.as_deref(), Some("stream_options.include_usage"));
        assert_eq!(
            e.message,
            "`stream_options.include_usage` must be a boolean"
        );
        let e = chat(json!({"stream_options": {"x": true}})).expect_err("refused");
        assert_eq!(
            e.message,
            "unrecognized request argument `stream_options.x`"
        );
    }

    #[test]
    fn honoured_fields_override_the_server_defaults() {
        let r = chat(json!({
            "model": "m", "temperature": 0, "top_p": 0.5, "top_k": 7, "min_p": 0.1,
            "presence_penalty": 1.5, "frequency_penalty": -0.5, "seed": -1, "stop": "\n\n",
            "max_completion_tokens": 9, "stream": true,
            "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2,
            "user": "u", "n": 1, "response_format": {"type": "text"}, "tools": null
        }))
        .unwrap();
        assert_eq!(r.model.as_deref(), Some("m"));
        assert_eq!(
            (
                r.sampler.temperature,
                r.sampler.top_p,
                r.sampler.top_k,
                r.sampler.min_p
            ),
            (0.0, 0.5, 7, 0.1)
        );
        assert_eq!(
            (r.sampler.presence_penalty, r.sampler.frequency_penalty),
            (1.5, -0.5)
        );
        assert_eq!(r.sampler.seed, u64::MAX);
        assert_eq!(r.stop, vec!["\n\n".to_string()]);
        assert_eq!(r.max_tokens, Some(9));
        assert!(r.stream && r.include_usage);
        assert_eq!(r.logprobs, Some(2));
        let plain = chat(json!({})).unwrap();
        assert_eq!(plain.sampler, defaults());
        assert_eq!(
            (plain.max_tokens, plain.logprobs, plain.stream),
            (None, None, false)
        );
    }

    #[test]
    fn wrong_types_ranges_and_unknown_fields_name_the_field() {
        let cases = [
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"temperature": 2.5}), "temperature"),
            (json!({"top_p": -0.1}), "top_p"),
            (json!({"max_tokens": -1}), "max_tokens"),
            (json!({"max_tokens": 1.5}), "max_tokens"),
            (
                json!({"max_tokens": 5, "max_completion_tokens": 5}),
                "max_tokens",
            ),
            (json!({"stop": 3}), "stop"),
            (json!({"stop": ["a", 1]}), "stop"),
            (json!({"n": 2}), "n"),
            (json!({"seed": "x"}), "seed"),
            (json!({"stream": "yes"}), "stream"),
            (
                json!({"stream_options": {"include_usage": true, "x": 1}}),
                "stream_options.x",
            ),
            (
                json!({"stream_options": {"include_usage": 1}}),
                "stream_options.include_usage",
            ),
            (json!({"top_logprobs": 2}), "top_logprobs"),
            (
                json!({"logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
            (json!({"tools": []}), "tools"),
            (
                json!({"response_format": {"type": "json_object"}}),
                "response_format",
            ),
            (json!({"bogus": 1}), "bogus"),
            (json!({"messages": 5}), "messages"),
            (json!({"messages": []}), "messages"),
        ];
        for (extra, param) in cases {
            assert_eq!(refused_param(chat(extra.clone())), param, "{extra}");
        }
        assert!(parse(&json!([1]), Endpoint::Chat, &defaults()).is_err());
    }

    #[test]
    fn completion_prompts() {
        let p = |prompt: Value| {
            parse(
                &json!({"prompt": prompt}),
                Endpoint::Completions,
                &defaults(),
            )
        };
        assert!(matches!(p(json!("hi")).unwrap().input, Input::Text(t) if t == "hi"));
        assert!(matches!(p(json!(["hi"])).unwrap().input, Input::Text(t) if t == "hi"));
        assert!(matches!(p(json!([1, 2])).unwrap().input, Input::Tokens(t) if t == [1, 2]));
        assert!(matches!(p(json!([[3]])).unwrap().input, Input::Tokens(t) if t == [3]));
        for bad in [
            json!(["a", "b"]),
            json!([]),
            json!(5),
            json!([-1]),
            json!([1, "a"]),
        ] {
            assert_eq!(refused_param(p(bad.clone())), "prompt", "{bad}");
        }
        let missing = parse(&json!({}), Endpoint::Completions, &defaults());
        assert_eq!(refused_param(missing), "prompt");
        let lp = parse(
            &json!({"prompt": "x", "logprobs": 3}),
            Endpoint::Completions,
            &defaults(),
        );
        assert_eq!(lp.unwrap().logprobs, Some(3));
        let echo = parse(
            &json!({"prompt": "x", "echo": true}),
            Endpoint::Completions,
            &defaults(),
        );
        assert_eq!(refused_param(echo), "echo");
    }
}
