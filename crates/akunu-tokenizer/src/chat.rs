//! Chat templates: the Jinja program that turns a conversation into the prompt text a model was
//! trained on.
//!
//! A model's own template (GGUF `tokenizer.chat_template`, or `chat_template` in Hugging Face's
//! `tokenizer_config.json`) is compiled once into a minijinja environment set up the way Hugging
//! Face transformers renders templates, so that [`ChatTemplate::render`] gives byte for byte what
//! `apply_chat_template(..., tokenize=False)` gives: `trim_blocks`/`lstrip_blocks`, loop
//! controls, Python string and dict methods, `raise_exception`, `strftime_now`, `tojson` as
//! Python's `json.dumps`, and Python's spelling of `None`, `True` and containers when printed. The
//! request is normalised as transformers does (null message fields dropped, reasoning aliases).
//! Files without a template fall back to a [`BuiltinTemplate`]. [`ChatTemplate::end_of_turn_text`]
//! renders a probe conversation to learn the text that closes an assistant turn, so decode loops
//! never hard-code stop strings. A template is a program from the model file, so every render
//! is bounded in steps (`RENDER_FUEL`) and in output (`MAX_OUTPUT`).

mod builtin;
mod clock;
mod pyfmt;

use std::collections::BTreeMap;
use std::fmt;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, UndefinedBehavior};
use serde_json::{Map, Value as Json};

pub use builtin::BuiltinTemplate;

use pyfmt::{is_py_space, json_dumps, py_str, JsonStyle};

/// The name the template is stored under inside its environment (no extension, so nothing is
/// auto-escaped).
const NAME: &str = "chat_template";

/// Template variables the request itself sets; `extra` may not shadow them.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// Request JSON nested deeper than this is refused rather than recursed into.
const MAX_DEPTH: usize = 128;

/// Names a message's reasoning may come under. transformers copies the first one present to
/// `thinking` and `reasoning_content`, the two names templates read.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// The most steps (minijinja instructions) one render may take. A template from a model file
/// is a program from an unknown source: a loop that never ends would stall the load (which
/// renders a probe conversation) or the server. Real templates take about 50 steps a message
/// (Qwen 3's and Gemma 3's), so this is 200,000 messages; it runs out in about 0.2 s.
const RENDER_FUEL: u64 = 10_000_000;

/// The most bytes one render may write: a template can print a long string in a loop, which
/// steps alone do not bound. Far past any prompt a context holds.
const MAX_OUTPUT: usize = 64 << 20;

/// A render's output, refused past [`MAX_OUTPUT`] bytes.
#[derive(Default)]
struct BoundedOutput {
    bytes: Vec<u8>,
    over: bool,
}

impl std::io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_OUTPUT {
            self.over = true;
            return Err(std::io::Error::other(
                "the chat template's output is too long",
            ));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Why a template could not be compiled or a conversation could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChatError {
    /// The template source is not valid Jinja (or uses syntax minijinja lacks).
    #[error("chat template does not compile{}: {message}", location(*.line, .source_line))]
    Syntax {
        message: String,
        /// 1-based line of the template.
        line: Option<usize>,
        source_line: Option<String>,
    },
    /// The template called `raise_exception(message)`: it rejects this conversation.
    #[error("chat template rejected the conversation: {0}")]
    Raised(String),
    /// Rendering failed (an undefined attribute, a type error, ...).
    #[error("chat template failed{}: {message}", location(*.line, .source_line))]
    Render {
        message: String,
        line: Option<usize>,
        source_line: Option<String>,
    },
    /// The request is malformed (not a list of message objects, a message without a role, ...).
    #[error("invalid chat request: {0}")]
    Request(String),
}

fn location(line: Option<usize>, source_line: &Option<String>) -> String {
    match (line, source_line) {
        (Some(n), Some(text)) => format!(" at line {n} (`{text}`)"),
        (Some(n), None) => format!(" at line {n}"),
        _ => String::new(),
    }
}

fn request_error(msg: impl Into<String>) -> ChatError {
    ChatError::Request(msg.into())
}

/// A conversation to render: OpenAI-style messages plus the template's other inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// Objects with a string `role` (`system`, `user`, `assistant`, `tool`, or anything the
    /// template understands) and usually `content`: a string, or a list of `{"type": "text",
    /// "text": ...}` parts. Other fields (`tool_calls`, `tool_call_id`, `name`,
    /// `reasoning_content`, ...) reach the template untouched; null fields are dropped.
    pub messages: Vec<Json>,
    /// Tool (function) definitions, the template's `tools`.
    pub tools: Option<Vec<Json>>,
    /// Retrieval documents, the template's `documents`.
    pub documents: Option<Vec<Json>>,
    /// Append the opening of an assistant turn, for the model to complete.
    pub add_generation_prompt: bool,
    /// More top-level template variables, e.g. `enable_thinking: false` for Qwen 3.
    pub extra: Map<String, Json>,
}

