"""API tests of `akunu serve`: the official `openai` client, raw HTTP errors, limits, the queue,
cancellation, memory, metrics, tokenization, model management, shutdown and batching.

Every server is started by conftest.py from AKUNU_BIN with AKUNU_MODEL. Generations are short
and greedy where their text is compared; timeouts are generous (the machine may be busy).
"""

from __future__ import annotations

import json
import math
import re
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from conftest import Server

TIMEOUT = 180  # seconds for any one HTTP request
COUNT_PROMPT = "1, 2, 3, 4, 5, 6,"  # continues " 7, 8, ..." without ever stopping
STORY_PROMPT = "Once upon a time"
CHAT = [{"role": "user", "content": "Write a short poem about the sea."}]


# ---------------------------------------------------------------------------------------------
# helpers


def post(srv: Server, path: str, body=None, *, content=None, headers=None, timeout=TIMEOUT):
    kw = {"json": body} if content is None else {"content": content}
    return httpx.post(srv.url + path, headers=headers, timeout=timeout, **kw)


def get(srv: Server, path: str, headers=None, timeout=TIMEOUT):
    return httpx.get(srv.url + path, headers=headers, timeout=timeout)


def assert_error(r: httpx.Response, status: int, *, param=..., code=..., kind=None) -> dict:
    """An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}}."""
    assert r.status_code == status, f"expected {status}, got {r.status_code}: {r.text}"
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str), err
    if param is not ...:
        assert err["param"] == param, err
    if code is not ...:
        assert err["code"] == code, err
    if kind is not None:
        assert err["type"] == kind, err
    return err


def assert_healthy(srv: Server):
    assert srv.alive(), f"server exited with {srv.proc.poll()}"
    r = get(srv, "/health", timeout=30)
    assert r.status_code == 200 and r.json() == {"status": "ok"}, r.text


def sse(r: httpx.Response) -> list:
    """The `data:` payloads of a server-sent-event response, JSON-decoded except [DONE]."""
    out = []
    for line in r.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert line == "" or line.startswith(":"), f"unexpected SSE line {line!r}"
    return out


def stream_post(srv: Server, path: str, body: dict, headers=None) -> list:
    with httpx.stream("POST", srv.url + path, json=body, headers=headers, timeout=TIMEOUT) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return sse(r)


def stream_text(events: list, endpoint: str = "chat") -> str:
    text = ""
    for e in events:
        if e == "[DONE]" or "error" in e:
            continue
        for c in e["choices"]:
            text += (c["delta"].get("content") or "") if endpoint == "chat" else c["text"]
    return text


def tokenize(srv: Server, text: str, add_special: bool = True) -> list[int]:
    r = post(srv, "/v1/tokenize", {"content": text, "add_special": add_special})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def model_meta(srv: Server) -> dict:
    r = get(srv, "/v1/models")
    assert r.status_code == 200, r.text
    return r.json()["data"][0]


def parse_metrics(text: str) -> tuple[dict, dict]:
    """Checks Prometheus text format line by line; returns ({(name, labels): value}, types)."""
    name_re = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
    label_re = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
    sample = re.compile(rf"^({name_re})(?:\{{({label_re}(?:,{label_re})*)?\}})? (\S+)(?: -?\d+)?$")
    samples, types, helps = {}, {}, {}
    assert text.endswith("\n"), "exposition must end with a newline"
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_ = line[7:].partition(" ")
            assert re.fullmatch(name_re, name), line
            assert name not in helps, f"second HELP for {name}"
            helps[name] = help_
        elif line.startswith("# TYPE "):
            parts = line[7:].split(" ")
            assert len(parts) == 2, line
            name, kind = parts
            assert re.fullmatch(name_re, name), line
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            assert name not in types, f"second TYPE for {name}"
            types[name] = kind
        elif line.startswith("#"):
            continue
        else:
            m = sample.match(line)
            assert m, f"not a valid sample line: {line!r}"
            name, labels, value = m.group(1), m.group(2) or "", m.group(3)
            v = float(value)  # raises on garbage; accepts +Inf, NaN
            family = name
            if name not in types:
                for suffix in ("_bucket", "_sum", "_count"):
                    if name.endswith(suffix) and types.get(name[: -len(suffix)]) == "histogram":
                        family = name[: -len(suffix)]
            assert family in types, f"sample {name} before its # TYPE"
            if types[family] == "counter":
                assert v >= 0, line
            key = (name, labels)
            assert key not in samples, f"duplicate sample {line!r}"
            samples[key] = v
    return samples, types


def metrics(srv: Server, headers=None) -> dict:
    r = get(srv, "/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain"), r.headers
    return parse_metrics(r.text)[0]


def metric(samples: dict, name: str, **labels) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return samples.get((name, want), 0.0)


def wait_idle(srv: Server, model: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(srv)
        if (metric(m, "akunu_active_sequences", model=model) == 0
                and metric(m, "akunu_queue_depth", model=model) == 0):
            return m
        assert time.monotonic() < deadline, "the server did not become idle"
        time.sleep(0.2)


def send_raw(srv: Server, path: str, body: dict) -> socket.socket:
    """Sends a request over a raw socket (to close it whenever the test likes)."""
    data = json.dumps(body).encode()
    s = socket.create_connection((srv.host, srv.port), timeout=TIMEOUT)
    s.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {srv.host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def wait_metric(srv: Server, cond, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(srv)
        if cond(m):
            return m
        assert time.monotonic() < deadline, "metrics never reached the expected state"
        time.sleep(0.05)


def open_stream_socket(srv: Server, path: str, body: dict, chunks: int) -> socket.socket:
    """Sends a streaming request over a raw socket and reads until `chunks` SSE events came."""
    s = send_raw(srv, path, body)
    got = b""
    while got.count(b"data: ") < chunks:
        part = s.recv(65536)
        assert part, f"connection closed early: {got!r}"
        got += part
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    return s


def warm(srv: Server, path: str, body: dict):
    """Runs a request's prompt once, so that the runs compared after it find it in the prefix
    cache: whether a prompt is evaluated whole or mostly taken from the cache changes its
    logits slightly until the kernels are batch-invariant (see
    test_seed_reproducible_across_prefix_cache), and those tests compare other things."""
    body = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "logprobs",
                                                      "top_logprobs", "stop")}
    r = post(srv, path, {**body, "max_tokens": 1})
    assert r.status_code == 200, r.text


def warm_client(client: openai.OpenAI, **kw):
    kw = {k: v for k, v in kw.items() if k not in ("stream", "stream_options", "logprobs",
                                                  "top_logprobs", "stop", "max_tokens",
                                                  "max_completion_tokens")}
    if "messages" in kw:
        client.chat.completions.create(**kw, max_tokens=1)
    else:
        client.completions.create(**kw, max_tokens=1)


def unique_tokens(srv: Server) -> int:
    return tokenize(srv, "hello", add_special=False)[0]


# ---------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def model_id(server) -> str:
    return model_meta(server)["id"]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=TIMEOUT,
                         max_retries=0)


