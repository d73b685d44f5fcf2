//! Chat templates: built-ins, Python-compatible rendering, request validation and end-of-turn
//! discovery; and, with `$AKUNU_REFDATA/tok`, every render of `scripts/ref/chat_fixtures.py`
//! (Hugging Face transformers on the Gemma 3, Llama 3 and Qwen 3 templates, on the built-ins and
//! on small templates probing Jinja2/Python behaviour) reproduced byte for byte.

use std::path::Path;

use akunu_tokenizer::chat::{BuiltinTemplate, ChatError, ChatRequest, ChatTemplate};
use serde_json::{json, Value as Json};

fn user(text: &str) -> Json {
    json!({"role": "user", "content": text})
}

fn assistant(text: &str) -> Json {
    json!({"role": "assistant", "content": text})
}

fn system(text: &str) -> Json {
    json!({"role": "system", "content": text})
}

fn request(messages: Vec<Json>, add_generation_prompt: bool) -> ChatRequest {
    let mut r = ChatRequest::new(messages);
    r.add_generation_prompt = add_generation_prompt;
    r
}

/// Renders `template` for a one-message conversation with `vars` as extra variables.
fn render_vars(template: &str, vars: Json) -> Result<String, ChatError> {
    let t = ChatTemplate::new(template)?;
    let mut r = ChatRequest::new(vec![user("x")]);
    r.extra = vars.as_object().cloned().unwrap_or_default();
    t.render(&r)
}

fn gemma() -> ChatTemplate {
    ChatTemplate::builtin(BuiltinTemplate::Gemma).with_special_token("bos_token", "<bos>")
}

fn llama3() -> ChatTemplate {
    ChatTemplate::builtin(BuiltinTemplate::Llama3)
        .with_special_token("bos_token", "<|begin_of_text|>")
}

// ---------------------------------------------------------------------------------------------
// Built-in templates