impl ChatRequest {
    /// The given messages, ending with a generation prompt; no tools or extra variables.
    pub fn new(messages: Vec<Json>) -> ChatRequest {
        ChatRequest {
            messages,
            tools: None,
            documents: None,
            add_generation_prompt: true,
            extra: Map::new(),
        }
    }

    /// Reads the template inputs out of an OpenAI-style request body: `messages` (required),
    /// `tools`, `documents`, `add_generation_prompt` (default true) and `chat_template_kwargs`
    /// (the extra variables). Other fields are ignored.
    pub fn from_json(request: &Json) -> Result<ChatRequest, ChatError> {
        let body = request
            .as_object()
            .ok_or_else(|| request_error(format!("expected an object, got {}", kind(request))))?;
        let list = |key: &str| -> Result<Option<Vec<Json>>, ChatError> {
            match body.get(key) {
                None | Some(Json::Null) => Ok(None),
                Some(Json::Array(items)) => Ok(Some(items.clone())),
                Some(other) => Err(request_error(format!(
                    "`{key}` must be an array, got {}",
                    kind(other)
                ))),
            }
        };
        let messages = list("messages")?.ok_or_else(|| request_error("`messages` is missing"))?;
        let add_generation_prompt = match body.get("add_generation_prompt") {
            None | Some(Json::Null) => true,
            Some(Json::Bool(b)) => *b,
            Some(other) => {
                return Err(request_error(format!(
                    "`add_generation_prompt` must be a boolean, got {}",
                    kind(other)
                )))
            }
        };
        let extra = match body.get("chat_template_kwargs") {
            None | Some(Json::Null) => Map::new(),
            Some(Json::Object(map)) => map.clone(),
            Some(other) => {
                return Err(request_error(format!(
                    "`chat_template_kwargs` must be an object, got {}",
                    kind(other)
                )))
            }
        };
        Ok(ChatRequest {
            messages,
            tools: list("tools")?,
            documents: list("documents")?,
            add_generation_prompt,
            extra,
        })
    }
}

fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