@pytest.fixture(scope="module")
def limits_server(session_servers) -> Server:
    """Small context and body limit."""
    return session_servers("-np", "2", "-c", "256", "--max-body", "16384", name="limits")


@pytest.fixture(scope="module")
def auth_server(session_servers) -> Server:
    return session_servers("-np", "1", "-c", "256", "--api-key", "sekrit-key-42", "-n", "3",
                           name="auth")


@pytest.fixture(scope="module")
def queue_server(session_servers) -> Server:
    """One slot and one queue place."""
    return session_servers("-np", "1", "--max-queue", "1", "-c", "1024", "-a", "queue-model",
                           name="queue")


class Greedy:
    """Greedy reference outputs, computed once per (endpoint, body)."""

    def __init__(self):
        self.cache = {}

    def get(self, srv: Server, path: str, body: dict) -> dict:
        key = (srv.url, path, json.dumps(body, sort_keys=True))
        if key not in self.cache:
            warm(srv, path, body)
            r = post(srv, path, body)
            assert r.status_code == 200, r.text
            self.cache[key] = r.json()
        return self.cache[key]


@pytest.fixture(scope="module")
def greedy() -> Greedy:
    return Greedy()


# ---------------------------------------------------------------------------------------------
# 1. the official openai client


def test_models_list(client, server, model_id):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == [model_id]
    assert model_id == server.model_path.rsplit("/", 1)[-1].removesuffix(".gguf")
    m = client.models.retrieve(model_id)
    assert m.id == model_id and m.object == "model"
    assert_error(get(server, "/v1/models/no-such-model"), 404, code="model_not_found")


def test_chat_stream_matches_non_stream(client, server, model_id):
    kw = dict(model=model_id, messages=CHAT, max_tokens=24, temperature=0)
    warm_client(client, **kw)
    whole = client.chat.completions.create(**kw)
    assert whole.object == "chat.completion"
    assert whole.model == model_id
    assert whole.id.startswith("chatcmpl-")
    choice = whole.choices[0]
    assert choice.message.role == "assistant"
    text = choice.message.content
    assert isinstance(text, str) and text.strip()
    assert choice.finish_reason == "length"
    assert whole.usage.completion_tokens == 24
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 24

    chunks = list(client.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    *body, last = chunks
    assert last.choices == [] and last.usage is not None, last
    assert all(c.usage is None for c in body)
    finishes = [c.choices[0].finish_reason for c in body]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    streamed = "".join(c.choices[0].delta.content or "" for c in body)
    assert streamed == text
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert last.usage.completion_tokens == 24

    # prompt_tokens is the templated conversation's length (exactly, for Gemma's template).
    content_tokens = len(tokenize(server, CHAT[0]["content"], add_special=False))
    if model_meta(server)["meta"]["architecture"] == "gemma3":
        rendered = f"<start_of_turn>user\n{CHAT[0]['content']}<end_of_turn>\n<start_of_turn>model\n"
        assert whole.usage.prompt_tokens == len(tokenize(server, rendered, add_special=True))
    else:
        assert whole.usage.prompt_tokens > content_tokens


def test_stream_without_usage_option_has_no_usage(client, model_id):
    chunks = list(client.chat.completions.create(
        model=model_id, messages=CHAT, max_tokens=3, temperature=0, stream=True))
    assert chunks and all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completions_stream_matches_non_stream(client, server, model_id):
    kw = dict(model=model_id, prompt=COUNT_PROMPT, max_tokens=16, temperature=0)
    warm_client(client, **kw)
    whole = client.completions.create(**kw)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    text = whole.choices[0].text
    assert text.startswith(" 7, 8, 9"), text
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.prompt_tokens == len(tokenize(server, COUNT_PROMPT))
    assert whole.usage.completion_tokens == 16

    # With logprobs=1 every token comes with an entry, so tokens can be counted.
    chunks = list(client.completions.create(
        **kw, stream=True, logprobs=1, stream_options={"include_usage": True}))
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 16
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert "".join(c.choices[0].text for c in body) == text
    n_streamed = sum(len(c.choices[0].logprobs.tokens) for c in body if c.choices[0].logprobs)
    assert n_streamed == last.usage.completion_tokens
    assert body[-1].choices[0].finish_reason == "length"


def test_completions_token_prompt(client, server, model_id):
    ids = tokenize(server, COUNT_PROMPT)
    warm_client(client, model=model_id, prompt=ids)
    r = client.completions.create(model=model_id, prompt=ids, max_tokens=8, temperature=0)
    ref = client.completions.create(model=model_id, prompt=COUNT_PROMPT, max_tokens=8,
                                    temperature=0)
    assert r.usage.prompt_tokens == len(ids)
    assert r.choices[0].text == ref.choices[0].text


def test_stream_multibyte_text(client, model_id):
    """Characters split over several tokens come out whole, streamed or not."""
    kw = dict(model=model_id, messages=[{"role": "user", "content": "List three colors."}],
              max_tokens=10, temperature=0)
    warm_client(client, **kw)
    text = client.chat.completions.create(**kw).choices[0].message.content
    pieces = [c.choices[0].delta.content or ""
              for c in client.chat.completions.create(**kw, stream=True)]
    assert "".join(pieces) == text
    assert "\ufffd" not in text and all("\ufffd" not in p for p in pieces)
    if model_id.startswith("gemma-3-270m"):
        assert any(ord(ch) > 0x2000 for ch in text), f"no multi-byte text to check: {text!r}"


def test_seed_reproducible(client, model_id):
    def run(seed):
        r = client.completions.create(model=model_id, prompt=STORY_PROMPT, max_tokens=16,
                                      temperature=0.8, seed=seed)
        return r.choices[0].text

    run(1234)  # puts the prompt in a slot's cache, so that the runs compared below match
    a, b = run(1234), run(1234)
    assert a == b
    others = {run(s) for s in (1, 2, 3)} | {a}
    assert len(others) >= 2, "different seeds at temperature 0.8 all gave the same text"

    kw = dict(model=model_id, messages=CHAT, max_tokens=12, temperature=0.8, seed=77)
    client.chat.completions.create(**kw)
    chat = [client.chat.completions.create(**kw).choices[0].message.content for _ in range(2)]
    assert chat[0] == chat[1]


DICKENS = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was "
           "the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, "
           "it was the season of Light, it was the season of Darkness, it was the spring of hope, "
           "it was the winter of despair, we had everything before us, we had nothing before us")


