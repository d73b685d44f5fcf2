#!/usr/bin/env python3
"""Reference renders for the chat templates in crates/akunu-tokenizer (src/chat).

Usage: python scripts/ref/chat_fixtures.py TOKDIR OUT.json

TOKDIR holds one directory per tokenizer (gemma3, llama3, qwen3), each with tokenizer.json and
tokenizer_config.json. Every conversation below is rendered by Hugging Face transformers'
`apply_chat_template(..., tokenize=False)` with the tokenizer's own template, and again with
akunu's built-in fallback templates (read from the crate, rendered by jinja2 through the same
transformers call), so the Rust renderer is held to the Python one byte for byte. Small inline
templates add the Jinja2 and Python behaviour real templates rely on, one feature group each.

OUT.json is a list of records:
    {"template": "qwen3" | "builtin-chatml" | ... | "inline",
     "source": the template itself (only for "inline"),
     "name": short case name,
     "request": {"messages": [...], "tools": [...] | null,
                 "add_generation_prompt": bool, "chat_template_kwargs": {...}},
     "special_tokens": the tokenizer's special_tokens_map (the template sees these),
     "expected": rendered string | null,
     "error": bool, "error_type": exception class | null, "error_message": str | null}

None of these templates calls strftime_now, so the renders do not depend on the date.

Needs: transformers, tokenizers, jinja2.
"""

import copy
import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

TOKENIZERS = ["gemma3", "llama3", "qwen3"]

# Built-in fallback templates and the tokenizer whose special tokens they are rendered with.
BUILTIN_DIR = Path(__file__).resolve().parents[2] / "crates/akunu-tokenizer/src/chat/builtin"
BUILTINS = {"builtin-chatml": ("chatml.jinja", "qwen3"),
            "builtin-llama3": ("llama3.jinja", "llama3"),
            "builtin-gemma": ("gemma.jinja", "gemma3")}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def system(text):
    return {"role": "system", "content": text}


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather — in °C, for a city (\"quoted\", <b>tags</b> & more).",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. 東京 or Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": None},
                "days": {"type": "integer", "minimum": 1, "maximum": 10},
                "threshold": {"type": "number", "default": 0.5, "examples": [1e-7, 2.5e20, -0.0, 100.0, 3]},
                "strict": {"type": "boolean", "default": False},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.\nReturns a list of results.\t(tab)",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
TOOL_CALL_TURN = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2, "nested": {"z": [1, 2.0, None, True], "a": "x\\y\n\"q\"\u0001"}}}},
        {"id": "call_2", "type": "function",
         "function": {"name": "search", "arguments": "{\"query\": \"weather {{ today }}\"}"}},
    ],
}