/// A compiled chat template with the special tokens it may refer to.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    /// `bos_token`, `eos_token`, ...: template variables, as transformers passes its
    /// `special_tokens_map`.
    special_tokens: BTreeMap<String, String>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles a Jinja chat template.
    pub fn new(source: &str) -> Result<ChatTemplate, ChatError> {
        check_expression_sizes(source)?;
        let prepared = strip_generation_tags(source);
        let env = compile(&prepared).map_err(|err| {
            let (line, source_line) = error_location(&err, source);
            ChatError::Syntax {
                message: describe(&err),
                line,
                source_line,
            }
        })?;
        Ok(ChatTemplate {
            env,
            source: source.to_owned(),
            special_tokens: BTreeMap::new(),
        })
    }

    /// A built-in fallback template.
    pub fn builtin(which: BuiltinTemplate) -> ChatTemplate {
        // The sources are constants that the tests compile, so this cannot fail at run time.
        ChatTemplate::new(which.source()).expect("built-in chat templates compile")
    }

    /// Sets a special token variable (`bos_token`, `eos_token`, `unk_token`, `pad_token`, ...).
    /// Variables in [`ChatRequest::extra`] take precedence, as in transformers.
    pub fn set_special_token(&mut self, name: impl Into<String>, text: impl Into<String>) {
        self.special_tokens.insert(name.into(), text.into());
    }

    /// [`set_special_token`](Self::set_special_token), by value.
    pub fn with_special_token(mut self, name: impl Into<String>, text: impl Into<String>) -> Self {
        self.set_special_token(name, text);
        self
    }

    /// The special token variables set so far.
    pub fn special_tokens(&self) -> &BTreeMap<String, String> {
        &self.special_tokens
    }

    /// The template source as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation to prompt text (special tokens as text; tokenize it with special
    /// token parsing on and without adding a BOS of its own when the template emits one).
    pub fn render(&self, request: &ChatRequest) -> Result<String, ChatError> {
        if request.messages.is_empty() {
            return Err(request_error("the conversation has no messages"));
        }
        let messages = request
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| template_message(i, m))
            .collect::<Result<Vec<_>, _>>()?;
        let list = |items: &Option<Vec<Json>>| -> Result<Value, ChatError> {
            match items {
                None => Ok(Value::from(())),
                Some(items) => Ok(Value::from(
                    items
                        .iter()
                        .map(|v| to_value(v, 1))
                        .collect::<Result<Vec<_>, _>>()?,
                )),
            }
        };
        let mut vars: Vec<(String, Value)> = Vec::new();
        for (name, text) in &self.special_tokens {
            vars.push((name.clone(), Value::from(text.as_str())));
        }
        for (name, value) in &request.extra {
            if RESERVED.contains(&name.as_str()) {
                return Err(request_error(format!(
                    "`{name}` is set by the request itself and cannot be an extra variable"
                )));
            }
            vars.push((name.clone(), to_value(value, 0)?));
        }
        vars.push(("messages".into(), Value::from(messages)));
        vars.push(("tools".into(), list(&request.tools)?));
        vars.push(("documents".into(), list(&request.documents)?));
        vars.push((
            "add_generation_prompt".into(),
            Value::from(request.add_generation_prompt),
        ));
        // Later pairs replace earlier ones, so extras override special tokens.
        let context = Value::from_pairs(vars);
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| self.render_error(&e))?;
        let mut out = BoundedOutput::default();
        match template.render_captured_to(context, &mut out) {
            Ok(_) => String::from_utf8(out.bytes).map_err(|_| ChatError::Render {
                message: "the output is not UTF-8".into(),
                line: None,
                source_line: None,
            }),
            Err(_) if out.over => Err(ChatError::Render {
                message: format!("its output passed {} MiB", MAX_OUTPUT >> 20),
                line: None,
                source_line: None,
            }),
            Err(e) => Err(self.render_error(&e)),
        }
    }

    fn render_error(&self, err: &Error) -> ChatError {
        if let Some(raised) = raised_message(err) {
            return ChatError::Raised(raised);
        }
        let (line, source_line) = error_location(err, &self.source);
        let message = if err.kind() == ErrorKind::OutOfFuel {
            format!("it ran past {RENDER_FUEL} steps (a loop that does not end?)")
        } else {
            describe(err)
        };
        ChatError::Render {
            message,
            line,
            source_line,
        }
    }

    /// The text the template writes right after an assistant message's content to close the
    /// turn (`<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`), trimmed; `None` when turns are not
    /// closed by any marker.
    ///
    /// It renders `[user, assistant]` without a generation prompt (again with a leading system
    /// message if the template rejects that) and reads what follows the assistant's content. If
    /// that begins with a tag (`<...>`), the end of turn is that first tag: what may follow it is
    /// the next turn's opening, which some templates write unasked. Otherwise it is the first
    /// line. If nothing follows the last message, the text between an assistant message and the
    /// next user message is used instead, less the user turn's own opening.
    ///
    /// Set the special tokens first: some templates (Mistral's, Phi's) close turns with
    /// `eos_token`. A closing of several tags (Command-A's `<|END_TEXT|><|END_OF_TURN_TOKEN|>`)
    /// gives its first, which is where the reply's text ends.
    pub fn end_of_turn_text(&self) -> Result<Option<String>, ChatError> {
        const USER: &str = "AkunuProbeUserOne";
        const REPLY: &str = "AkunuProbeAssistantReply";
        const USER2: &str = "AkunuProbeUserTwo";
        let msg = |role: &str, text: &str| serde_json::json!({ "role": role, "content": text });
        let probe = |prefix: &[Json], rest: &[Json]| {
            let mut messages = prefix.to_vec();
            messages.extend_from_slice(rest);
            let mut request = ChatRequest::new(messages);
            request.add_generation_prompt = false;
            self.render(&request)
        };

        let mut last_err = None;
        let mut found = None;
        for prefix in [vec![], vec![msg("system", "AkunuProbeSystem")]] {
            match probe(&prefix, &[msg("user", USER), msg("assistant", REPLY)]) {
                Ok(text) => {
                    found = Some((prefix, text));
                    break;
                }
                Err(err) => last_err = Some(err),
            }
        }
        let Some((prefix, text)) = found else {
            return Err(last_err.unwrap_or_else(|| request_error("no probe rendered")));
        };
        let Some(at) = text.rfind(REPLY) else {
            return Ok(None);
        };
        let tail = text[at + REPLY.len()..].trim_matches(is_py_space);
        if !tail.is_empty() {
            return Ok(Some(first_marker(tail).to_owned()));
        }

        // Nothing after the last message: look between turns instead.
        let Ok(two) = probe(
            &prefix,
            &[
                msg("user", USER),
                msg("assistant", REPLY),
                msg("user", USER2),
            ],
        ) else {
            return Ok(None);
        };
        let (Some(a), Some(b)) = (two.find(REPLY), two.rfind(USER2)) else {
            return Ok(None);
        };
        if b < a + REPLY.len() {
            return Ok(None);
        }
        let between = &two[a + REPLY.len()..b];
        // The user turn's opening ends `between`; it is what precedes the first user content.
        let opening = probe(&prefix, &[msg("user", USER)])
            .ok()
            .and_then(|one| one.find(USER).map(|i| one[..i].to_owned()))
            .unwrap_or_default();
        let shared = common_suffix_len(between, &opening);
        let closing = between[..between.len() - shared].trim_matches(is_py_space);
        if closing.is_empty() {
            return Ok(None);
        }
        Ok(Some(
            first_marker(between.trim_matches(is_py_space)).to_owned(),
        ))
    }
}