def test_prefix_cache_does_not_change_logits(server):
    """A prompt gives the same log-probabilities (so the same text, greedy or seeded) whether it
    is evaluated whole or found in the prefix cache but for its last token. Needs kernels whose
    rows do not depend on how many rows a pass holds (batch invariance)."""
    ids = tokenize(server, DICKENS, add_special=False)
    bos = tokenize(server, "x")[0]
    problems = []
    for n in (5, 6, 8, 11, 16, 64):
        start = n % 7 + 3  # a different slice for each length: nothing but BOS in any cache
        prompt = [bos] + ids[start:start + n - 1]
        body = {"prompt": prompt, "max_tokens": 4, "temperature": 0.8, "seed": 99,
                "logprobs": 1}
        runs = []
        for _ in range(2):
            r = post(server, "/v1/completions", body)
            assert r.status_code == 200, r.text
            runs.append(r.json())
        cached = [b["usage"]["prompt_tokens_details"]["cached_tokens"] for b in runs]
        assert cached[1] == n - 1 and cached[0] < n - 2, (n, cached)
        texts = [b["choices"][0]["text"] for b in runs]
        lps = [b["choices"][0]["logprobs"]["token_logprobs"] for b in runs]
        if texts[0] != texts[1] or lps[0][0] != pytest.approx(lps[1][0], abs=1e-4):
            problems.append(
                f"prompt of {n} tokens, {n - cached[0]} evaluated: {texts[0]!r}, logprobs "
                f"{[round(x, 5) for x in lps[0]]}\n"
                f"prompt of {n} tokens,  1 evaluated: {texts[1]!r}, logprobs "
                f"{[round(x, 5) for x in lps[1]]}")
    assert not problems, "\n".join(problems)


def _stop_at(text: str, start: int, length: int) -> tuple[str, str]:
    """A stop string from `text` starting near `start`, and the text before its first use."""
    for i in range(start, len(text) - length):
        stop = text[i:i + length]
        if stop.strip() == stop and stop.isalpha():
            return stop, text[:text.find(stop)]
    raise AssertionError(f"no stop string candidate in {text!r}")


def test_stop_strings_completions(client, server, model_id, greedy):
    base = greedy.get(server, "/v1/completions",
                      {"prompt": STORY_PROMPT, "max_tokens": 24, "temperature": 0})
    text = base["choices"][0]["text"]
    stop, expected = _stop_at(text, len(text) // 3, 4)
    assert expected and len(expected) < len(text)
    kw = dict(model=model_id, prompt=STORY_PROMPT, max_tokens=24, temperature=0)
    r = client.completions.create(**kw, stop=stop)
    assert r.choices[0].text == expected
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 24
    r = client.completions.create(**kw, stop=["\u2603never-there", stop, "zzzq"])
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(**kw, stop=[stop], stream=True))
    assert "".join(c.choices[0].text for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_stop_strings_chat(client, server, model_id, greedy):
    base = greedy.get(server, "/v1/chat/completions",
                      {"messages": CHAT, "max_tokens": 24, "temperature": 0})
    text = base["choices"][0]["message"]["content"]
    # A stop string that starts inside a word, so inside a token: the text before it in that
    # token must still come out.
    stop, expected = _stop_at(text, len(text) // 2 + 1, 3)
    kw = dict(model=model_id, messages=CHAT, max_tokens=24, temperature=0)
    r = client.chat.completions.create(**kw, stop=stop)
    assert r.choices[0].message.content == expected
    assert r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(**kw, stop=["QQQQ", stop])
    assert r.choices[0].message.content == expected and r.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(**kw, stop=[stop], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_max_tokens_and_max_completion_tokens(client, server, model_id):
    warm_client(client, model=model_id, messages=CHAT)
    warm_client(client, model=model_id, prompt=COUNT_PROMPT)
    r = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=5,
                                       temperature=0)
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    r2 = client.chat.completions.create(model=model_id, messages=CHAT,
                                        max_completion_tokens=7, temperature=0)
    assert r2.usage.completion_tokens == 7 and r2.choices[0].finish_reason == "length"
    assert r2.choices[0].message.content.startswith(r.choices[0].message.content)
    r3 = client.completions.create(model=model_id, prompt=COUNT_PROMPT, max_tokens=3,
                                   temperature=0)
    r4 = client.completions.create(model=model_id, prompt=COUNT_PROMPT, max_tokens=8,
                                   temperature=0)
    assert r3.usage.completion_tokens == 3 and r3.choices[0].text.startswith(" 7")
    assert r4.usage.completion_tokens == 8 and r4.choices[0].text.startswith(r3.choices[0].text)
    assert len(r4.choices[0].text) > len(r3.choices[0].text)
    assert_error(post(server, "/v1/chat/completions",
                      {"messages": CHAT, "max_tokens": 2, "max_completion_tokens": 2}),
                 400, param="max_tokens")


def _check_chat_logprobs(content: list, text: str, top_n: int, greedy_: bool) -> int:
    """Checks chat logprob entries; returns how many picked a token that was not the argmax."""
    not_argmax = 0
    for e in content:
        assert e.logprob <= 0 and math.isfinite(e.logprob), e
        assert len(e.top_logprobs) == top_n, e
        tops = [t.logprob for t in e.top_logprobs]
        assert all(t <= 0 for t in tops), e
        assert tops == sorted(tops, reverse=True), e
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token or "\ufffd" in e.token
        is_top = e.top_logprobs[0].token == e.token and e.top_logprobs[0].bytes == e.bytes
        listed = [t for t in e.top_logprobs if t.bytes == e.bytes]
        for t in listed:
            assert t.logprob == pytest.approx(e.logprob, abs=1e-5), e
        if not listed:
            assert e.logprob <= tops[-1] + 1e-6, f"an unlisted token beats a listed one: {e}"
        ge_all = e.logprob >= tops[0] - 1e-6
        if greedy_:
            assert is_top, f"greedy pick is not the most likely token: {e}"
        tied = abs(e.logprob - tops[0]) <= 1e-6
        assert ge_all == is_top or tied, f"chosen >= every alternative only for the argmax: {e}"
        not_argmax += not is_top
    if greedy_:
        joined = b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace")
        assert joined == text
    return not_argmax


def test_chat_logprobs(client, model_id):
    kw = dict(model=model_id, messages=CHAT, max_tokens=12, logprobs=True, top_logprobs=3)
    warm_client(client, **kw)
    r = client.chat.completions.create(**kw, temperature=0)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 12
    _check_chat_logprobs(content, r.choices[0].message.content, 3, greedy_=True)

    # Streamed entries are the same.
    chunks = list(client.chat.completions.create(**kw, temperature=0, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == \
        [(e.token, round(e.logprob, 4)) for e in content]

    # Sampled: the chosen token may be any of them, but its logprob tops the list only when
    # it is the argmax.
    r = client.chat.completions.create(**kw, temperature=1.5, seed=5,
                                       extra_body={"top_k": 0, "top_p": 1.0, "min_p": 0.0})
    _check_chat_logprobs(r.choices[0].logprobs.content, r.choices[0].message.content, 3,
                         greedy_=False)

    # logprobs without top_logprobs: entries with empty alternatives.
    r = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=4,
                                       temperature=0, logprobs=True)
    assert len(r.choices[0].logprobs.content) == 4
    assert all(e.top_logprobs == [] and e.logprob <= 0 for e in r.choices[0].logprobs.content)
    # Without logprobs: none.
    r = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=2,
                                       temperature=0)
    assert r.choices[0].logprobs is None


def test_completions_logprobs(client, model_id):
    kw = dict(model=model_id, prompt=STORY_PROMPT, max_tokens=12, temperature=0, logprobs=3)
    warm_client(client, **kw)
    r = client.completions.create(**kw)
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert n == 12
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == \
        len(lp.text_offset) == n
    text = r.choices[0].text
    assert "".join(lp.tokens) == text
    offset = 0
    for tok, p, top, off in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset):
        assert off == offset
        offset += len(tok)
        assert p <= 0
        assert 1 <= len(top) <= 3 and all(v <= 0 for v in top.values())
        assert tok in top and top[tok] == pytest.approx(p, abs=1e-5)
        assert p >= max(top.values()) - 1e-6  # greedy: the argmax
    chunks = list(client.completions.create(**kw, stream=True))
    s_tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    s_offsets = [o for c in chunks if c.choices[0].logprobs
                 for o in c.choices[0].logprobs.text_offset]
    assert s_tokens == lp.tokens and s_offsets == lp.text_offset


def test_user_accepted(client, server, model_id):
    r = client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=2,
                                       temperature=0, user="pytest-user-7")
    assert r.choices[0].message.content
    # The request log names the user.
    deadline = time.monotonic() + 10
    while "pytest-user-7" not in server.log():
        assert time.monotonic() < deadline, "user not in the request log"
        time.sleep(0.1)