#[test]
fn chatml_renders_exactly() {
    let t = ChatTemplate::builtin(BuiltinTemplate::ChatMl);
    let convo = vec![
        system("Be brief."),
        user("Hi"),
        assistant("Hello."),
        user("Bye"),
    ];
    assert_eq!(
        t.render(&request(convo.clone(), true)).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    assert_eq!(
        t.render(&request(vec![user("  spaced  ")], false)).unwrap(),
        "<|im_start|>user\n  spaced  <|im_end|>\n"
    );
    let parts = json!({"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]});
    assert_eq!(
        t.render(&request(vec![parts], false)).unwrap(),
        "<|im_start|>user\nab<|im_end|>\n"
    );
}

#[test]
fn llama3_renders_exactly() {
    let convo = vec![system(" Sys \n"), user("\nHi"), assistant("Hello.")];
    assert_eq!(
        llama3().render(&request(convo.clone(), false)).unwrap(),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nSys<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
    );
    assert_eq!(
        llama3().render(&request(vec![user("Q")], true)).unwrap(),
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    // Without a BOS token set, none is written.
    let bare = ChatTemplate::builtin(BuiltinTemplate::Llama3);
    assert!(bare
        .render(&request(vec![user("Q")], false))
        .unwrap()
        .starts_with("<|start_header_id|>"));
}

#[test]
fn gemma_renders_exactly() {
    let convo = vec![
        system("Be kind."),
        user(" Hi "),
        assistant("Hello."),
        user("Bye"),
    ];
    assert_eq!(
        gemma().render(&request(convo, true)).unwrap(),
        "<bos><start_of_turn>user\nBe kind.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    );
    assert_eq!(
        gemma().render(&request(vec![user("Hi")], false)).unwrap(),
        "<bos><start_of_turn>user\nHi<end_of_turn>\n"
    );
    let err = gemma()
        .render(&request(vec![user("a"), user("b")], true))
        .unwrap_err();
    assert_eq!(
        err,
        ChatError::Raised(
            "Conversation roles must alternate user/assistant/user/assistant/...".into()
        )
    );
}

#[test]
fn builtin_detection() {
    let vocab = |tokens: &'static [&'static str]| move |t: &str| tokens.contains(&t);
    use BuiltinTemplate::*;
    assert_eq!(BuiltinTemplate::detect("gemma3", vocab(&[])), Gemma);
    assert_eq!(BuiltinTemplate::detect("Gemma2", vocab(&[])), Gemma);
    assert_eq!(
        BuiltinTemplate::detect("llama", vocab(&["<start_of_turn>"])),
        Gemma
    );
    assert_eq!(
        BuiltinTemplate::detect("llama", vocab(&["<|start_header_id|>", "<|eot_id|>"])),
        Llama3
    );
    // Mistral and Llama 2 are `llama` without header tokens: not Llama 3.
    assert_eq!(
        BuiltinTemplate::detect("llama", vocab(&["[INST]", "</s>"])),
        ChatMl
    );
    assert_eq!(
        BuiltinTemplate::detect("qwen3", vocab(&["<|im_start|>"])),
        ChatMl
    );
    assert_eq!(
        BuiltinTemplate::detect("gemma3", vocab(&["<|im_start|>"])),
        ChatMl
    );
    assert_eq!(BuiltinTemplate::detect("phi3", vocab(&[])), ChatMl);
    for b in BuiltinTemplate::ALL {
        assert_eq!(b.template().source(), b.source());
        assert_eq!(b.to_string(), b.name());
    }
}

// ---------------------------------------------------------------------------------------------
// Python-compatible rendering

#[test]
fn tojson_is_python_json_dumps() {
    let data = json!({"z": 1, "a": [1.5, -0.0, 1e-7, 2.5e20, true, null, "é<&>'\"\\\n\u{1}😀"],
                      "m": {}, "l": [], "n": {"k": [{"x": 1}]}});
    let vars = json!({ "data": data });
    assert_eq!(
        render_vars("{{ data | tojson }}", vars.clone()).unwrap(),
        r#"{"z": 1, "a": [1.5, -0.0, 1e-07, 2.5e+20, true, null, "é<&>'\"\\\n\u0001😀"], "m": {}, "l": [], "n": {"k": [{"x": 1}]}}"#
    );
    assert_eq!(
        render_vars("{{ data | tojson(indent=2) }}", vars.clone()).unwrap(),
        "{\n  \"z\": 1,\n  \"a\": [\n    1.5,\n    -0.0,\n    1e-07,\n    2.5e+20,\n    true,\n    \
         null,\n    \"é<&>'\\\"\\\\\\n\\u0001😀\"\n  ],\n  \"m\": {},\n  \"l\": [],\n  \"n\": {\n    \
         \"k\": [\n      {\n        \"x\": 1\n      }\n    ]\n  }\n}"
    );
    assert_eq!(
        render_vars(
            "{{ data | tojson(indent='\t', sort_keys=true) }}",
            vars.clone()
        )
        .unwrap(),
        "{\n\t\"a\": [\n\t\t1.5,\n\t\t-0.0,\n\t\t1e-07,\n\t\t2.5e+20,\n\t\ttrue,\n\t\tnull,\n\t\t\
         \"é<&>'\\\"\\\\\\n\\u0001😀\"\n\t],\n\t\"l\": [],\n\t\"m\": {},\n\t\"n\": {\n\t\t\"k\": \
         [\n\t\t\t{\n\t\t\t\t\"x\": 1\n\t\t\t}\n\t\t]\n\t},\n\t\"z\": 1\n}"
    );
    assert_eq!(
        render_vars(
            "{{ data | tojson(separators=(',', ':'), ensure_ascii=true) }}",
            vars
        )
        .unwrap(),
        r#"{"z":1,"a":[1.5,-0.0,1e-07,2.5e+20,true,null,"\u00e9<&>'\"\\\n\u0001\ud83d\ude00"],"m":{},"l":[],"n":{"k":[{"x":1}]}}"#
    );
    assert_eq!(
        render_vars("{{ {'a': [1]} | tojson(indent=0) }}", json!({})).unwrap(),
        "{\n\"a\": [\n1\n]\n}"
    );
    // Positional arguments follow transformers' signature (ensure_ascii, indent, ...).
    assert_eq!(
        render_vars("{{ 'é' | tojson(true) }}", json!({})).unwrap(),
        r#""\u00e9""#
    );
    assert!(
        render_vars("{{ x | tojson }}", json!({})).is_err(),
        "undefined is not JSON"
    );
    assert!(render_vars("{{ 1 | tojson(bogus=1) }}", json!({})).is_err());
}

#[test]
fn key_order_is_kept() {
    // Tool schemas must come out in the order the client wrote them.
    let req: Json = serde_json::from_str(r#"{"b": 1, "a": {"y": 2, "x": 3}}"#).unwrap();
    assert_eq!(
        render_vars(
            "{{ v | tojson }} {{ v.a.items() | list }}",
            json!({ "v": req })
        )
        .unwrap(),
        r#"{"b": 1, "a": {"y": 2, "x": 3}} [('y', 2), ('x', 3)]"#
    );
}

#[test]
fn prints_like_python() {
    let out = render_vars(
        "{{ none }}|{{ true }}|{{ [1, 'a', none, 1.0] }}|{{ {'k': (1,)} }}|{{ 3 | string }}|\
         {{ ' \u{1c} x \u{3000}' | trim }}|{{ ' \u{1c}y\u{3000}'.strip() }}|{{ 'abcba'.strip('ab') }}|{{ undefined_var }}",
        json!({}),
    )
    .unwrap();
    assert_eq!(out, "None|True|[1, 'a', None, 1.0]|{'k': (1,)}|3|x|y|c|");
    assert_eq!(
        render_vars(
            "{{ ' a b '.split() }} {{ 'x,y'.split(',') | join('+') }} {{ d.get('k', 7) }}",
            json!({"d": {}})
        )
        .unwrap(),
        "['a', 'b'] x+y 7"
    );
}

#[test]
fn jinja_features_templates_use() {
    let t = "{%- set ns = namespace(n=0) -%}\
             {%- for m in messages[::-1] if m.role == 'user' -%}\
             {%- if loop.index > 1 %}{% break %}{% endif -%}\
             {%- set ns.n = ns.n + 1 -%}{{ m.content | upper }}\
             {%- endfor -%}|{{ ns.n }}|{{ messages | length }}|{{ enable_thinking is false }}";
    let mut r = request(vec![user("a"), assistant("b"), user("c")], true);
    r.extra.insert("enable_thinking".into(), json!(false));
    assert_eq!(
        ChatTemplate::new(t).unwrap().render(&r).unwrap(),
        "C|1|3|True"
    );
}

#[test]
fn trim_blocks_and_lstrip_blocks() {
    let t = "{% for m in messages %}\n    {% if true %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n";
    assert_eq!(
        ChatTemplate::new(t)
            .unwrap()
            .render(&request(vec![user("a"), user("b")], false))
            .unwrap(),
        "[a]\n[b]\n"
    );
}

#[test]
fn generation_blocks_render_their_body() {
    let t =
        "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}";
    assert_eq!(
        ChatTemplate::new(t)
            .unwrap()
            .render(&request(vec![user("a")], false))
            .unwrap(),
        "<a>"
    );
}

#[test]
fn special_tokens_and_extra_variables() {
    let t = ChatTemplate::new("{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ mine }}")
        .unwrap()
        .with_special_token("bos_token", "<s>")
        .with_special_token("eos_token", "</s>");
    let mut r = request(vec![user("x")], false);
    assert_eq!(t.render(&r).unwrap(), "<s>|</s>||");
    r.extra.insert("eos_token".into(), json!("<eos>"));
    r.extra.insert("mine".into(), json!([1, {"a": null}]));
    assert_eq!(t.render(&r).unwrap(), "<s>|<eos>||[1, {'a': None}]");
    assert_eq!(t.special_tokens().len(), 2);
}

#[test]
fn messages_are_normalised_like_transformers() {
    // Null fields vanish; reasoning under any of its names is seen as `thinking` and
    // `reasoning_content`.
    let t = ChatTemplate::new(
        "{% for m in messages %}{{ m.keys() | list }}{{ m.content is defined }}{% endfor %}",
    )
    .unwrap();
    let msgs = vec![
        json!({"role": "assistant", "content": null, "reasoning": "r"}),
        json!({"role": "assistant", "content": "c", "thinking": "t", "reasoning_content": "rc"}),
    ];
    assert_eq!(
        t.render(&request(msgs, false)).unwrap(),
        "['thinking', 'role', 'reasoning', 'reasoning_content']False\
         ['thinking', 'role', 'content', 'reasoning_content']True"
    );
    let t = ChatTemplate::new(
        "{% for m in messages %}{{ m.thinking }}/{{ m.reasoning_content }};{% endfor %}",
    )
    .unwrap();
    let msgs = vec![
        json!({"role": "assistant", "content": "c", "thinking": "t", "reasoning_content": "rc"}),
    ];
    assert_eq!(t.render(&request(msgs, false)).unwrap(), "t/rc;");
}

#[test]
fn strftime_now_gives_the_date() {
    let out = render_vars(
        "{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}",
        json!({}),
    )
    .unwrap();
    let (iso, human) = out.split_once('|').unwrap();
    let year: i32 = iso[..4].parse().unwrap();
    assert!(year >= 2024, "{out}");
    assert_eq!(iso.len(), 10);
    assert!(human.ends_with(&iso[..4]), "{out}");
}

// ---------------------------------------------------------------------------------------------
// Errors

#[test]
fn raise_exception_is_a_clean_error() {
    let err = render_vars("a{{ raise_exception('No ' ~ 'way') }}", json!({})).unwrap_err();
    assert_eq!(err, ChatError::Raised("No way".into()));
    assert_eq!(
        err.to_string(),
        "chat template rejected the conversation: No way"
    );
}

#[test]
fn syntax_errors_name_the_line() {
    let err = ChatTemplate::new("line one\n{% if x %}\n{{ y }\n").unwrap_err();
    let ChatError::Syntax {
        line, source_line, ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(*line, Some(3));
    assert_eq!(source_line.as_deref(), Some("{{ y }"));
    assert!(err.to_string().contains("line 3"), "{err}");
    assert!(ChatTemplate::new("{% if %}").is_err());
    assert!(ChatTemplate::new("{% endfor %}").is_err());
    assert!(
        ChatTemplate::new("{% generation %}").is_err(),
        "an unclosed generation block"
    );
}

#[test]
fn render_errors_name_the_line() {
    let t = ChatTemplate::new("ok\n{{ messages[0].content.nope() }}").unwrap();
    let err = t.render(&request(vec![user("x")], false)).unwrap_err();
    let ChatError::Render { line, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(*line, Some(2), "{err}");
    // Jinja2 refuses to add an undefined value to a string, and so do we.
    let err = render_vars("{{ 'a' + messages[0].missing }}", json!({})).unwrap_err();
    assert!(matches!(err, ChatError::Render { .. }), "{err:?}");
}

#[test]
fn templates_that_never_finish_are_stopped() {
    // 10^10 steps: stopped by the step budget, naming the line.
    let err = render_vars(
        "ok\n{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        json!({}),
    )
    .unwrap_err();
    let ChatError::Render { line, message, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(message.contains("steps"), "{err}");
    assert_eq!(*line, Some(2), "{err}");
    // Few steps, but a gigabyte of text: stopped by the output bound.
    let err = render_vars(
        "{% set s = 'x' * 10000 %}{% for i in range(100000) %}{{ s }}{% endfor %}",
        json!({}),
    )
    .unwrap_err();
    assert!(err.to_string().contains("output passed 64 MiB"), "{err}");
}

#[test]
fn long_conversations_fit_the_step_budget() {
    let turns = 20_000;
    let messages = (0..turns)
        .map(|i| match i % 2 {
            0 => user(&format!("question {i}")),
            _ => assistant(&format!("answer {i}")),
        })
        .collect();
    let text = gemma().render(&request(messages, true)).unwrap();
    assert!(
        text.contains("question 19998"),
        "{}",
        &text[text.len() - 200..]
    );
}

#[test]
fn malformed_requests_are_errors() {
    let t = ChatTemplate::builtin(BuiltinTemplate::ChatMl);
    let bad = |r: ChatRequest| match t.render(&r) {
        Err(ChatError::Request(msg)) => msg,
        other => panic!("{other:?}"),
    };
    assert!(bad(request(vec![], true)).contains("no messages"));
    assert!(bad(request(vec![json!("hi")], true)).contains("message 0 must be an object"));
    assert!(bad(request(vec![user("a"), json!({"content": "x"})], true))
        .contains("message 1 has no `role`"));
    assert!(bad(request(vec![json!({"role": null, "content": "x"})], true)).contains("no `role`"));
    assert!(
        bad(request(vec![json!({"role": 3, "content": "x"})], true)).contains("must be a string")
    );
    let mut r = request(vec![user("a")], true);
    r.extra.insert("messages".into(), json!([]));
    assert!(bad(r).contains("`messages`"));
    let mut deep = json!("x");
    for _ in 0..300 {
        deep = json!([deep]);
    }
    assert!(bad(request(
        vec![json!({"role": "user", "content": deep})],
        true
    ))
    .contains("deeper"));

    // Content null is dropped, as transformers does: the built-in renders an empty turn.
    let r = request(vec![json!({"role": "user", "content": null})], false);
    assert_eq!(t.render(&r).unwrap(), "<|im_start|>user\n<|im_end|>\n");
    // Odd content types reach the template, which decides.
    let r = request(vec![json!({"role": "user", "content": 5})], false);
    assert!(t.render(&r).is_err());
    let r = request(vec![json!({"role": "user", "content": {"a": 1}})], false);
    let _ = t.render(&r);
}

#[test]
fn request_from_json() {
    let body = json!({
        "model": "m", "temperature": 0.5,
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "chat_template_kwargs": {"enable_thinking": false},
    });
    let r = ChatRequest::from_json(&body).unwrap();
    assert_eq!(r.messages.len(), 1);
    assert_eq!(r.tools.as_ref().map(Vec::len), Some(1));
    assert!(r.add_generation_prompt);
    assert_eq!(r.extra.get("enable_thinking"), Some(&json!(false)));

    let err = |body: Json| match ChatRequest::from_json(&body) {
        Err(ChatError::Request(msg)) => msg,
        other => panic!("{other:?}"),
    };
    assert!(err(json!([])).contains("expected an object"));
    assert!(err(json!({})).contains("`messages` is missing"));
    assert!(err(json!({"messages": {"role": "user"}})).contains("`messages` must be an array"));
    assert!(err(json!({"messages": "hi"})).contains("`messages` must be an array"));
    assert!(err(json!({"messages": [], "tools": {}})).contains("`tools`"));
    assert!(err(json!({"messages": [], "add_generation_prompt": "yes"})).contains("boolean"));
    assert!(err(json!({"messages": [], "chat_template_kwargs": []})).contains("object"));
}

#[test]
fn deep_expressions_compile_or_are_refused() {
    // As deep as the limit allows: compiles, renders.
    let deep = format!("{{{{ 1{} }}}}", "+1".repeat(2000));
    let t = ChatTemplate::new(&deep).unwrap();
    assert_eq!(t.render(&request(vec![user("x")], false)).unwrap(), "2001");
    let deepest = format!("{{{{ {}1 }}}}", "-".repeat(4094));
    let t = ChatTemplate::new(&deepest).unwrap();
    assert_eq!(t.render(&request(vec![user("x")], false)).unwrap(), "1");
    // Longer: refused up front instead of exhausting the stack.
    for bomb in [
        format!("a\n{{{{ 1{} }}}}", "+1".repeat(100_000)),
        format!("{{{{ {}1 }}}}", "-".repeat(100_000)),
        format!("{{% set x = y{} %}}", "|e".repeat(100_000)),
    ] {
        match ChatTemplate::new(&bomb) {
            Err(ChatError::Syntax { message, .. }) => {
                assert!(message.contains("allowed"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
    // Long strings, comments and raw blocks are not expressions.
    let long = "x".repeat(100_000);
    let src = format!("{{{{ '{long}' }}}}{{# {long} #}}{{% raw %}}{{{{ {long} {{% endraw %}}");
    let out = ChatTemplate::new(&src)
        .unwrap()
        .render(&request(vec![user("x")], false))
        .unwrap();
    assert_eq!(out.len(), 2 * long.len() + 4);
}

#[test]
fn no_panics_on_hostile_templates() {
    let templates = [
        "{{ messages[99].content }}",
        "{{ messages.content.x.y }}",
        "{% for i in range(10**9) %}{% endfor %}",
        "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
        "{{ 1 / 0 }}",
        "{{ 'a' * -1 }}{{ messages | tojson(indent=-3) }}",
        "{{ messages[0].content.format(1, 2, x=3) }}",
        "{{ raise_exception() }}",
        "{{ strftime_now(none) }}",
        "{{ tools | tojson }}{{ namespace() | tojson }}",
    ];
    for src in templates {
        if let Ok(t) = ChatTemplate::new(src) {
            let _ = t.render(&request(vec![user("x")], true));
            let _ = t.end_of_turn_text();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// End of turn

#[test]
fn end_of_turn_of_builtins() {
    let eot = |t: ChatTemplate| t.end_of_turn_text().unwrap();
    assert_eq!(
        eot(ChatTemplate::builtin(BuiltinTemplate::ChatMl)).as_deref(),
        Some("<|im_end|>")
    );
    assert_eq!(eot(llama3()).as_deref(), Some("<|eot_id|>"));
    assert_eq!(eot(gemma()).as_deref(), Some("<end_of_turn>"));
    assert_eq!(
        eot(ChatTemplate::builtin(BuiltinTemplate::Gemma)).as_deref(),
        Some("<end_of_turn>")
    );
}

#[test]
fn end_of_turn_of_unusual_templates() {
    let eot = |src: &str| ChatTemplate::new(src).unwrap().end_of_turn_text();
    // Always appends the assistant header, even without a generation prompt.
    let always = "{% for m in messages %}<|h|>{{ m.role }}<|/h|>{{ m.content }}<|end|>{% endfor %}<|h|>assistant<|/h|>";
    assert_eq!(eot(always).unwrap().as_deref(), Some("<|end|>"));
    // Closes a turn only when another follows.
    let between = "{% for m in messages %}{% if not loop.first %}</s>\n{% endif %}[{{ m.role }}] {{ m.content }}{% endfor %}";
    assert_eq!(eot(between).unwrap().as_deref(), Some("</s>"));
    // No marker at all.
    let plain = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
    assert_eq!(eot(plain).unwrap(), None);
    // A plain-text marker.
    let text = "{% for m in messages %}### {{ m.role }}\n{{ m.content }}\n### End\n\n{% endfor %}";
    assert_eq!(eot(text).unwrap().as_deref(), Some("### End"));
    // Needs a system message first.
    let strict =
        "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}\
                  {% for m in messages %}<{{ m.role }}>{{ m.content }}</turn>{% endfor %}";
    assert_eq!(eot(strict).unwrap().as_deref(), Some("</turn>"));
    // Refuses everything: the error comes back.
    assert_eq!(
        eot("{{ raise_exception('never') }}").unwrap_err(),
        ChatError::Raised("never".into())
    );
    // Drops the content.
    assert_eq!(eot("{% for m in messages %}<x>{% endfor %}").unwrap(), None);
}

#[test]
fn templates_are_shareable() {
    fn check<T: Send + Sync + Clone + std::fmt::Debug>() {}
    check::<ChatTemplate>();
    check::<ChatRequest>();
    check::<ChatError>();
}

// ---------------------------------------------------------------------------------------------
// Reference renders

const TOKENIZERS: [&str; 3] = ["gemma3", "llama3", "qwen3"];

/// The chat template of `<dir>/tokenizer_config.json` (a string, or the `default` of a list of
/// named templates).
fn config_template(dir: &Path) -> String {
    let path = dir.join("tokenizer_config.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let config: Json = serde_json::from_str(&text).unwrap();
    match &config["chat_template"] {
        Json::String(s) => s.clone(),
        Json::Array(named) => named
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .expect("a default template")
            .to_owned(),
        other => panic!("{}: no chat_template ({other})", path.display()),
    }
}

/// The `*_token` entries of `<dir>/tokenizer_config.json` (a string, or `{"content": ...}`).
fn config_special_tokens(dir: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap();
    let config: Json = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for (key, value) in config.as_object().unwrap() {
        let text = match value {
            Json::String(s) => s.as_str(),
            Json::Object(o) => match o.get("content").and_then(Json::as_str) {
                Some(s) => s,
                None => continue,
            },
            _ => continue,
        };
        if key.ends_with("_token") {
            out.push((key.clone(), text.to_owned()));
        }
    }
    out
}

fn template_for(tok: &Path, name: &str) -> ChatTemplate {
    match name {
        "builtin-chatml" => ChatTemplate::builtin(BuiltinTemplate::ChatMl),
        "builtin-llama3" => ChatTemplate::builtin(BuiltinTemplate::Llama3),
        "builtin-gemma" => ChatTemplate::builtin(BuiltinTemplate::Gemma),
        real => ChatTemplate::new(&config_template(&tok.join(real))).unwrap(),
    }
}

fn first_difference(a: &str, b: &str) -> String {
    let at = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    let show = |s: &str| {
        s.chars()
            .skip(at.saturating_sub(20))
            .take(60)
            .collect::<String>()
    };
    format!("at char {at}: got {:?}, want {:?}", show(a), show(b))
}

#[test]
fn matches_transformers() {
    let Some(tok) = akunu_testutil::refdata("tok") else {
        return;
    };
    let path = tok.join("chat.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let records: Vec<Json> = serde_json::from_str(&text).unwrap();
    let mut templates = std::collections::BTreeMap::new();
    let mut failures = Vec::new();
    let mut per_template = std::collections::BTreeMap::<String, usize>::new();
    for rec in &records {
        let name = rec["template"].as_str().unwrap();
        let case = rec["name"].as_str().unwrap();
        *per_template.entry(name.to_owned()).or_default() += 1;
        let mut template = match rec["source"].as_str() {
            Some(source) => match ChatTemplate::new(source) {
                Ok(t) => t,
                Err(e) => {
                    failures.push(format!("{name}/{case}: does not compile: {e}"));
                    continue;
                }
            },
            None => templates
                .entry(name.to_owned())
                .or_insert_with(|| template_for(&tok, name))
                .clone(),
        };
        for (k, v) in rec["special_tokens"].as_object().unwrap() {
            template.set_special_token(k.clone(), v.as_str().unwrap());
        }
        let got = ChatRequest::from_json(&rec["request"]).and_then(|r| template.render(&r));
        let problem = match (&got, rec["error"].as_bool().unwrap()) {
            (Ok(out), false) => {
                let want = rec["expected"].as_str().unwrap();
                (out != want).then(|| first_difference(out, want))
            }
            (Err(e), false) => Some(format!("unexpected error: {e}")),
            (Ok(out), true) => Some(format!(
                "expected an error ({}), got {out:?}",
                rec["error_message"]
            )),
            (Err(e), true) => match (e, rec["error_type"].as_str()) {
                (ChatError::Raised(msg), Some("TemplateError")) if msg != &rec["error_message"] => {
                    Some(format!("raised {msg:?}, want {}", rec["error_message"]))
                }
                (ChatError::Raised(_), Some(t)) if t != "TemplateError" => {
                    Some(format!("raised, but transformers failed with {t}"))
                }
                (other, Some("TemplateError")) if !matches!(other, ChatError::Raised(_)) => {
                    Some(format!("want raise_exception, got {other}"))
                }
                _ => None,
            },
        };
        if let Some(p) = problem {
            failures.push(format!("{name}/{case}: {p}"));
        }
    }
    eprintln!("{} renders checked: {per_template:?}", records.len());
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    for name in TOKENIZERS {
        assert!(
            per_template.get(name).copied().unwrap_or(0) >= 12,
            "too few cases for {name}"
        );
    }
    for b in BuiltinTemplate::ALL {
        let name = format!("builtin-{}", b.name());
        assert!(
            per_template.get(&name).copied().unwrap_or(0) >= 12,
            "too few cases for {name}"
        );
    }
}

/// The Gemma built-in is meant to be Gemma 3's own format: on every shared case the reference
/// renders (or refusals) agree.
#[test]
fn gemma_builtin_agrees_with_gemma3() {
    let Some(tok) = akunu_testutil::refdata("tok") else {
        return;
    };
    let records: Vec<Json> =
        serde_json::from_str(&std::fs::read_to_string(tok.join("chat.json")).unwrap()).unwrap();
    let pick = |template: &str| -> std::collections::BTreeMap<String, (Json, Json)> {
        records
            .iter()
            .filter(|r| r["template"] == template)
            .map(|r| {
                (
                    r["name"].as_str().unwrap().to_owned(),
                    (r["expected"].clone(), r["error"].clone()),
                )
            })
            .collect()
    };
    let (real, ours) = (pick("gemma3"), pick("builtin-gemma"));
    assert!(!ours.is_empty());
    for (case, want) in &ours {
        assert_eq!(real.get(case), Some(want), "{case}");
    }
}

#[test]
fn end_of_turn_of_real_templates() {
    let Some(tok) = akunu_testutil::refdata("tok") else {
        return;
    };
    let want = [
        ("gemma3", "<end_of_turn>"),
        ("llama3", "<|eot_id|>"),
        ("qwen3", "<|im_end|>"),
    ];
    for (name, eot) in want {
        let mut t = ChatTemplate::new(&config_template(&tok.join(name))).unwrap();
        for (k, v) in config_special_tokens(&tok.join(name)) {
            t.set_special_token(k, v);
        }
        assert_eq!(
            t.end_of_turn_text().unwrap().as_deref(),
            Some(eot),
            "{name}"
        );
    }
}