# Cases every template gets: (name, messages, tools, add_generation_prompt, extra).
COMMON = [
    ("single_user", [user("Hello!")], None, False, {}),
    ("single_user_gen", [user("Hello!")], None, True, {}),
    ("system_user_gen", [system("You are a helpful assistant."), user("What is 2+2?")], None, True, {}),
    ("multi_turn_gen", [user("Hi"), assistant("Hello! How can I help?"), user("Tell me a joke.")], None, True, {}),
    ("multi_turn_end_assistant",
     [system("Be brief."), user("Hi"), assistant("Hello."), user("Bye"), assistant("Goodbye!")], None, False, {}),
    ("unicode", [user("こんにちは世界 🌍🚀 naïve café — Ωμέγα ∑ 한국어 עברית"), assistant("你好！👋🏽 ✓"),
                 user("Zero\u200bwidth and combining e\u0301")], None, True, {}),
    ("jinja_like_text",
     [user("{{ bos_token }} {% if true %}yes{% endif %} {# comment #} {{ raise_exception('x') }}"),
      assistant("{% for x in y %}{{ x }}{% endfor %} }} {{ %} {%")], None, True, {}),
    ("special_token_text",
     [user("<|im_start|>system\nfake<|im_end|> <start_of_turn>model <|eot_id|> <bos> <|begin_of_text|> </s>")],
     None, True, {}),
    ("content_parts",
     [{"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "text", "text": " this."}]},
      {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
      {"role": "user", "content": [{"type": "text", "text": "More."}]}], None, True, {}),
    ("whitespace",
     [system("\n  Sys prompt with spaces  \n\n"), user("\n\n  Hello there  \n\t\n"),
      assistant("  \n Answer \n\n"), user("   ")], None, True, {}),
    ("empty_content", [user(""), assistant(""), user("x")], None, True, {}),
    ("long_history",
     [user(f"Question {i}?") if i % 2 == 0 else assistant(f"Answer {i}.") for i in range(9)], None, True, {}),
    ("extra_variable", [user("Hi")], None, True, {"custom_flag": True, "date_string": "26 Jul 2024"}),
    ("quotes_backslashes", [user("He said \"hi\" and 'bye' \\ back\\slash \\n not newline")], None, True, {}),
    ("system_only", [system("Only a system prompt.")], None, True, {}),
    ("assistant_null_content", [user("Hi"), {"role": "assistant", "content": None}, user("Again")], None, True, {}),
    ("alternation_user_user", [user("One"), user("Two")], None, True, {}),
    ("assistant_first", [assistant("I start."), user("Ok")], None, True, {}),
    ("unknown_role", [{"role": "developer", "content": "Dev note"}, user("Hi")], None, True, {}),
    ("tools_ignored_or_used", [user("Weather in Zürich?")], [WEATHER_TOOL, SEARCH_TOOL], True, {}),
    ("empty_messages", [], None, True, {}),
]

QWEN_ONLY = [
    ("thinking_disabled", [user("Hi")], None, True, {"enable_thinking": False}),
    ("thinking_enabled", [user("Hi")], None, True, {"enable_thinking": True}),
    ("think_in_history",
     [user("2+2?"), assistant("<think>\nSimple sum.\n</think>\n\n4"), user("3+3?"),
      assistant("<think>\nAgain simple.\n</think>\n\n6")], None, False, {}),
    ("think_before_last_query",
     [user("2+2?"), assistant("<think>\nSimple sum.\n</think>\n\n4"), user("3+3?")], None, True,
     {"enable_thinking": False}),
    ("reasoning_content_field",
     [user("2+2?"), {"role": "assistant", "content": "4", "reasoning_content": "Adding two and two."}],
     None, False, {}),
    ("tools_roundtrip",
     [system("You are a weather bot."), user("Weather in Zürich and news?"), TOOL_CALL_TURN,
      {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21.5}"},
      {"role": "tool", "tool_call_id": "call_2", "name": "search", "content": "Sunny all week."},
      assistant("It is 21.5 °C and sunny.")], [WEATHER_TOOL, SEARCH_TOOL], True, {}),
    ("tools_no_system", [user("Search for cats")], [SEARCH_TOOL], True, {"enable_thinking": False}),
    ("tool_call_with_content",
     [user("Weather?"),
      {"role": "assistant", "content": "Let me check.",
       "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "rainy"}], [WEATHER_TOOL], True, {}),
    ("tools_empty_list", [user("Hi")], [], True, {}),
    ("tool_response_as_user",
     [user("<tool_response>\nx\n</tool_response>"), assistant("ok")], None, True, {}),
]


# Templates that exercise the Jinja2 and Python behaviour chat templates lean on (printing of
# non-strings, str/dict methods, filters, tests, loop variables, whitespace control, tojson,
# errors). Each is rendered once, on INLINE_CASE, with the qwen3 tokenizer's special tokens.
INLINE_TEMPLATES = [
    ('print_inputs',
     '{{ messages }}|{{ tools }}|{{ add_generation_prompt }}|{{ documents }}'),
    ('arithmetic',
     '{{ 1.0 }}|{{ 2 / 4 }}|{{ 4 / 2 }}|{{ 7 // 2 }}|{{ 2 ** 10 }}|{{ 7 % 3 }}|{{ -7 // 2 }}|{{ 1e20 }}|{{ 0.1 + 0.2 }}'),
    ('concat_and_literals',
     "{{ 'x' ~ 1 }}|{{ 'x' ~ true }}|{{ 'x' ~ none }}|{{ 'x' ~ [1] }}|{{ [1,2] + [3] }}|{{ (1, 'a') }}|{{ {'a': none} }}"),
    ('str_split_strip',
     "{{ 'a,b,,c'.split(',') }}|{{ 'a b  c'.split() }}|{{ 'a-b-c'.split('-', 1) }}|{{ ' x '.lstrip() }}|{{ ' x '.rstrip() }}|{{ 'xxhixx'.strip('x') }}"),
    ('str_predicates',
     "{{ 'Hello'.startswith(('He', 'x')) }}|{{ 'Hello'.endswith('lo') }}|{{ 'a.b'.replace('.', '!') }}|{{ 'hello world'.title() }}|{{ 'hello'.capitalize() }}|{{ 'HeLLo'.upper() }}{{ 'HeLLo'.lower() }}"),
    ('str_misc',
     "{{ 'hello'.find('l') }}|{{ 'hello'.count('l') }}|{{ '-'.join(['a', 'b']) }}|{{ 'a\\nb'.splitlines() }}|{{ '{} and {}'.format(1, 'x') }}|{{ '42'.isdigit() }}|{{ 'abc'.isalpha() }}"),
    ('dict_methods',
     "{% for k, v in messages[2].tool_calls[0].function.arguments.items() %}{{ k }}={{ v }};{% endfor %}|{{ messages[0].keys() | list }}|{{ messages[0].values() | list }}|{{ messages[0].get('nope', 'dflt') }}|{{ messages[0].get('nope') }}"),
    ('select_map_filters',
     "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='role') | join(',') }}|{{ messages | rejectattr('role', 'equalto', 'user') | list | length }}|{{ messages | first }}|{{ (messages | last).role }}"),
    ('default_sort_filters',
     "{{ none | default('d') }}|{{ undefined_thing | default('d') }}|{{ '' | default('d', true) }}|{{ [3,1,2] | sort }}|{{ [1,1,2] | unique | list }}|{{ [1,2] | reverse | list }}|{{ '12' | int + 1 }}|{{ '1.5' | float }}|{{ 2.567 | round(2) }}|{{ [1,2,3] | sum }}"),
    ('indent_join_filters',
     "{{ 'a\\nb' | indent(2) }}|{{ 'x' | upper }}|{{ 'a b' | replace(' ', '_') }}|{{ {'b': 1, 'a': 2} | dictsort }}|{{ 'hello' | length }}|{{ [1, 2] | join }}|{{ ['a', none, true] | join(',') }}"),
    ('tests',
     "{{ none is none }}|{{ 'x' is string }}|{{ {} is mapping }}|{{ [] is sequence }}|{{ 'x' is iterable }}|{{ 1 is number }}|{{ 1 is integer }}|{{ true is boolean }}|{{ 1.0 is float }}|{{ 2 is even }}|{{ 'a' in 'cat' }}|{{ 'z' not in ['a'] }}|{{ x is defined }}"),
    ('loop_variables',
     "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.previtem.role if loop.previtem else '-' }}{{ loop.cycle('a', 'b') }};{% endfor %}"),
    ('macro_set_filter_blocks',
     '{%- macro turn(role, text) -%}\n<{{ role }}>{{ text | trim }}</{{ role }}>\n{%- endmacro -%}\n{%- for m in messages if m.content is string -%}\n{{ turn(m.role, m.content) }}\n{% endfor -%}\n{% set block %}  captured {{ messages | length }}  {% endset %}[{{ block }}]\n{% filter upper %}shout{% endfilter %}'),
    ('slicing',
     "{{ 'abc'[::-1] }}|{{ 'abc'[-1] }}|{{ messages[-1].role }}|{{ messages[1:3] | length }}|{{ 'a' if false }}|{{ 'abc'[1:] }}|{{ messages[0].content[0] }}"),
    ('whitespace_control',
     "{#- comment line -#}\n{% for m in messages %}\n    {% if m.role == 'user' %}\n  U: {{ m.content }}\n    {% else %}\n  O: {{ m.role }}\n    {% endif %}\n{% endfor %}\n{%+ if true %}  kept{% endif %}\n  {%- if true +%}\nx\n{% endif %}\n{% raw %}{{ not rendered }}{% endraw %}"),
    ('namespace',
     "{%- set ns = namespace(found=false, count=0) -%}\n{%- for m in messages -%}{%- if m.role == 'assistant' -%}{%- set ns.found = true -%}{%- endif -%}{%- set ns.count = ns.count + 1 -%}{%- endfor -%}\n{{ ns.found }} {{ ns.count }}"),
    ('tojson_indent',
     '{{ tools | tojson(indent=4) }}\n{{ messages[2].tool_calls[0].function.arguments | tojson }}\n{{ messages[2] | tojson }}'),
    ('special_tokens_vars',
     '{{ messages[0].content | trim }}|{{ date_string }}|{{ bos_token is defined }}|{{ eos_token }}'),
    ('undefined_attribute_error',
     '{{ messages.nope.deeper }}'),
    ('type_error',
     "{{ 'a' + 1 }}"),
    ('unknown_method_error',
     '{{ messages[0].content.nosuchmethod() }}'),
    ('dict_range_subscript',
     "{{ dict(a=1, b='x') }}|{{ range(3) | list }}|{{ [1,2,3][1] }}|{{ {'k': 'v'}['k'] }}|{{ {'k': 'v'}.k }}"),
    ('map_selectattr',
     "{{ messages | map(attribute='role') | list }}|{{ messages | map('upper') | list if false else '' }}|{{ ['a','b'] | map('upper') | list }}|{{ messages | selectattr('tool_calls', 'defined') | list | length }}|{{ messages | selectattr('tool_calls') | list | length }}"),
    ('operators',
     "{{ 'a' * 3 }}|{{ 3 * 'ab' }}|{{ -1 }}|{{ not true }}|{{ true and 'x' }}|{{ false or 'y' }}|{{ none or 'z' }}|{{ 1 == 1.0 }}|{{ 'a' < 'b' }}|{{ [1] == [1] }}"),
    ('print_dict',
     '{{ messages[0] }}'),
    ('iterable_test',
     "{{ none is iterable }}|{{ tools is iterable and tools | length > 0 }}|{{ nothing is iterable }}|{{ 'ab' is iterable }}|{{ 1 is iterable }}"),
    ('tojson_of_iterator_error',
     "{{ [1, 2] | reverse | tojson }}"),
    ('tojson_options',
     "{{ messages[2] | tojson(indent=2, sort_keys=true) }}|{{ tools | tojson(separators=(',', ':')) }}|{{ 'é' | tojson(ensure_ascii=true) }}"),
    ('repr_escapes',
     '{{ \'\\u00e9\\t\\x01\' }}|{{ [\'\\u00e9\\t\\x01\', "it\'s", \'say "hi"\', \'both \\\'"\'] }}\n'),
]
INLINE_CASE = ("inline",
               [system("  Sys  "), user("Hello, World! 42"),
                {"role": "assistant", "content": "a,b,,c",
                 "tool_calls": [{"type": "function",
                                 "function": {"name": "f", "arguments": {"x": 1.5, "y": [True, None]}}}]},
                {"role": "user", "content": [{"type": "text", "text": "p1"}, {"type": "image"}]}],
               [{"name": "f"}], True, {"date_string": "26 Jul 2024"})


def render(tok, case, template=None):
    name, messages, tools, add_generation_prompt, extra = case
    kwargs = dict(extra)
    if template is not None:
        kwargs["chat_template"] = template
    try:
        text = tok.apply_chat_template(copy.deepcopy(messages), tools=copy.deepcopy(tools),
                                       add_generation_prompt=add_generation_prompt, tokenize=False,
                                       **kwargs)
        return {"expected": text, "error": False, "error_type": None, "error_message": None}
    except Exception as e:  # noqa: BLE001 - any failure of the reference is an expected error
        return {"expected": None, "error": True, "error_type": type(e).__name__, "error_message": str(e)}


def record(template, tok, case, source=None):
    name, messages, tools, add_generation_prompt, extra = case
    special = {k: v for k, v in tok.special_tokens_map.items() if isinstance(v, str)}
    out = {"template": template, "name": name,
           "request": {"messages": messages, "tools": tools,
                       "add_generation_prompt": add_generation_prompt, "chat_template_kwargs": extra},
           "special_tokens": special}
    out.update(render(tok, case, source))
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tokdir, out = Path(sys.argv[1]), Path(sys.argv[2])
    toks = {name: AutoTokenizer.from_pretrained(str(tokdir / name)) for name in TOKENIZERS}
    records = []
    for name in TOKENIZERS:
        cases = COMMON + (QWEN_ONLY if name == "qwen3" else [])
        records += [record(name, toks[name], case) for case in cases]
    for template, (file, tok) in BUILTINS.items():
        source = (BUILTIN_DIR / file).read_text()
        records += [record(template, toks[tok], case, source) for case in COMMON]
    for name, source in INLINE_TEMPLATES:
        rec = record("inline", toks["qwen3"], (name,) + INLINE_CASE[1:], source)
        rec["source"] = source
        records.append(rec)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, ensure_ascii=False, indent=1))
    errors = sum(r["error"] for r in records)
    print(f"{out}: {len(records)} renders ({errors} expected errors)")


if __name__ == "__main__":
    main()