def test_openai_client_errors(client, model_id):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=CHAT, max_tokens=1)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=CHAT, n=2)
    assert e.value.param == "n"


# ---------------------------------------------------------------------------------------------
# 2. errors over raw HTTP


@pytest.mark.parametrize("content", [b"{bad", b"", b'{"messages": [', b"\xff\xfe{}", b"nul",
                                     b"[]", b"42", b'"x"'])
def test_malformed_json(server, content):
    for path in ("/v1/chat/completions", "/v1/completions"):
        r = post(server, path, content=content, headers={"content-type": "application/json"})
        assert_error(r, 400, kind="invalid_request_error")
    assert_healthy(server)


BAD_FIELDS = [
    ("chat", {"temperature": "hot"}, "temperature"),
    ("chat", {"temperature": 3.5}, "temperature"),
    ("chat", {"messages": 5}, "messages"),
    ("chat", {"messages": []}, "messages"),
    ("chat", {"messages": [{"content": "no role"}]}, "messages"),
    ("chat", {"max_tokens": -1}, "max_tokens"),
    ("chat", {"max_tokens": 1.5}, "max_tokens"),
    ("chat", {"max_completion_tokens": "10"}, "max_completion_tokens"),
    ("chat", {"stop": 3}, "stop"),
    ("chat", {"stop": ["ok", 3]}, "stop"),
    ("chat", {"stop": ["s"] * 17}, "stop"),
    ("chat", {"top_p": "x"}, "top_p"),
    ("chat", {"top_k": -2}, "top_k"),
    ("chat", {"seed": "x"}, "seed"),
    ("chat", {"stream": "yes"}, "stream"),
    ("chat", {"stream_options": 1}, "stream_options"),
    ("chat", {"stream_options": {"bogus": True}}, "stream_options.bogus"),
    ("chat", {"logprobs": "yes"}, "logprobs"),
    ("chat", {"top_logprobs": 2}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"n": 2}, "n"),
    ("chat", {"frobnicate": 1}, "frobnicate"),
    ("chat", {"tools": [{"type": "function"}]}, "tools"),
    ("chat", {"logit_bias": {"1": 5}}, "logit_bias"),
    ("chat", {"response_format": {"type": "json_object"}}, "response_format"),
    ("chat", {"user": 5}, "user"),
    ("chat", {"model": 5}, "model"),
    ("completions", {"prompt": None}, "prompt"),
    ("completions", {"prompt": 5}, "prompt"),
    ("completions", {"prompt": []}, "prompt"),
    ("completions", {"prompt": ["a", "b"]}, "prompt"),
    ("completions", {"prompt": [1, -3]}, "prompt"),
    ("completions", {"prompt": [4_000_000_000]}, "prompt"),
    ("completions", {"echo": True}, "echo"),
    ("completions", {"logprobs": 21}, "logprobs"),
    ("completions", {"logprobs": True}, "logprobs"),
    ("completions", {"n": 2}, "n"),
    ("completions", {"messages": CHAT}, "messages"),
]


@pytest.mark.parametrize("endpoint,fields,param", BAD_FIELDS,
                         ids=[f"{e}-{p}-{i}" for i, (e, _, p) in enumerate(BAD_FIELDS)])
def test_bad_field(server, endpoint, fields, param):
    if endpoint == "chat":
        body = {"messages": CHAT, "max_tokens": 1, **fields}
        path = "/v1/chat/completions"
    else:
        body = {"prompt": COUNT_PROMPT, "max_tokens": 1, **fields}
        path = "/v1/completions"
    if fields.get("prompt", 0) is None:
        del body["prompt"]
    err = assert_error(post(server, path, body), 400, param=param, kind="invalid_request_error")
    assert param.split(".")[-1] in err["message"] or param in ("messages", "prompt"), err
    assert_healthy(server)