/// The first `<...>` tag of `text` if it starts with one, else its first line.
fn first_marker(text: &str) -> &str {
    if text.starts_with('<') {
        if let Some(end) = text.find('>') {
            return &text[..=end];
        }
    }
    text.lines()
        .next()
        .unwrap_or(text)
        .trim_matches(is_py_space)
}

/// Length in bytes of the longest common suffix, on character boundaries.
fn common_suffix_len(a: &str, b: &str) -> usize {
    a.chars()
        .rev()
        .zip(b.chars().rev())
        .take_while(|(x, y)| x == y)
        .map(|(x, _)| x.len_utf8())
        .sum()
}

/// The most non-blank characters outside string literals one `{{ }}` or `{% %}` tag may hold.
/// Real templates stay under 250; the bound caps how deep an expression's syntax tree can be.
const MAX_EXPRESSION: usize = 4096;

/// Stack for the compiler thread. minijinja's code generator recurses once per level of an
/// expression (`----1` is as deep as it is long); [`MAX_EXPRESSION`] levels take about 8 MiB in
/// a debug build, more than a default thread has.
const COMPILE_STACK: usize = 16 << 20;

/// Refuses a template with a tag longer than [`MAX_EXPRESSION`], which could only be a
/// generated or hostile one, before the compiler recurses into it.
fn check_expression_sizes(source: &str) -> Result<(), ChatError> {
    let bytes = source.as_bytes();
    let mut i = 0;
    let mut in_raw = false;
    while i + 1 < bytes.len() {
        let open = &bytes[i..i + 2];
        let close: &[u8] = match open {
            b"{{" if !in_raw => b"}}",
            b"{%" => b"%}",
            b"{#" if !in_raw => b"#}",
            _ => {
                i += 1;
                continue;
            }
        };
        let start = i;
        let mut j = i + 2;
        let mut count = 0;
        let mut quote = None;
        // Comments and raw text are not parsed, so only their end matters.
        let literal = open == b"{#" || in_raw;
        while j < bytes.len() {
            let c = bytes[j];
            match quote {
                _ if literal => {}
                Some(q) => {
                    if c == b'\\' {
                        j += 1;
                    } else if c == q {
                        quote = None;
                    }
                }
                None if c == b'\'' || c == b'"' => {
                    quote = Some(c);
                    count += 1;
                }
                None if !c.is_ascii_whitespace() => count += 1,
                None => {}
            }
            if quote.is_none() && bytes[j..].starts_with(close) {
                break;
            }
            j += 1;
        }
        let tag = &source[start..j.min(source.len())];
        if open == b"{%" {
            let body = tag[2..].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
            if in_raw {
                in_raw = body != "endraw";
            } else {
                in_raw = body == "raw";
            }
        }
        if count > MAX_EXPRESSION && !literal {
            let line = source[..start].matches('\n').count() + 1;
            let text: String = tag.chars().take(60).collect();
            return Err(ChatError::Syntax {
                message: format!(
                    "a tag holds {count} characters of expression, more than the {MAX_EXPRESSION} allowed"
                ),
                line: Some(line),
                source_line: Some(format!("{text}...")),
            });
        }
        i = j + 2;
    }
    Ok(())
}

