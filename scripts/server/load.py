#!/usr/bin/env python3
"""Load test of `akunu serve`: streaming chat clients at rising concurrency.

For each concurrency level (--clients 1,2,4,8,16) it runs that many clients at once, each
sending streaming `POST /v1/chat/completions` requests (temperature 0, fixed max_tokens,
prompts of varied lengths) for --rounds requests or for --duration seconds, and measures per
request the time to the first content chunk, the total time and the completion tokens (from
`stream_options.include_usage`). Every response must be complete: status 200, no error
object, a finish_reason, a usage chunk and the closing `[DONE]`.

Correctness: before the load, every prompt runs alone and its text is the reference; under
load every response must equal its prompt's reference (greedy decoding of a batch-invariant
engine gives the same tokens alone or batched). --no-check skips the comparison.

Columns: agg tok/s = completion tokens of the level / its wall time; per-client tok/s =
mean over clients of (its completion tokens / its time in requests, TTFT included); TTFT =
request sent to first non-empty content chunk (queueing and prefill included).

After each level it reads /metrics for the server's forward passes and tokens in that time,
and it ends with one table. --json FILE writes every number, request by request.

Either it starts the server (--bin, --model, -np, -c, -t; on a free port of --ports) or it
targets a running one (--url).

Exit status: 0 all good; bit 1 = failed or incomplete responses; bit 2 = mismatches with the
single-client text; 4 = the run could not start (server, baseline).

Standard library only (asyncio with raw HTTP/1.1), Python 3.11+.

Usage:
  python scripts/server/load.py --model /path/model.gguf -np 16 -c 2048 -t 2
  python scripts/server/load.py --url http://127.0.0.1:8080 --clients 1,4,16 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import asdict, dataclass, field

# Varied prompts, short to long. None asks for anything the server could refuse.
PROMPTS = [
    "Hi!",
    "What is the capital of France?",
    "List three primary colors.",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "Translate to German: The weather is nice today and I would like to go for a walk.",
    "Give me a short recipe for pancakes with the ingredients and the steps.",
    "Summarize the following text in one sentence: The industrial revolution began in Great "
    "Britain in the late eighteenth century and spread to Europe and North America. It "
    "replaced hand production with machines, brought new chemical and iron processes, "
    "steam power and the factory system, and changed how people lived and worked.",
    "You are a helpful assistant for a small bakery. A customer asks which of our breads are "
    "suitable for someone who avoids dairy, and whether we can deliver on Sundays. We bake "
    "sourdough, rye, brioche and a milk loaf, and we deliver Monday to Saturday only. Write "
    "a friendly, short answer.",
    "Write a Python function that returns the n-th Fibonacci number iteratively, and explain "
    "its time complexity in one line.",
    "Here is a list of tasks for the week: buy groceries, call the plumber about the leaking "
    "kitchen tap, finish the quarterly report, book a dentist appointment, renew the car "
    "insurance, plan Saturday's birthday party for my daughter, and back up the laptop. "
    "Group them by urgency and say which to do first.",
    "Tell me a fun fact about octopuses.",
]

PORT_RANGE = (18300, 18399)


# --------------------------------------------------------------------------- HTTP/1.1


class Http:
    """A tiny HTTP/1.1 client over asyncio streams: one connection per request."""

    def __init__(self, base: str, api_key: str | None):
        u = urllib.parse.urlsplit(base)
        if u.scheme != "http":
            raise SystemExit(f"only http:// URLs are supported, not {base}")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 80
        self.prefix = u.path.rstrip("/")
        self.api_key = api_key

    async def open(self, method: str, path: str, body: dict | None = None):
        """Sends a request; returns (status, headers, body chunk iterator, writer)."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        data = b"" if body is None else json.dumps(body).encode()
        lines = [
            f"{method} {self.prefix}{path} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            "Connection: close",
            "Accept: */*",
            f"Content-Length: {len(data)}",
        ]
        if body is not None:
            lines.append("Content-Type: application/json")
        if self.api_key:
            lines.append(f"Authorization: Bearer {self.api_key}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            writer.close()
            raise ConnectionError(f"bad status line {status_line!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        return status, headers, self._body(reader, headers), writer

    @staticmethod
    async def _body(reader: asyncio.StreamReader, headers: dict[str, str]):
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                size_line = await reader.readline()
                if not size_line:
                    raise ConnectionError("connection closed inside a chunked body")
                size = int(size_line.split(b";")[0].strip(), 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                chunk = await reader.readexactly(size)
                await reader.readexactly(2)
                yield chunk
        elif "content-length" in headers:
            n = int(headers["content-length"])
            if n:
                yield await reader.readexactly(n)
        else:
            while chunk := await reader.read(65536):
                yield chunk

    async def fetch(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        status, _, chunks, writer = await self.open(method, path, body)
        try:
            data = b"".join([c async for c in chunks])
        finally:
            writer.close()
        return status, data


# --------------------------------------------------------------------------- requests


@dataclass
class Result:
    prompt: int
    client: int
    round: int
    level: int
    status: int = 0
    start: float = 0.0  # seconds since the level began
    ttft: float | None = None  # seconds to the first content chunk
    total: float = 0.0
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    done: bool = False
    error: str | None = None
    text: str = ""
    chunks: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None


def chat_body(args, prompt: str) -> dict:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "max_tokens": args.max_tokens,
    }
    if args.model_id:
        body["model"] = args.model_id
    return body


async def stream_chat(http: Http, args, res: Result, t_level: float) -> Result:
    t0 = time.perf_counter()
    res.start = t0 - t_level
    try:
        await asyncio.wait_for(_stream_chat(http, args, res, t0), args.request_timeout)
    except asyncio.TimeoutError:
        res.error = res.error or f"timed out after {args.request_timeout} s"
    except (OSError, ConnectionError, ValueError, asyncio.IncompleteReadError) as e:
        res.error = res.error or f"{type(e).__name__}: {e}"
    res.total = time.perf_counter() - t0
    if res.error is None:
        missing = [
            what
            for what, bad in [
                ("[DONE]", not res.done),
                ("finish_reason", res.finish_reason is None),
                ("usage", res.completion_tokens is None),
            ]
            if bad
        ]
        if missing:
            res.error = "incomplete stream: no " + ", ".join(missing)
    return res


async def _stream_chat(http: Http, args, res: Result, t0: float) -> None:
    status, headers, chunks, writer = await http.open(
        "POST", "/v1/chat/completions", chat_body(args, PROMPTS[res.prompt])
    )
    res.status = status
    try:
        if status != 200:
            data = b"".join([c async for c in chunks])
            try:
                msg = json.loads(data)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = data[:200].decode(errors="replace")
            res.error = f"HTTP {status}: {msg}"
            return
        if "text/event-stream" not in headers.get("content-type", ""):
            res.error = f"content-type {headers.get('content-type')!r}, not text/event-stream"
            return
        buf = b""
        async for data in chunks:
            buf += data.replace(b"\r\n", b"\n")
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                payload = "\n".join(
                    line[5:].removeprefix(" ")
                    for line in event.decode().split("\n")
                    if line.startswith("data:")
                )
                if payload:
                    _on_event(res, payload, t0)
        if buf.strip():
            res.error = res.error or f"stream ended inside an event: {buf[:100]!r}"
    finally:
        writer.close()


def _on_event(res: Result, payload: str, t0: float) -> None:
    if res.done:
        res.error = res.error or f"data after [DONE]: {payload[:100]}"
        return
    if payload == "[DONE]":
        res.done = True
        return
    obj = json.loads(payload)
    if "error" in obj:
        res.error = res.error or f"error object in stream: {obj['error'].get('message')}"
        return
    for choice in obj.get("choices") or []:
        content = (choice.get("delta") or {}).get("content")
        if content:
            if res.ttft is None:
                res.ttft = time.perf_counter() - t0
            res.text += content
            res.chunks.append(content)
        if choice.get("finish_reason") is not None:
            res.finish_reason = choice["finish_reason"]
    usage = obj.get("usage")
    if usage:
        res.completion_tokens = usage.get("completion_tokens")
        res.prompt_tokens = usage.get("prompt_tokens")
        res.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")


# --------------------------------------------------------------------------- metrics


async def read_metrics(http: Http) -> dict[str, float]:
    """Sums every series of each metric name over its labels."""
    try:
        status, data = await http.fetch("GET", "/metrics")
    except OSError:
        return {}
    if status != 200:
        return {}
    out: dict[str, float] = {}
    for line in data.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            pass
    return out


# --------------------------------------------------------------------------- levels


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def first_diff(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def chunk_at(chunks: list[str], pos: int) -> int:
    """Index of the content chunk (about one token each) holding character `pos`."""
    seen = 0
    for i, c in enumerate(chunks):
        seen += len(c)
        if pos < seen:
            return i
    return len(chunks)


@dataclass
class Mismatch:
    level: int
    client: int
    round: int
    prompt: int
    char: int  # first differing character
    chunk: int  # content chunk (about a token) where it diverges, under load
    ref_chunk: int  # the same in the single-client text
    got: str
    want: str


async def run_level(http: Http, args, n: int, refs: dict[int, Result] | None) -> dict:
    before = await read_metrics(http)
    load_before = os.getloadavg()
    t_level = time.perf_counter()
    deadline = t_level + args.duration if args.duration else None

    async def client(ci: int) -> list[Result]:
        out = []
        r = 0
        while (r < args.rounds) if deadline is None else (time.perf_counter() < deadline):
            # Clients in flight together get different prompts.
            p = (ci + r * n + args.prompt_offset) % len(PROMPTS)
            res = Result(prompt=p, client=ci, round=r, level=n)
            out.append(await stream_chat(http, args, res, t_level))
            r += 1
        return out

    per_client = await asyncio.gather(*(client(ci) for ci in range(n)))
    wall = time.perf_counter() - t_level
    after = await read_metrics(http)
    load_after = os.getloadavg()

    results = [r for rs in per_client for r in rs]
    errors = [r for r in results if not r.ok]
    mismatches: list[Mismatch] = []
    if refs is not None:
        for r in results:
            ref = refs.get(r.prompt)
            if r.ok and ref is not None and r.text != ref.text:
                at = first_diff(r.text, ref.text)
                mismatches.append(
                    Mismatch(n, r.client, r.round, r.prompt, at, chunk_at(r.chunks, at),
                             chunk_at(ref.chunks, at), r.text, ref.text)
                )
    tokens = sum(r.completion_tokens or 0 for r in results if r.ok)
    rates = []
    for rs in per_client:
        busy = sum(r.total for r in rs if r.ok)
        toks = sum(r.completion_tokens or 0 for r in rs if r.ok)
        if busy > 0:
            rates.append(toks / busy)
    ttfts = [r.ttft for r in results if r.ok and r.ttft is not None]

    def delta(name: str) -> float | None:
        if name in before and name in after:
            return after[name] - before[name]
        return None

    passes = delta("akunu_forward_passes_total")
    gen = delta("akunu_completion_tokens_total")
    pre = delta("akunu_prompt_tokens_total")
    return {
        "clients": n,
        "requests": len(results),
        "wall_s": wall,
        "completion_tokens": tokens,
        "aggregate_tok_s": tokens / wall if wall > 0 else 0.0,
        "per_client_tok_s": sum(rates) / len(rates) if rates else 0.0,
        "ttft_ms": {
            k: (None if v is None else v * 1e3)
            for k, v in [
                ("p50", percentile(ttfts, 0.5)),
                ("p95", percentile(ttfts, 0.95)),
                ("max", max(ttfts) if ttfts else None),
            ]
        },
        "errors": len(errors),
        "error_messages": sorted({r.error for r in errors}),
        "mismatches": len(mismatches),
        "mismatch_detail": [asdict(m) for m in mismatches],
        "server": {
            "forward_passes": passes,
            "completion_tokens": gen,
            "prompt_tokens": pre,
            "completion_tokens_per_pass": gen / passes if passes and gen is not None else None,
            "tokens_per_pass": (gen + pre) / passes
            if passes and gen is not None and pre is not None
            else None,
        },
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "results": [asdict(r) for r in results],
        "_mismatches": mismatches,
    }


async def baseline(http: Http, args) -> dict[int, Result]:
    """Every prompt alone, one at a time: the reference texts."""
    refs = {}
    t = time.perf_counter()
    for p in range(len(PROMPTS)):
        res = await stream_chat(http, args, Result(prompt=p, client=0, round=0, level=0), t)
        refs[p] = res
        if not res.ok:
            raise SystemExit4(f"baseline request for prompt {p} failed: {res.error}")
    return refs


class SystemExit4(Exception):
    pass


# --------------------------------------------------------------------------- server


def free_port(lo: int, hi: int, skip: set[int]) -> int:
    for port in range(lo, hi + 1):
        if port in skip:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SystemExit4(f"no free port in {lo}-{hi}")


class Server:
    """`akunu serve` started by this script on a free port; stopped with SIGTERM."""

    def __init__(self, args):
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log_path = args.server_log or os.path.join(
            tempfile.mkdtemp(prefix="akunu-load-"), "server.log"
        )

    def command(self, port: int) -> list[str]:
        a = self.args
        cmd = [a.bin, "serve", "--model", a.model, "--host", "127.0.0.1", "--port", str(port),
               "--parallel", str(a.parallel)]
        if a.ctx_size is not None:
            cmd += ["-c", str(a.ctx_size)]
        if a.threads is not None:
            cmd += ["-t", str(a.threads)]
        return cmd + a.server_arg

    async def start(self) -> str:
        if not os.path.exists(self.args.bin):
            raise SystemExit4(f"server binary {self.args.bin} not found (build it or pass --bin)")
        lo, hi = self.args.ports
        tried: set[int] = set()
        for _ in range(3):
            port = free_port(lo, hi, tried)
            tried.add(port)
            cmd = self.command(port)
            print(f"starting: {' '.join(cmd)}\n  log: {self.log_path}", flush=True)
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
            log.close()
            self.port = port
            url = f"http://127.0.0.1:{port}"
            http = Http(url, None)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < self.args.startup_timeout:
                if self.proc.poll() is not None:
                    break
                try:
                    status, _ = await http.fetch("GET", "/health")
                    if status == 200:
                        print(f"server ready on {url} after {time.perf_counter() - t0:.1f} s",
                              flush=True)
                        return url
                except OSError:
                    pass
                await asyncio.sleep(0.25)
            else:
                self.stop()
                raise SystemExit4(f"server not ready after {self.args.startup_timeout} s; "
                                  f"log:\n{self.tail()}")
            # The process exited: a lost port race is worth another try, anything else not.
            tail = self.tail()
            if "binding" not in tail and "in use" not in tail.lower():
                raise SystemExit4(f"server exited with {self.proc.returncode}; log:\n{tail}")
        raise SystemExit4(f"server could not bind a port; log:\n{self.tail()}")

    def tail(self, n: int = 20) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# --------------------------------------------------------------------------- report


def fmt(v, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def table(levels: list[dict]) -> str:
    head = ["clients", "requests", "agg tok/s", "per-client tok/s", "TTFT p50 / p95 / max (ms)",
            "mismatches", "errors", "passes", "gen tok/pass", "load1"]
    rows = []
    for lv in levels:
        t = lv["ttft_ms"]
        s = lv["server"]
        rows.append([
            str(lv["clients"]),
            str(lv["requests"]),
            fmt(lv["aggregate_tok_s"], ".1f"),
            fmt(lv["per_client_tok_s"], ".1f"),
            f"{fmt(t['p50'])} / {fmt(t['p95'])} / {fmt(t['max'])}",
            "-" if lv["mismatches"] is None else str(lv["mismatches"]),
            str(lv["errors"]),
            fmt(s["forward_passes"]),
            fmt(s["completion_tokens_per_pass"], ".2f"),
            fmt(lv["loadavg_after"][0], ".2f"),
        ])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *(line(r) for r in rows)])


def show_mismatch(m: Mismatch, context: int = 60) -> str:
    lo = max(0, m.char - context)
    return (
        f"first mismatch: clients={m.level} client={m.client} round={m.round} "
        f"prompt {m.prompt} ({PROMPTS[m.prompt][:40]!r}...)\n"
        f"  diverges at character {m.char}, content chunk {m.chunk} "
        f"(single-client chunk {m.ref_chunk}; a chunk is about one token)\n"
        f"  single: ...{m.want[lo:m.char + context]!r}\n"
        f"  loaded: ...{m.got[lo:m.char + context]!r}"
    )


# --------------------------------------------------------------------------- main


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit status: 0 ok; |1 failed or incomplete responses; |2 mismatches; "
               "4 setup failed.",
    )
    tgt = ap.add_argument_group("target (one of --url or --model)")
    tgt.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8080")
    tgt.add_argument("--bin", default="target/release/akunu", help="akunu binary (%(default)s)")
    tgt.add_argument("--model", "-m", help="model file to serve (starts the server)")
    tgt.add_argument("-np", "--parallel", type=int, default=16,
                     help="server slots, passed as --parallel (%(default)s)")
    tgt.add_argument("-c", "--ctx-size", type=int, default=2048, help="server -c (%(default)s)")
    tgt.add_argument("-t", "--threads", type=int, help="server -t (default: the server's)")
    tgt.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                     help="extra server argument (repeat; e.g. --server-arg=-b=512)")
    tgt.add_argument("--ports", default=f"{PORT_RANGE[0]}-{PORT_RANGE[1]}",
                     help="port range to pick a free port from (%(default)s)")
    tgt.add_argument("--server-log", help="server log file (default: a temporary file)")
    tgt.add_argument("--startup-timeout", type=float, default=180.0)
    tgt.add_argument("--api-key", default=os.environ.get("AKUNU_API_KEY"),
                     help="bearer token (default: $AKUNU_API_KEY)")
    tgt.add_argument("--model-id", help="`model` field of the requests (default: omitted)")
    load = ap.add_argument_group("load")
    load.add_argument("--clients", default="1,2,4,8,16",
                      help="concurrency levels, comma-separated (%(default)s)")
    load.add_argument("--rounds", type=int, default=3,
                      help="requests per client per level (%(default)s)")
    load.add_argument("--duration", type=float,
                      help="seconds per level instead of --rounds (clients start no new "
                           "request after it)")
    load.add_argument("--max-tokens", type=int, default=64, help="(%(default)s)")
    load.add_argument("--request-timeout", type=float, default=600.0)
    load.add_argument("--prompt-offset", type=int, default=0,
                      help="rotate which prompt each client starts with")
    load.add_argument("--no-check", action="store_true",
                      help="skip the comparison with the single-client texts")
    load.add_argument("--json", metavar="FILE", help="write the raw numbers here")
    load.add_argument("--show-mismatches", type=int, default=1, metavar="N",
                      help="print the first N diffs (%(default)s)")
    args = ap.parse_args(argv)
    if not args.url and not args.model:
        ap.error("give --url of a running server or --model to start one")
    if args.url and args.model:
        ap.error("give --url or --model, not both")
    try:
        args.levels = [int(x) for x in args.clients.split(",") if x.strip()]
        lo, _, hi = args.ports.partition("-")
        args.ports = (int(lo), int(hi or lo))
    except ValueError:
        ap.error("--clients takes numbers like 1,2,4 and --ports a range like 18300-18399")
    if not args.levels or min(args.levels) < 1:
        ap.error("--clients needs levels of at least 1")
    if args.rounds < 1 or args.max_tokens < 1:
        ap.error("--rounds and --max-tokens must be at least 1")
    return args


async def main_async(args) -> int:
    server = None
    rc = 4
    try:
        if args.url:
            url = args.url
        else:
            server = Server(args)
            url = await server.start()
        http = Http(url, args.api_key)
        status, data = await http.fetch("GET", "/v1/models")
        info = {}
        if status == 200:
            models = json.loads(data).get("data") or []
            if models:
                info = models[0].get("meta") or {}
                print(f"model: {models[0].get('id')}  backend: {info.get('backend')}  "
                      f"slots: {info.get('n_slots')}  ctx: {info.get('n_ctx')}")
        print(f"machine: {os.cpu_count()} CPUs, load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

        t = time.perf_counter()
        refs = await baseline(http, args)
        took = time.perf_counter() - t
        btoks = sum(r.completion_tokens or 0 for r in refs.values())
        print(f"baseline: {len(refs)} prompts alone, {btoks} tokens in {took:.1f} s "
              f"({btoks / took:.1f} tok/s incl. prefill); finish reasons "
              f"{sorted({r.finish_reason for r in refs.values()})}", flush=True)

        levels = []
        for n in args.levels:
            lv = await run_level(http, args, n, None if args.no_check else refs)
            if args.no_check:
                lv["mismatches"] = None
            s = lv["server"]
            print(f"clients={n:>3}: {lv['requests']} requests in {lv['wall_s']:.1f} s, "
                  f"{lv['aggregate_tok_s']:.1f} tok/s, errors {lv['errors']}, mismatches "
                  f"{lv['mismatches']}, server passes {fmt(s['forward_passes'])} "
                  f"({fmt(s['completion_tokens_per_pass'], '.2f')} generated tok/pass, "
                  f"{fmt(s['tokens_per_pass'], '.2f')} tok/pass with prompt), load "
                  f"{lv['loadavg_after'][0]:.2f}", flush=True)
            for msg in lv["error_messages"][:3]:
                print(f"  error: {msg}")
            levels.append(lv)

        all_mm = [m for lv in levels for m in lv.pop("_mismatches")]
        if all_mm:
            by_prompt: dict[int, list[int]] = {}
            for m in all_mm:
                by_prompt.setdefault(m.prompt, []).append(m.chunk)
            print(f"\n{len(all_mm)} responses differ from the single-client text; by prompt "
                  "(diverging chunk ~ token index):")
            for p, chunks in sorted(by_prompt.items()):
                print(f"  prompt {p:>2}: {len(chunks)} x, at {sorted(chunks)}")
            for m in all_mm[: args.show_mismatches]:
                print(show_mismatch(m))
        n_err = sum(lv["errors"] for lv in levels)
        n_mm = len(all_mm)

        if args.json:
            with open(args.json, "w") as f:
                json.dump({
                    "url": url,
                    "server_command": server.command(server.port) if server else None,
                    "model_meta": info,
                    "max_tokens": args.max_tokens,
                    "rounds": None if args.duration else args.rounds,
                    "duration_s": args.duration,
                    "cpus": os.cpu_count(),
                    "prompts": PROMPTS,
                    "baseline": [asdict(r) for r in refs.values()],
                    "levels": levels,
                }, f, indent=1)
            print(f"raw numbers: {args.json}")

        print(f"\nload average now: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
              f"({os.cpu_count()} CPUs); max_tokens {args.max_tokens}, "
              + (f"{args.duration:g} s per level" if args.duration else
                 f"{args.rounds} requests per client"))
        print(table(levels))
        rc = (1 if n_err else 0) | (2 if n_mm else 0)
        return rc
    except SystemExit4 as e:
        print(f"error: {e}", file=sys.stderr)
        return 4
    finally:
        if server:
            server.stop()
            if rc == 0 and not args.server_log:
                shutil.rmtree(os.path.dirname(server.log_path), ignore_errors=True)
            elif rc != 4:
                print(f"server log kept: {server.log_path}")


def main() -> None:
    args = parse_args()
    try:
        sys.exit(asyncio.run(main_async(args)))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