def test_prompt_out_of_vocabulary(server):
    n_vocab = model_meta(server)["meta"]["n_vocab"]
    assert_error(post(server, "/v1/completions", {"prompt": [2, n_vocab], "max_tokens": 1}),
                 400, param="prompt")
    r = post(server, "/v1/completions", {"prompt": [2, n_vocab - 1], "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert_healthy(server)


def test_unknown_model_and_route(server):
    for path, body in [("/v1/chat/completions", {"messages": CHAT, "model": "gpt-17"}),
                       ("/v1/completions", {"prompt": "x", "model": "gpt-17"}),
                       ("/v1/tokenize", {"content": "x", "model": "gpt-17"})]:
        assert_error(post(server, path, body), 404, param="model", code="model_not_found")
    for path in ("/v1/nothing", "/v2/chat/completions", "/v1/chat/completions/x"):
        assert_error(post(server, path, {"messages": CHAT}), 404)
        assert_error(get(server, path), 404)
    # The paths without /v1.
    r = post(server, "/chat/completions", {"messages": CHAT, "max_tokens": 1})
    assert r.status_code == 200 and r.json()["object"] == "chat.completion", r.text
    r = post(server, "/completions", {"prompt": "x", "max_tokens": 1})
    assert r.status_code == 200 and r.json()["object"] == "text_completion", r.text
    # A route with the wrong method.
    assert get(server, "/v1/chat/completions").status_code == 405
    assert_healthy(server)


def test_body_limit(limits_server):
    srv = limits_server
    big = json.dumps({"messages": CHAT, "max_tokens": 1, "user": "x" * 40_000}).encode()
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/tokenize"):
        assert_error(post(srv, path, content=big, headers={"content-type": "application/json"}),
                     413)
    assert_healthy(srv)
    # Just under the limit is fine.
    ok = {"messages": CHAT, "max_tokens": 1, "user": "x" * 12_000}
    assert len(json.dumps(ok)) < 16384
    r = post(srv, "/v1/chat/completions", ok)
    assert r.status_code == 200, r.text


def test_context_limits(limits_server):
    srv = limits_server
    meta = model_meta(srv)["meta"]
    assert meta["n_ctx"] == 256
    tok = unique_tokens(srv)
    long = [2] + [tok] * 300
    for path, body in [
        ("/v1/completions", {"prompt": long, "max_tokens": 4}),
        ("/v1/completions", {"prompt": "hello " * 400}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello " * 400}]}),
        ("/v1/completions", {"prompt": [2] + [tok] * 255}),  # exactly n_ctx
    ]:
        assert_error(post(srv, path, body), 400, code="context_length_exceeded")
        assert_healthy(srv)
    # Prompt + max_tokens over the context.
    prompt = [2] + [tok] * 199
    assert_error(post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 57}), 400,
                 code="context_length_exceeded")
    assert_error(post(srv, "/v1/completions",
                      {"prompt": prompt, "max_tokens": 100, "stream": True}), 400,
                 code="context_length_exceeded")
    for huge in (2**64 - 1, 2**64 - 100):
        assert_error(post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": huge}), 400,
                     param="max_tokens", code="context_length_exceeded")
        assert_healthy(srv)
    # Exactly the context: accepted.
    r = post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 56, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 200
    # No max_tokens: runs to the end of the context and says "length".
    prompt = [2] + [tok] * 243
    r = post(srv, "/v1/completions", {"prompt": prompt, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length", body
    assert body["usage"]["completion_tokens"] in (256 - 244, 256 - 244 + 1), body["usage"]
    assert_healthy(srv)


def test_auth(auth_server):
    srv = auth_server
    body = {"messages": CHAT, "max_tokens": 2, "temperature": 0}
    for headers in [None, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit-key-42"},
                    {"Authorization": "Basic sekrit-key-42"},
                    {"Authorization": "Bearer sekrit-key-4"},
                    {"Authorization": "Bearer sekrit-key-421"}]:
        err = assert_error(post(srv, "/v1/chat/completions", body, headers=headers), 401,
                           kind="authentication_error")
        assert err["code"] == "invalid_api_key"
        assert_error(get(srv, "/v1/models", headers=headers), 401)
        assert_error(get(srv, "/metrics", headers=headers), 401)
        assert_error(post(srv, "/v1/tokenize", {"content": "x"}, headers=headers), 401)
    good = {"Authorization": "Bearer sekrit-key-42"}
    r = post(srv, "/v1/chat/completions", body, headers=good)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
    assert get(srv, "/v1/models", headers=good).status_code == 200
    # -n 3: the token limit of a request that gives none.
    r = post(srv, "/v1/completions", {"prompt": COUNT_PROMPT, "temperature": 0}, headers=good)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    assert r.json()["choices"][0]["finish_reason"] == "length"
    metrics(srv, headers=good)
    # /health needs no key.
    assert_healthy(srv)
    # The openai client sends the key as a bearer token.
    ok = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekrit-key-42", max_retries=0,
                       timeout=TIMEOUT)
    assert ok.models.list().data
    bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0, timeout=TIMEOUT)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    # No auth check on the body before the key: a malformed body without a key is a 401.
    r = post(srv, "/v1/chat/completions", content=b"{bad")
    assert_error(r, 401)


def test_queue_overflow(queue_server, greedy):
    srv = queue_server
    # -a names the model; its file name still finds it.
    assert model_meta(srv)["id"] == "queue-model"
    stem = srv.model_path.rsplit("/", 1)[-1]
    for name in (stem, stem.removesuffix(".gguf"), "QUEUE-MODEL"):
        r = post(srv, "/v1/completions", {"prompt": "x", "max_tokens": 1, "model": name})
        assert r.status_code == 200 and r.json()["model"] == "queue-model", r.text
    body = {"prompt": COUNT_PROMPT, "max_tokens": 16, "temperature": 0}
    ref = greedy.get(srv, "/v1/completions", body)["choices"][0]["text"]
    n = 8
    barrier = threading.Barrier(n)

    def fire(i):
        barrier.wait()
        return post(srv, "/v1/completions", body)

    with ThreadPoolExecutor(n) as ex:
        results = list(ex.map(fire, range(n)))
    codes = sorted(r.status_code for r in results)
    assert set(codes) <= {200, 503}, codes
    assert codes.count(503) >= 1, f"no request was refused: {codes}"
    assert codes.count(200) >= 1, codes
    for r in results:
        if r.status_code == 503:
            assert_error(r, 503, kind="server_error")
            assert int(r.headers["retry-after"]) >= 1, r.headers
        else:
            b = r.json()
            assert b["choices"][0]["text"] == ref
            assert b["usage"]["completion_tokens"] == 16
    assert_healthy(srv)
    wait_idle(srv, model_meta(srv)["id"])
    r = post(srv, "/v1/completions", body)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == ref


# ---------------------------------------------------------------------------------------------
# 3. a client that disconnects frees its slot


def test_disconnect_frees_slot(queue_server, greedy):
    srv = queue_server
    model = model_meta(srv)["id"]
    wait_idle(srv, model)
    before = metrics(srv)
    s = open_stream_socket(srv, "/v1/completions",
                           {"prompt": COUNT_PROMPT, "max_tokens": 900, "temperature": 0,
                            "stream": True}, chunks=2)
    m = metrics(srv)
    assert metric(m, "akunu_active_sequences", model=model) == 1
    s.close()
    t0 = time.monotonic()
    # The single slot is free again: a new request runs (the stream had ~900 tokens to go).
    body = {"prompt": COUNT_PROMPT, "max_tokens": 8, "temperature": 0}
    r = post(srv, "/v1/completions", body)
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["usage"]["completion_tokens"] == 8 and b["choices"][0]["text"].startswith(" 7, 8")
    after = wait_idle(srv, model, timeout=20)
    generated = (metric(after, "akunu_completion_tokens_total", model=model)
                 - metric(before, "akunu_completion_tokens_total", model=model))
    assert generated < 300, f"the abandoned stream kept generating ({generated} tokens)"
    assert took < 60, f"the next request took {took:.1f} s"
    # The same with a chat stream, cancelled before its first token.
    s = open_stream_socket(srv, "/v1/chat/completions",
                           {"messages": CHAT, "max_tokens": 900, "stream": True}, chunks=1)
    s.close()
    wait_idle(srv, model, timeout=30)

    # A non-streaming request whose client goes away.
    before = metrics(srv)
    s = send_raw(srv, "/v1/completions",
                 {"prompt": COUNT_PROMPT, "max_tokens": 900, "temperature": 0})
    wait_metric(srv, lambda m: metric(m, "akunu_completion_tokens_total", model=model)
                > metric(before, "akunu_completion_tokens_total", model=model))
    s.close()
    after = wait_idle(srv, model, timeout=30)
    generated = (metric(after, "akunu_completion_tokens_total", model=model)
                 - metric(before, "akunu_completion_tokens_total", model=model))
    assert generated < 300, f"the abandoned request kept generating ({generated} tokens)"

    # A request that leaves while waiting for the slot never runs.
    before = metrics(srv)
    running = open_stream_socket(srv, "/v1/completions",
                                 {"prompt": COUNT_PROMPT, "max_tokens": 60, "temperature": 0,
                                  "stream": True}, chunks=1)
    waiting = send_raw(srv, "/v1/completions",
                       {"prompt": STORY_PROMPT, "max_tokens": 900, "stream": True})
    wait_metric(srv, lambda m: metric(m, "akunu_queue_depth", model=model) == 1)
    waiting.close()
    wait_metric(srv, lambda m: metric(m, "akunu_queue_depth", model=model) == 0)
    got = b""
    while b"[DONE]" not in got:
        part = running.recv(65536)
        assert part, got[-300:]
        got += part
    running.close()
    after = wait_idle(srv, model, timeout=30)
    generated = (metric(after, "akunu_completion_tokens_total", model=model)
                 - metric(before, "akunu_completion_tokens_total", model=model))
    assert generated < 60 + 100, f"the abandoned queued request ran ({generated} tokens)"
    assert_healthy(srv)


def test_request_timeout(server_factory):
    srv = server_factory("-np", "1", "-c", "1024", "--timeout", "2", name="timeout")
    model = model_meta(srv)["id"]
    body = {"prompt": COUNT_PROMPT, "max_tokens": 900, "temperature": 0}
    t0 = time.monotonic()
    assert_error(post(srv, "/v1/completions", body), 504, kind="server_error")
    assert time.monotonic() - t0 < 30
    wait_idle(srv, model, timeout=20)
    events = stream_post(srv, "/v1/completions", {**body, "stream": True})
    assert events[-1] == "[DONE]"
    err = events[-2]
    assert set(err) == {"error"} and err["error"]["type"] == "server_error", err
    assert stream_text(events[:-2], "completions").startswith(" 7, 8")
    m = wait_idle(srv, model, timeout=20)
    # Both cut-off sequences stopped: a sequence that ran to its end would alone make 900
    # tokens. (Two seconds each make 500-650 on a 2-core CPU, so a tighter bound is a race.)
    assert metric(m, "akunu_completion_tokens_total", model=model) < 900
    r = post(srv, "/v1/completions", {**body, "max_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert_healthy(srv)


# ---------------------------------------------------------------------------------------------
# 4. memory returns to its baseline after a burst


def test_memory_returns_to_baseline(server_factory):
    srv = server_factory("-np", "4", "-c", "1024", name="memory")
    model = model_meta(srv)["id"]
    tok = unique_tokens(srv)
    long_prompt = [2] + [tok] * 150

    def chat(i, stream=False):
        b = {"messages": [{"role": "user", "content": f"Tell me about the number {i}."}],
             "max_tokens": 6, "temperature": 0.7, "seed": i}
        if stream:
            return stream_post(srv, "/v1/chat/completions", {**b, "stream": True})
        return post(srv, "/v1/chat/completions", b)

    def job(i):
        kind = i % 10
        if kind == 0:
            r = post(srv, "/v1/chat/completions", content=b"{nope")
            assert r.status_code == 400
        elif kind == 1:
            r = post(srv, "/v1/completions", {"prompt": "x", "frob": 1})
            assert r.status_code == 400
        elif kind == 2:
            s = open_stream_socket(srv, "/v1/completions",
                                   {"prompt": COUNT_PROMPT, "max_tokens": 200, "stream": True},
                                   chunks=2)
            s.close()
        elif kind == 3:
            r = post(srv, "/v1/completions", {"prompt": long_prompt, "max_tokens": 4,
                                              "logprobs": 5})
            assert r.status_code == 200, r.text
        elif kind in (4, 5):
            events = chat(i, stream=True)
            assert events[-1] == "[DONE]"
        elif kind == 6:
            r = post(srv, "/v1/completions", {"prompt": [2] + [tok] * 2000})
            assert r.status_code == 400
        elif kind == 7:
            r = post(srv, "/v1/tokenize", {"content": "hello world " * 50, "with_pieces": True})
            assert r.status_code == 200
        else:
            r = chat(i)
            assert r.status_code == 200, r.text

    def burst(n):
        with ThreadPoolExecutor(6) as ex:
            list(ex.map(job, range(n)))
        wait_idle(srv, model)
        time.sleep(1.0)

    burst(12)  # warm-up: every kind of request, every slot
    base = srv.rss_kib()
    burst(50)
    after = srv.rss_kib()
    grew = (after - base) / 1024
    print(f"\nRSS: warm baseline {base / 1024:.1f} MiB, after 50 more requests "
          f"{after / 1024:.1f} MiB (+{grew:.1f} MiB)")
    assert grew < 64, f"RSS grew by {grew:.1f} MiB (baseline {base} KiB, after {after} KiB)"
    assert_healthy(srv)


# ---------------------------------------------------------------------------------------------
# 5. /metrics


def test_metrics(server, model_id):
    wait_idle(server, model_id)
    m0 = metrics(server)
    usages = []
    r = post(server, "/v1/completions", {"prompt": COUNT_PROMPT, "max_tokens": 5,
                                         "temperature": 0})
    assert r.status_code == 200
    usages.append(r.json()["usage"])
    events = stream_post(server, "/v1/chat/completions",
                         {"messages": CHAT, "max_tokens": 6, "temperature": 0, "stream": True,
                          "stream_options": {"include_usage": True}})
    usages.append(events[-2]["usage"])
    post(server, "/v1/completions", {"prompt": COUNT_PROMPT, "frob": 1})
    m1 = wait_idle(server, model_id)

    def delta(name, **labels):
        return metric(m1, name, **labels) - metric(m0, name, **labels)

    assert delta("akunu_requests_total", route="/v1/completions", status="200") == 1
    assert delta("akunu_requests_total", route="/v1/chat/completions", status="200") == 1
    assert delta("akunu_requests_total", route="/v1/completions", status="400") == 1
    assert delta("akunu_requests_total", route="/metrics", status="200") >= 1
    assert delta("akunu_completion_tokens_total", model=model_id) == 5 + 6
    evaluated = sum(u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"]
                    for u in usages)
    assert delta("akunu_prompt_tokens_total", model=model_id) == evaluated
    assert delta("akunu_forward_passes_total", model=model_id) >= 5 + 6
    for h in ("akunu_time_to_first_token_seconds", "akunu_generation_duration_seconds"):
        assert delta(f"{h}_count") == 2, h
        assert delta(f"{h}_sum") > 0
        buckets = sorted(((float(k[1].split('"')[1]), v) for k, v in m1.items()
                          if k[0] == f"{h}_bucket"), key=lambda kv: kv[0])
        counts = [v for _, v in buckets]
        assert counts == sorted(counts), f"{h} buckets are not cumulative"
        assert buckets[-1][0] == math.inf and buckets[-1][1] == metric(m1, f"{h}_count")
    assert metric(m1, "akunu_active_sequences", model=model_id) == 0
    assert metric(m1, "akunu_uptime_seconds") > metric(m0, "akunu_uptime_seconds")
    # Unknown paths do not grow the label set.
    get(server, "/no/such/path/12345")
    m2 = metrics(server)
    assert not any("12345" in k[1] for k in m2)
    assert metric(m2, "akunu_requests_total", route="other", status="404") >= 1


def test_metrics_parser_rejects_garbage():
    """The format check above is itself able to fail."""
    with pytest.raises(AssertionError):
        parse_metrics("akunu_x 1\n")  # no TYPE
    with pytest.raises(AssertionError):
        parse_metrics("# TYPE a counter\na{b=c} 1\n")  # unquoted label
    with pytest.raises((AssertionError, ValueError)):
        parse_metrics("# TYPE a gauge\na one\n")
    parse_metrics('# HELP a x\n# TYPE a histogram\na_bucket{le="+Inf"} 1\na_sum 2\na_count 1\n')


# ---------------------------------------------------------------------------------------------
# 6. tokenize / detokenize


def test_tokenize_round_trip(server):
    for text in ["Hello world", "  leading spaces and\nnew lines\t", "ça va? 日本語 🙂",
                 "<start_of_turn>user"]:
        ids = tokenize(server, text, add_special=False)
        assert ids and all(isinstance(i, int) for i in ids)
        r = post(server, "/v1/detokenize", {"tokens": ids})
        assert r.status_code == 200, r.text
        assert r.json() == {"content": text}
    with_bos = tokenize(server, "Hello world")
    assert with_bos[1:] == tokenize(server, "Hello world", add_special=False)
    assert len(with_bos) == len(tokenize(server, "Hello world", add_special=False)) + 1
    r = post(server, "/v1/tokenize", {"content": "Hello world", "with_pieces": True,
                                      "add_special": False})
    pieces = r.json()["tokens"]
    assert [p["id"] for p in pieces] == tokenize(server, "Hello world", add_special=False)
    assert "".join(p["piece"] for p in pieces) == "Hello world"
    # Special-token text is parsed as one token, unless asked not to.
    special = tokenize(server, "<start_of_turn>", add_special=False)
    plain = post(server, "/v1/tokenize", {"content": "<start_of_turn>", "add_special": False,
                                          "parse_special": False}).json()["tokens"]
    if model_meta(server)["meta"]["architecture"] == "gemma3":
        assert len(special) == 1 and len(plain) > 1
    # Legacy paths.
    r = post(server, "/tokenize", {"content": "Hello"})
    assert r.status_code == 200 and r.json()["tokens"] == tokenize(server, "Hello")


def test_tokenize_errors(server):
    n_vocab = model_meta(server)["meta"]["n_vocab"]
    for tokens in [[-1], ["a"], [1.5], [n_vocab], [1, 2**40], "1,2", None, {"0": 1}]:
        body = {} if tokens is None else {"tokens": tokens}
        assert_error(post(server, "/v1/detokenize", body), 400, param="tokens")
    r = post(server, "/v1/detokenize", {"tokens": [n_vocab - 1]})
    assert r.status_code == 200
    assert post(server, "/v1/detokenize", {"tokens": []}).json() == {"content": ""}
    assert_error(post(server, "/v1/tokenize", {}), 400, param="content")
    assert_error(post(server, "/v1/tokenize", {"content": 5}), 400, param="content")
    assert_error(post(server, "/v1/tokenize", {"content": "x", "add_special": "no"}), 400,
                 param="add_special")
    assert_error(post(server, "/v1/tokenize", content=b"{"), 400)
    assert_healthy(server)


# ---------------------------------------------------------------------------------------------
# 7. model management


def test_model_load_unload(server_factory):
    srv = server_factory("-np", "1", "-c", "256", name="models")
    path = srv.model_path
    first = model_meta(srv)["id"]
    chat = {"messages": CHAT, "max_tokens": 4, "temperature": 0}
    ref = post(srv, "/v1/chat/completions", chat).json()["choices"][0]["message"]["content"]

    r = post(srv, "/v1/models/unload", {"model": first})
    assert r.status_code == 200 and r.json()["unloaded"] is True, r.text
    assert get(srv, "/v1/models").json()["data"] == []
    assert_error(post(srv, "/v1/chat/completions", {**chat, "model": first}), 404,
                 code="model_not_found")
    r = post(srv, "/v1/chat/completions", chat)
    assert_error(r, 503)
    assert int(r.headers["retry-after"]) >= 1
    assert get(srv, "/health").status_code == 503
    assert_error(post(srv, "/v1/models/unload", {"model": first}), 404, code="model_not_found")

    assert_error(post(srv, "/v1/models/load", {"model": "/nonexistent/m.gguf", "id": "y"}), 400,
                 param="model")
    assert_error(post(srv, "/v1/models/load", {"model": "/etc/hostname", "id": "y"}), 400,
                 param="model")
    assert_error(post(srv, "/v1/models/load", {"id": "y"}), 400, param="model")
    assert_error(post(srv, "/v1/models/load", {"model": 5}), 400, param="model")
    assert_error(post(srv, "/v1/models/load", {"model": path, "id": ""}), 400, param="id")

    r = post(srv, "/v1/models/load", {"model": path, "id": "x"})
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "x"
    assert [m["id"] for m in get(srv, "/v1/models").json()["data"]] == ["x"]
    assert_healthy(srv)
    r = post(srv, "/v1/chat/completions", {**chat, "model": "x"})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "x" and r.json()["choices"][0]["message"]["content"] == ref
    assert post(srv, "/v1/chat/completions", chat).json()["model"] == "x"
    assert_error(post(srv, "/v1/models/load", {"model": path, "id": "x"}), 409)

    # Unloading while a stream runs ends the stream (with an error event, then [DONE]).
    with httpx.stream("POST", srv.url + "/v1/completions",
                      json={"model": "x", "prompt": COUNT_PROMPT, "max_tokens": 200,
                            "temperature": 0, "stream": True}, timeout=TIMEOUT) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        events = []
        for line in lines:
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 2:
                    break
        r = post(srv, "/v1/models/unload", {"model": "x"})
        assert r.status_code == 200, r.text
        for line in lines:
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]", events[-3:]
    tail = json.loads(events[-2])
    assert "error" in tail and tail["error"]["code"] == "model_unloaded", tail
    assert len(events) < 150
    r = post(srv, "/v1/models/load", {"model": path})
    assert r.status_code == 200 and r.json()["id"] == first, r.text
    assert_healthy(srv)

    # Two models at once, one with an id that needs escaping in metric labels.
    odd = 'we"ird\\id'
    r = post(srv, "/v1/models/load", {"model": path, "id": odd})
    assert r.status_code == 200, r.text
    assert [m["id"] for m in get(srv, "/v1/models").json()["data"]] == [first, odd]
    r = post(srv, "/v1/chat/completions", {**chat, "model": odd})
    assert r.status_code == 200 and r.json()["model"] == odd, r.text
    assert r.json()["choices"][0]["message"]["content"] == ref
    m = metrics(srv)
    assert metric(m, "akunu_completion_tokens_total",
                  model=odd.replace("\\", "\\\\").replace('"', '\\"')) == 4
    assert post(srv, "/v1/chat/completions", chat).json()["model"] == first
    assert post(srv, "/v1/models/unload", {"model": odd}).status_code == 200
    assert [m["id"] for m in get(srv, "/v1/models").json()["data"]] == [first]


def test_model_management_off(server_factory):
    srv = server_factory("-np", "1", "-c", "256", "--no-model-management", name="nomm")
    model = model_meta(srv)["id"]
    assert_error(post(srv, "/v1/models/unload", {"model": model}), 404)
    assert_error(post(srv, "/v1/models/load", {"model": srv.model_path, "id": "z"}), 404)
    assert [m["id"] for m in get(srv, "/v1/models").json()["data"]] == [model]
    assert_healthy(srv)


# ---------------------------------------------------------------------------------------------
# 8. graceful shutdown


def _read_stream_in_thread(srv: Server, body: dict, first: threading.Event, out: list):
    def run():
        try:
            with httpx.stream("POST", srv.url + "/v1/completions", json=body,
                              timeout=TIMEOUT) as r:
                out.append(r.status_code)
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        out.append(line[6:])
                        first.set()
        except Exception as e:  # noqa: BLE001 - reported by the test
            out.append(e)
        finally:
            first.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_sigterm_finishes_running_stream(server_factory):
    srv = server_factory("-np", "2", "-c", "256", "--shutdown-grace", "60", name="shutdown")
    body = {"prompt": COUNT_PROMPT, "max_tokens": 24, "temperature": 0, "stream": True}
    warm(srv, "/v1/completions", body)
    ref = stream_post(srv, "/v1/completions", body)
    first, out = threading.Event(), []
    t = _read_stream_in_thread(srv, body, first, out)
    assert first.wait(TIMEOUT)
    srv.signal(signal.SIGTERM)
    t.join(TIMEOUT)
    assert not t.is_alive()
    assert out[0] == 200, out
    assert out[-1] == "[DONE]", out[-3:]
    events = [json.loads(e) for e in out[1:-1]]
    assert not any("error" in e for e in events), events[-2:]
    assert stream_text(events, "completions") == stream_text(ref[:-1], "completions")
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert srv.wait(60) == 0, srv.tail()


def test_sigterm_past_grace_cancels(server_factory):
    srv = server_factory("-np", "1", "-c", "1024", "--shutdown-grace", "1", name="shutdown2")
    body = {"prompt": COUNT_PROMPT, "max_tokens": 900, "temperature": 0, "stream": True}
    first, out = threading.Event(), []
    t = _read_stream_in_thread(srv, body, first, out)
    assert first.wait(TIMEOUT)
    t0 = time.monotonic()
    srv.signal(signal.SIGTERM)
    assert srv.wait(60) == 0, srv.tail()
    took = time.monotonic() - t0
    t.join(30)
    assert not t.is_alive()
    assert took < 30, f"shutdown took {took:.1f} s with a 1 s grace"
    assert out[0] == 200 and out[-1] == "[DONE]", out[-3:]
    last = json.loads(out[-2])
    assert "error" in last, last


# ---------------------------------------------------------------------------------------------
# 9. concurrent requests give the same text as alone

CONC_PROMPTS = [
    "Write a short poem about the sea.", "Say hi", "What is the capital of France?",
    "List three colors.", "Tell me a joke.", "Explain gravity in one sentence.",
    "Count from one to ten.", "Translate 'good morning' to French.", "What is 2+2?",
    "Name a famous scientist.",
]


def test_concurrent_equals_alone(session_servers):
    srv = session_servers("-np", "16", "-c", "256", name="np16")
    order = CONC_PROMPTS + CONC_PROMPTS[:6]  # 16 requests, six repeated

    def run(p):
        events = stream_post(srv, "/v1/chat/completions",
                             {"messages": [{"role": "user", "content": p}], "max_tokens": 20,
                              "temperature": 0, "stream": True,
                              "stream_options": {"include_usage": True}})
        assert events[-1] == "[DONE]" and "usage" in events[-2], events[-3:]
        return stream_text(events[:-2]), events[-2]["usage"]["prompt_tokens_details"]

    alone = {p: run(p) for p in CONC_PROMPTS}
    barrier = threading.Barrier(len(order))

    def run_together(p):
        barrier.wait()
        return run(p)

    with ThreadPoolExecutor(len(order)) as ex:
        together = list(ex.map(run_together, order))
    diffs = []
    for p, (text, cached) in zip(order, together):
        ref, ref_cached = alone[p]
        if text != ref:
            at = next((i for i, (a, b) in enumerate(zip(text, ref)) if a != b),
                      min(len(text), len(ref)))
            diffs.append(f"{p!r}: diverges at char {at}\n"
                         f"  alone:    {ref!r} (cached prompt tokens {ref_cached})\n"
                         f"  together: {text!r} (cached prompt tokens {cached})")
    assert not diffs, f"{len(diffs)}/{len(order)} differ:\n" + "\n".join(diffs)
    assert_healthy(srv)
