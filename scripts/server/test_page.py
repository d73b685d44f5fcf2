"""Headless-Chromium test of the chat page that `akunu serve` serves at `GET /`.

It starts the server (`-np 2 -c 1024 -t 2` on a free port of 18200-18299), drives the page
with Python Playwright on the system Chromium (Playwright never downloads a browser here), and
checks: a greedy reply shown by the page equals the API's own answer to the same request; the
second turn sends the whole history; errors from the server show in the conversation; Stop
cancels a reply; New chat forgets the history; the API-key field sends a bearer token.

Environment:
  AKUNU_BIN       the akunu binary (default: target/release/akunu under the repository root).
                  The page is compiled into it (include_str!), so build it after editing
                  crates/akunu-server/src/page.html.
  AKUNU_MODEL     the model (default: /tmp/akcache/models/gemma-3-270m-q4_k_m.gguf)
  CHROMIUM        the browser (default: /usr/bin/chromium; Debian's `chromium` package)
  AKUNU_PAGE_SHOTS  a folder to save screenshots in (optional)
  AKUNU_PAGE_FILE   serve this file at / in the browser instead of the binary's page (to try
                  edits of page.html without rebuilding; test_page_is_served is skipped)

Run: python -m pytest scripts/server/test_page.py -v
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

ROOT = Path(__file__).resolve().parents[2]
PORTS = range(18200, 18300)
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
CTX = 1024
MAX_TOKENS = 24
TIMEOUT_MS = 120_000  # one short generation on a busy 2-core machine
SHOTS = os.environ.get("AKUNU_PAGE_SHOTS")
expect.set_options(timeout=TIMEOUT_MS)
PAGE_FILE = os.environ.get("AKUNU_PAGE_FILE")
LOG_DIR = tempfile.mkdtemp(prefix="akunu-page-logs-")


def akunu_bin() -> Path:
    p = Path(os.environ.get("AKUNU_BIN", "target/release/akunu"))
    return p if p.is_absolute() else ROOT / p


def akunu_model() -> str:
    return os.environ.get("AKUNU_MODEL", "/tmp/akcache/models/gemma-3-270m-q4_k_m.gguf")


class Server:
    """`akunu serve` on a free port of PORTS, its stderr and stdout in a log file."""

    def __init__(self, *extra: str):
        self.log = Path(tempfile.mkstemp(prefix="akunu-page-", suffix=".log", dir=LOG_DIR)[1])
        binary, model = akunu_bin(), akunu_model()
        assert binary.is_file(), f"no server binary at {binary} (set AKUNU_BIN)"
        assert Path(model).is_file(), f"no model at {model} (set AKUNU_MODEL)"
        self.proc = None
        for port in self._ports():
            cmd = [str(binary), "serve", "-m", model, "--host", "127.0.0.1", "--port", str(port),
                   "-np", "2", "-c", str(CTX), "-t", "2", *extra]
            env = {k: v for k, v in os.environ.items() if k != "AKUNU_API_KEY"}
            env["NO_COLOR"] = "1"
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=env)
            self.url = f"http://127.0.0.1:{port}"
            if self._wait_ready():
                return
            if "binding" not in self.tail():  # failed for a reason other than a taken port
                break
        self.stop()
        raise RuntimeError(f"the server did not start:\n{self.tail()}")

    @staticmethod
    def _ports():
        for port in PORTS:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            yield port

    def _wait_ready(self, timeout: float = 180) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        return False

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def metrics(self) -> dict[str, float]:
        """The per-model /metrics series (of the one model loaded), by name."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("akunu_") and "{model=" in line:
                name, value = line.split("{")[0], line.rsplit(" ", 1)[1]
                out[name] = float(value)
        return out

    def post(self, path: str, body: dict, key: str | None = None) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), headers)
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_MS / 1000) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    def chat(self, messages: list[dict], **kw) -> str:
        status, body = self.post("/v1/chat/completions",
                                 {"messages": messages, "temperature": 0,
                                  "max_tokens": MAX_TOKENS, **kw})
        assert status == 200, body
        return body["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def server():
    srv = Server()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no browser at {CHROMIUM}: apt-get install chromium (or set CHROMIUM)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Session:
    """One page, with the chat requests it sent and what its console said."""

    def __init__(self, browser, url: str):
        self.ctx = browser.new_context(viewport={"width": 1000, "height": 760})
        self.page: Page = self.ctx.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.requests: list[dict] = []
        self.console: list[str] = []
        self.page.on("request", self._on_request)
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        if PAGE_FILE:
            html = Path(PAGE_FILE).read_text()
            self.page.route(url + "/", lambda route: route.fulfill(
                status=200, content_type="text/html; charset=utf-8", body=html))
        self.page.goto(url + "/")

    def _on_request(self, req) -> None:
        if req.url.endswith("/v1/chat/completions") and req.method == "POST":
            self.requests.append({"body": req.post_data_json, "headers": req.headers})

    def settings(self, temperature=None, max_tokens=None, api_key=None) -> None:
        p = self.page
        if not p.locator("#settings-panel").evaluate("d => d.open"):
            p.locator("#settings-panel summary").click()
        if temperature is not None:
            p.get_by_test_id("temperature").fill(str(temperature))
        if max_tokens is not None:
            p.get_by_test_id("max-tokens").fill(str(max_tokens))
        if api_key is not None:
            p.get_by_test_id("api-key").fill(api_key)
            p.get_by_test_id("api-key").dispatch_event("change")

    def send(self, text: str, enter: bool = True):
        """Sends `text` and returns the locator of the new assistant message."""
        p = self.page
        n = p.get_by_test_id("assistant-message").count()
        p.get_by_test_id("input").fill(text)
        if enter:
            p.get_by_test_id("input").press("Enter")
        else:
            p.get_by_test_id("send-button").click()
        return p.get_by_test_id("assistant-message").nth(n)

    def wait_idle(self) -> None:
        button = self.page.get_by_test_id("send-button")
        expect(button).to_have_attribute("data-state", "idle")
        expect(button).to_have_text("Send")

    def shot(self, name: str) -> None:
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.ctx.close()


@contextmanager
def report(server: Server, session: Session | None = None):
    """Adds the server's log tail and the page's console to a failure."""
    try:
        yield
    except Exception as e:
        extra = f"\n--- server log tail ({server.log}) ---\n{server.tail()}"
        if session:
            extra += "\n--- page console ---\n" + "\n".join(session.console[-30:])
        raise AssertionError(f"{e}{extra}") from e


@pytest.fixture
def session(server, browser):
    s = Session(browser, server.url)
    yield s
    s.close()


def text_of(locator) -> str:
    # textContent, not innerText: the exact characters, whitespace included.
    return locator.evaluate("el => el.textContent")


@pytest.mark.skipif(bool(PAGE_FILE), reason="AKUNU_PAGE_FILE replaces the served page")
def test_page_is_served(server):
    with urllib.request.urlopen(server.url + "/") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/html")
        html = r.read().decode()
    assert 'data-testid="send-button"' in html, (
        f"{akunu_bin()} serves an old or empty page; rebuild it after editing page.html")
    # Self-contained: nothing fetched from elsewhere.
    for bad in ("http://", "https://", "<link", "src="):
        assert bad not in html, f"the page refers to an external resource ({bad!r})"


def test_chat_two_turns_and_errors(server, session):
    s, p = session, session.page
    with report(server, s):
        expect(p.get_by_test_id("model-select").locator("option")).to_have_count(1)
        s.settings(temperature=0, max_tokens=MAX_TOKENS)

        # Turn 1, sent with Enter: the streamed text equals the API's greedy answer.
        q1 = "What is the capital of France? Answer in one sentence."
        msg1 = s.send(q1, enter=True)
        s.wait_idle()
        expect(msg1).to_have_attribute("data-state", "done")
        reply1 = text_of(msg1)
        assert reply1.strip(), "the assistant message is empty"
        assert reply1 == server.chat([{"role": "user", "content": q1}])
        body = s.requests[-1]["body"]
        assert body["stream"] is True and body["temperature"] == 0
        assert body["max_tokens"] == MAX_TOKENS
        assert body["messages"] == [{"role": "user", "content": q1}]
        expect(p.get_by_test_id("stats")).to_contain_text("tok/s")
        assert p.get_by_test_id("input").input_value() == ""
        s.shot("turn1")

        # Turn 2, sent with the button: the request carries the history.
        q2 = "And of Germany?"
        msg2 = s.send(q2, enter=False)
        s.wait_idle()
        expect(msg2).to_have_attribute("data-state", "done")
        history = [{"role": "user", "content": q1},
                   {"role": "assistant", "content": reply1},
                   {"role": "user", "content": q2}]
        assert len(s.requests) == 2
        assert s.requests[-1]["body"]["messages"] == history
        reply2 = text_of(msg2)
        assert reply2.strip()
        assert reply2 == server.chat(history)
        assert p.get_by_test_id("user-message").count() == 2
        assert p.get_by_test_id("assistant-message").count() == 2

        # An HTTP error: max_tokens over the context gives a 400 shown in the conversation.
        s.settings(max_tokens=CTX + 100)
        s.send("This one fails.")
        s.wait_idle()
        err = p.get_by_test_id("error-message")
        expect(err).to_have_count(1)
        expect(err).to_contain_text("exceeds this model's context")
        assert p.get_by_test_id("assistant-message").count() == 2  # no empty reply left behind
        s.shot("error")

        # The failed turn is not part of the history: the next request has 5 messages.
        s.settings(max_tokens=4)
        s.send("Thanks!")
        s.wait_idle()
        assert s.requests[-1]["body"]["messages"][:3] == history
        assert s.requests[-1]["body"]["messages"][3]["role"] == "assistant"
        assert len(s.requests[-1]["body"]["messages"]) == 5
        assert not [c for c in s.console if c.startswith("pageerror")], s.console


SSE_PARSE = r"""async () => {
  const bytes = new TextEncoder().encode(
    'data: {"a":"\u00e9\u20ac"}\r\n\r\n: keep-alive\n\ndata:x\r\ndata: y\r\n\r\ndata: [DONE]\n\ndata: after\n\n');
  const runs = [];
  for (const size of [1, 2, 3, 5, 7, bytes.length]) {
    const got = [];
    const body = new ReadableStream({ start(c) {
      for (let i = 0; i < bytes.length; i += size) c.enqueue(bytes.slice(i, i + size));
      c.close();
    } });
    await readSSE(body, (d) => { got.push(d); return d === "[DONE]"; });
    runs.push(got);
  }
  return runs;
}"""


def test_sse_parsing(server, session):
    """The page's SSE reader on chunks split anywhere (inside lines, CRLFs and UTF-8), and an
    error object arriving mid-stream."""
    s, p = session, session.page
    with report(server, s):
        for got in p.evaluate(SSE_PARSE):
            assert got == ['{"a":"\u00e9\u20ac"}', "x\ny", "[DONE]"]

        def fake(route):
            chunk = {"choices": [{"index": 0, "delta": {"content": "partial <b>text</b>"}}]}
            route.fulfill(status=200, content_type="text/event-stream", body=(
                f"data: {json.dumps(chunk)}\n\n"
                'data: {"error": {"message": "the engine failed: boom", "type": "server_error"}}\n\n'
                "data: [DONE]\n\n"))

        p.route(server.url + "/v1/chat/completions", fake)
        msg = s.send("Hi")
        s.wait_idle()
        expect(p.get_by_test_id("error-message")).to_contain_text("the engine failed: boom")
        expect(msg).to_have_attribute("data-state", "error")
        assert text_of(msg) == "partial <b>text</b>"  # shown as text, not markup
        assert p.locator("#messages b").count() == 0

        # A stream that ends without [DONE] is an error too.
        p.unroute(server.url + "/v1/chat/completions")
        p.route(server.url + "/v1/chat/completions", lambda route: route.fulfill(
            status=200, content_type="text/event-stream",
            body='data: {"choices": [{"index": 0, "delta": {"content": "cut"}}]}\n\n'))
        s.send("Hi again")
        s.wait_idle()
        expect(p.get_by_test_id("error-message").nth(1)).to_contain_text("ended early")
        # Neither failed turn entered the history.
        assert s.requests[-1]["body"]["messages"] == [{"role": "user", "content": "Hi again"}]


def test_stop_and_new_chat(server, session):
    s, p = session, session.page
    with report(server, s):
        limit = 400
        s.settings(temperature=0, max_tokens=limit)
        before = server.metrics()["akunu_completion_tokens_total"]
        msg = s.send("Write a long story about a dragon who learns to bake bread.")
        # Stop as soon as some text arrived.
        expect(msg).not_to_have_text("")
        expect(p.get_by_test_id("send-button")).to_have_text("Stop")
        p.get_by_test_id("send-button").click()
        s.wait_idle()
        expect(msg).to_have_attribute("data-state", "stopped")
        assert text_of(msg).strip()
        expect(p.get_by_test_id("stats")).to_contain_text("stopped")
        # The server cancelled the sequence: its slot is free soon after Stop, well short of
        # max_tokens.
        deadline = time.monotonic() + 10
        while (m := server.metrics())["akunu_active_sequences"] > 0:
            assert time.monotonic() < deadline, f"the sequence still runs 10 s after Stop: {m}"
            time.sleep(0.1)
        generated = m["akunu_completion_tokens_total"] - before
        assert 0 < generated < limit, f"{generated} tokens generated for a stopped reply"

        # New chat forgets the history.
        p.get_by_test_id("new-chat").click()
        expect(p.get_by_test_id("assistant-message")).to_have_count(0)
        expect(p.get_by_test_id("user-message")).to_have_count(0)
        s.settings(max_tokens=4)
        s.send("Hello")
        s.wait_idle()
        assert s.requests[-1]["body"]["messages"] == [{"role": "user", "content": "Hello"}]


def test_api_key(browser):
    srv = Server("--api-key", "sesame")
    s = None
    try:
        s = Session(browser, srv.url)
        p = s.page
        with report(srv, s):
            # Without the key the model list is refused, and the page says so.
            expect(p.get_by_test_id("stats")).to_contain_text("401")
            s.settings(api_key="sesame", temperature=0, max_tokens=4)
            expect(p.get_by_test_id("model-select").locator("option")).to_have_count(1)
            msg = s.send("Hi")
            s.wait_idle()
            expect(msg).to_have_attribute("data-state", "done")
            assert s.requests[-1]["headers"].get("authorization") == "Bearer sesame"
            # The key is remembered across reloads.
            p.reload()
            expect(p.get_by_test_id("api-key")).to_have_value("sesame")
            expect(p.get_by_test_id("model-select").locator("option")).to_have_count(1)
            # A wrong key gives a visible error.
            s.settings(api_key="wrong")
            s.send("Hi")
            s.wait_idle()
            expect(p.get_by_test_id("error-message")).to_contain_text("API key")
    finally:
        if s:
            s.close()
        srv.stop()