/// Compiles on a thread with a stack deep enough for any expression [`check_expression_sizes`]
/// lets through (the compiled form is flat, so rendering needs no such stack).
fn compile(source: &str) -> Result<Environment<'static>, Error> {
    let build = || {
        let mut env = environment();
        env.add_template_owned(NAME, source.to_owned())?;
        Ok(env)
    };
    std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new()
            .name("chat-template".into())
            .stack_size(COMPILE_STACK)
            .spawn_scoped(scope, build);
        match spawned {
            Ok(handle) => handle.join().unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "the template compiler failed",
                ))
            }),
            // No thread to be had: compile here, where only a tag near the bound could run out
            // of stack.
            Err(_) => build(),
        }
    })
}

/// The environment transformers renders in, rebuilt on minijinja.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
        .expect("the default delimiters are valid");
    env.set_syntax(syntax);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    // Jinja2's default: printing or iterating an undefined value is fine, using it otherwise is
    // an error.
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_debug(false);
    env.set_fuel(Some(RENDER_FUEL));
    env.set_unknown_method_callback(python_method);
    env.set_formatter(|out, _state, value| {
        let text = match value.as_str() {
            Some(s) => out.write_str(s),
            None if value.is_undefined() => Ok(()),
            None => out.write_str(&py_str(value)),
        };
        text.map_err(|_| Error::new(ErrorKind::WriteFailure, "cannot write the output"))
    });
    // Python's `None` is not iterable, and templates guard `tools | length` with exactly this
    // test (`tools is iterable and tools | length > 0`).
    env.add_test("iterable", |value: &Value| {
        !value.is_none() && value.try_iter().is_ok()
    });
    env.add_filter("tojson", tojson);
    env.add_filter("trim", trim);
    env.add_filter("string", |value: &Value| py_str(value));
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", |format: &str| {
        clock::strftime(format, clock::now_unix())
    });
    env
}

