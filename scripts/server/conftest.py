"""Fixtures for the `akunu serve` tests: start the server binary as a subprocess, wait for it,
stop it, and show the tail of its log when a test fails.

Environment:
  AKUNU_BIN          the akunu binary (default: target/release/akunu under the repository root)
  AKUNU_MODEL        the model file (default: the path `akunu pull` prints)
  AKUNU_PORTS        the port range to pick free ports from, "LO-HI" (default: 18100-18199)
  AKUNU_THREADS      -t for every server (default: 2)
  AKUNU_START_TIMEOUT  seconds a server may take to answer /health (default: 120)

Other test files may reuse `start_server(...)` / the `server_factory` fixture:

    def test_x(server_factory):
        srv = server_factory("-np", "2", "-c", "512")
        httpx.get(srv.url + "/health")
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def akunu_bin() -> Path:
    path = Path(os.environ.get("AKUNU_BIN", "target/release/akunu"))
    return path if path.is_absolute() else ROOT / path


def akunu_model() -> str:
    model = os.environ.get("AKUNU_MODEL")
    if model:
        return model
    # `akunu pull` prints the default model's path (fetching it on first use).
    out = subprocess.run([str(akunu_bin()), "pull"], check=True, capture_output=True, text=True)
    path = out.stdout.strip().splitlines()[-1]
    os.environ["AKUNU_MODEL"] = path
    return path


def port_range() -> range:
    lo, hi = os.environ.get("AKUNU_PORTS", "18100-18199").split("-")
    return range(int(lo), int(hi) + 1)


_taken: set[int] = set()


def free_port() -> int:
    """A port of the range that nothing listens on (and that this process has not handed out)."""
    ports = list(port_range())
    random.shuffle(ports)
    for port in ports:
        if port in _taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _taken.add(port)
        return port
    raise RuntimeError(f"no free port in {ports[0]}-{ports[-1]}")


class Server:
    """One `akunu serve` subprocess."""

    def __init__(self, args: list[str], log_dir: Path, name: str = "server",
                 model: str | None = None, env: dict | None = None):
        self.port = free_port()
        self.host = "127.0.0.1"
        self.url = f"http://{self.host}:{self.port}"
        self.model_path = model or akunu_model()
        self.args = list(args)
        self.name = name
        self.log_path = log_dir / f"{name}-{self.port}.log"
        threads = os.environ.get("AKUNU_THREADS", "2")
        cmd = [str(akunu_bin()), "serve", "-m", self.model_path, "--host", self.host,
               "--port", str(self.port)]
        if "-t" not in self.args and "--threads" not in self.args:
            cmd += ["-t", threads]
        self.cmd = cmd + self.args
        full_env = dict(os.environ, NO_COLOR="1")
        full_env.pop("AKUNU_API_KEY", None)
        full_env.update(env or {})
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=full_env)
        self.pid = self.proc.pid
        self.returncode: int | None = None

    def wait_ready(self, timeout: float | None = None) -> "Server":
        timeout = timeout or float(os.environ.get("AKUNU_START_TIMEOUT", "120"))
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} while starting:\n{self.tail()}")
            try:
                r = httpx.get(self.url + "/health", timeout=5)
                if r.status_code == 200:
                    return self
                last = f"{r.status_code} {r.text}"
            except httpx.HTTPError as e:
                last = repr(e)
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} did not become healthy in {timeout} s ({last}):\n{self.tail()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        self.returncode = self.proc.wait(timeout=timeout)
        return self.returncode

    def stop(self, timeout: float = 30) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.returncode = self.proc.returncode
        if not self._log.closed:
            self._log.close()
        return self.returncode

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def rss_kib(self) -> int:
        """Resident memory (VmRSS) of the server process, in KiB."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def __repr__(self) -> str:
        return f"<akunu serve pid={self.pid} {self.url} {' '.join(self.args)}>"


# Every server started in this session, for failure reports.
_servers: list[Server] = []


def start_server(*args: str, log_dir: Path, name: str = "server", model: str | None = None,
                 env: dict | None = None, ready: bool = True) -> Server:
    """Starts `akunu serve ARGS` on a free port and waits for /health (unless ready=False)."""
    for attempt in range(3):
        srv = Server(list(args), log_dir, name=name, model=model, env=env)
        _servers.append(srv)
        if not ready:
            return srv
        try:
            return srv.wait_ready()
        except RuntimeError:
            # Someone else took the port between the check and the bind: try another.
            if "binding" in srv.log() and attempt < 2:
                continue
            raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("akunu-server-logs")


@pytest.fixture(scope="session")
def session_servers(log_dir):
    """Starts servers shared by the whole session, once per distinct argument list."""
    started: dict[tuple, Server] = {}

    def get(*args: str, name: str = "server") -> Server:
        key = tuple(args)
        if key not in started or not started[key].alive():
            started[key] = start_server(*args, log_dir=log_dir, name=name)
        return started[key]

    yield get
    for srv in started.values():
        srv.stop()


@pytest.fixture
def server_factory(log_dir):
    """Starts servers for one test; they are stopped when it ends."""
    mine: list[Server] = []

    def make(*args: str, **kw) -> Server:
        srv = start_server(*args, log_dir=log_dir, **kw)
        mine.append(srv)
        return srv

    yield make
    for srv in mine:
        srv.stop()


@pytest.fixture(scope="session")
def server(session_servers) -> Server:
    """The default server: 4 slots of 1024 tokens."""
    return session_servers("-np", "4", "-c", "1024", name="main")


def pytest_runtest_setup(item):
    item._akunu_first_server = len(_servers)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not (rep.failed and call.when in ("setup", "call")):
        return
    # The servers the test used: those among its fixtures and those started during it.
    used = [v for v in getattr(item, "funcargs", {}).values() if isinstance(v, Server)]
    used += _servers[getattr(item, "_akunu_first_server", len(_servers)):]
    seen = set()
    for srv in used:
        if id(srv) in seen:
            continue
        seen.add(id(srv))
        rep.sections.append((f"akunu server {srv.name} ({srv.url}, pid {srv.pid}, "
                             f"exit {srv.proc.poll()}) log tail", srv.tail(30)))


def pytest_sessionfinish(session, exitstatus):
    for srv in _servers:
        srv.stop(timeout=15)
    if exitstatus not in (0, 5):
        print(f"\nakunu server logs: {', '.join(str(s.log_path) for s in _servers)}",
              file=sys.stderr)