/// Marks an error as coming from `raise_exception`, so it can be told from engine errors.
#[derive(Debug)]
struct Raised(String);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: &Value) -> Result<Value, Error> {
    let message = py_str(message);
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

fn raised_message(err: &Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(raised) = e.downcast_ref::<Raised>() {
            return Some(raised.0.clone());
        }
        cur = e.source();
    }
    None
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, taking those arguments by position or by name.
fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    let args = args.0;
    if args.len() > NAMES.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    let mut given: [Value; 4] = Default::default();
    for (i, name) in NAMES.iter().enumerate() {
        let named: Option<Value> = kwargs.get(name)?;
        given[i] = match (args.get(i), named) {
            (Some(_), Some(_)) => {
                return Err(Error::new(
                    ErrorKind::TooManyArguments,
                    format!("tojson got multiple values for argument '{name}'"),
                ))
            }
            (Some(v), None) => v.clone(),
            (None, Some(v)) => v,
            (None, None) => Value::from(()),
        };
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = given;

    let indent = match indent.kind() {
        ValueKind::None | ValueKind::Undefined => None,
        ValueKind::String => Some(indent.as_str().unwrap_or_default().to_owned()),
        // Python's bools are ints here too.
        ValueKind::Number | ValueKind::Bool => {
            let n = i64::try_from(indent.clone()).map_err(|_| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson indent must be an integer",
                )
            })?;
            Some(" ".repeat(usize::try_from(n).unwrap_or(0).min(1024)))
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson indent must be an integer or a string, not {other}"),
            ))
        }
    };
    let mut style = JsonStyle::new(indent);
    if !separators.is_none() && !separators.is_undefined() {
        let parts: Vec<Value> = separators.try_iter()?.collect();
        match parts.as_slice() {
            [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                style.item_separator = item.as_str().unwrap_or_default().to_owned();
                style.key_separator = key.as_str().unwrap_or_default().to_owned();
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson separators must be a pair of strings",
                ))
            }
        }
    }
    style.sort_keys = sort_keys.is_true();
    style.ensure_ascii = ensure_ascii.is_true();
    json_dumps(value, &style).map(Value::from)
}

/// Jinja2's `trim`: `str(value).strip(chars)`, with Python's whitespace.
fn trim(value: &Value, chars: Option<Value>) -> String {
    let text = py_str(value);
    match chars.as_ref().and_then(|c| c.as_str()) {
        Some(chars) => text.trim_matches(|c| chars.contains(c)).to_owned(),
        None => text.trim_matches(is_py_space).to_owned(),
    }
}

/// Python methods on values (`.strip()`, `.split()`, `.items()`, `.get()`, ...): minijinja's
/// contrib set, with `strip`/`lstrip`/`rstrip` using Python's notion of whitespace.
fn python_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let (Some(s), "strip" | "lstrip" | "rstrip") = (value.as_str(), method) {
        let chars = match args {
            [] => None,
            [c] if c.is_none() => None,
            [c] => Some(
                c.as_str()
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::InvalidOperation,
                            format!("{method} arg must be None or str"),
                        )
                    })?
                    .to_owned(),
            ),
            _ => return Err(Error::from(ErrorKind::TooManyArguments)),
        };
        let strip = |c: char| match &chars {
            Some(set) => set.contains(c),
            None => is_py_space(c),
        };
        let out = match method {
            "strip" => s.trim_matches(strip),
            "lstrip" => s.trim_start_matches(strip),
            _ => s.trim_end_matches(strip),
        };
        return Ok(Value::from(out));
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// transformers' `{% generation %}` block only marks assistant text for training masks; it
/// renders its body unchanged. minijinja has no such tag, so it becomes an always-true `if`,
/// which keeps the whitespace control and the line numbers.
fn strip_generation_tags(source: &str) -> String {
    if !source.contains("generation") {
        return source.to_owned();
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            break;
        };
        let inner = &tag[2..end];
        let (left, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, right) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[body.len() - 1..]),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{left} {r} {right}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// `kind: detail` of a minijinja error, without its location (reported separately).
fn describe(err: &Error) -> String {
    match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    }
}

fn error_location(err: &Error, source: &str) -> (Option<usize>, Option<String>) {
    let Some(line) = err.line() else {
        return (None, None);
    };
    let text = source.lines().nth(line.saturating_sub(1)).map(|l| {
        let l = l.trim();
        match l.char_indices().nth(120) {
            Some((cut, _)) => format!("{}...", &l[..cut]),
            None => l.to_owned(),
        }
    });
    (Some(line), text)
}

/// A message as the template sees it, normalised as transformers does: null fields dropped,
/// reasoning copied to `thinking` (first) and `reasoning_content`.
fn template_message(index: usize, message: &Json) -> Result<Value, ChatError> {
    let Json::Object(fields) = message else {
        return Err(request_error(format!(
            "message {index} must be an object, got {}",
            kind(message)
        )));
    };
    match fields.get("role") {
        Some(Json::String(_)) => {}
        None | Some(Json::Null) => {
            return Err(request_error(format!("message {index} has no `role`")))
        }
        Some(other) => {
            return Err(request_error(format!(
                "message {index}: `role` must be a string, got {}",
                kind(other)
            )))
        }
    }
    let reasoning = REASONING_FIELDS
        .iter()
        .find_map(|k| fields.get(*k).filter(|v| !v.is_null()));
    let mut pairs: Vec<(&str, &Json)> = Vec::with_capacity(fields.len() + 2);
    if let Some(r) = reasoning {
        pairs.push(("thinking", r));
    }
    for (key, value) in fields.iter().filter(|(_, v)| !v.is_null()) {
        match pairs.iter_mut().find(|(k, _)| *k == key.as_str()) {
            Some(slot) => slot.1 = value,
            None => pairs.push((key.as_str(), value)),
        }
    }
    if let Some(r) = reasoning {
        match pairs.iter_mut().find(|(k, _)| *k == "reasoning_content") {
            Some(slot) => slot.1 = r,
            None => pairs.push(("reasoning_content", r)),
        }
    }
    let converted = pairs
        .into_iter()
        .map(|(k, v)| Ok((k, to_value(v, 1)?)))
        .collect::<Result<Vec<_>, ChatError>>()?;
    Ok(Value::from_pairs(converted))
}

/// JSON to a template value, keeping object key order.
fn to_value(value: &Json, depth: usize) -> Result<Value, ChatError> {
    if depth > MAX_DEPTH {
        return Err(request_error(format!(
            "the request nests deeper than {MAX_DEPTH} levels"
        )));
    }
    Ok(match value {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::from(
            items
                .iter()
                .map(|v| to_value(v, depth + 1))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Json::Object(fields) => Value::from_pairs(
            fields
                .iter()
                .map(|(k, v)| Ok((k.as_str(), to_value(v, depth + 1)?)))
                .collect::<Result<Vec<_>, ChatError>>()?,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_ifs() {
        let src = "a{% generation %}b{%- endgeneration -%}c{%+ generation +%}{% endgeneration%}{% if x %}";
        assert_eq!(
            strip_generation_tags(src),
            "a{% if true %}b{%- endif -%}c{%+ if true +%}{% endif %}{% if x %}"
        );
        assert_eq!(strip_generation_tags("no tags {% if"), "no tags {% if");
    }

    #[test]
    fn builtins_compile() {
        for b in BuiltinTemplate::ALL {
            ChatTemplate::new(b.source()).unwrap();
        }
    }

    #[test]
    fn markers() {
        assert_eq!(first_marker("<|eot_id|><|start_header_id|>"), "<|eot_id|>");
        assert_eq!(first_marker("</s>\nUser:"), "</s>");
        assert_eq!(first_marker("### End\nnext"), "### End");
        assert_eq!(common_suffix_len("x<a>", "y<a>"), 3);
        assert_eq!(common_suffix_len("é", "é"), 2);
    }
}
