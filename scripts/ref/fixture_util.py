"""Helpers shared by the reference-data generators in scripts/ref/: timed logging, hashing,
write-on-change files, per-step input stamps, and pinned npm tarballs.

The generators run as scripts, so this directory is first on sys.path and they import it as
`fixture_util`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Writes only on change, so that unchanged outputs keep their mtime."""
    if path.is_file() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


class Stamps:
    """Input hashes of finished steps, in OUTDIR/stamps.json."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, str] = json.loads(path.read_text()) if path.is_file() else {}

    def fresh(self, step: str, key: str, outputs: list[Path]) -> bool:
        return self.data.get(step) == key and all(p.exists() for p in outputs)

    def done(self, step: str, key: str) -> None:
        self.data[step] = key
        write_atomic(self.path, (json.dumps(self.data, indent=1, sort_keys=True) + "\n").encode())


def run(cmd: list[str], env: dict[str, str] | None = None, shown: int | None = None) -> str:
    """stdout of `cmd`; exits with its stderr tail if it fails (showing `shown` arguments)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        words = " ".join(cmd if shown is None else cmd[:shown] + ["..."])
        sys.exit(f"failed ({proc.returncode}): {words}\n{proc.stderr[-4000:]}")
    return proc.stdout


def npm_tarball(package: str, version: str, algorithm: str, pinned: str, timeout: int) -> bytes:
    """The registry's tarball of package@version, checked against a pinned digest
    (`algorithm` is a hashlib name). The registry can be replaced by a mirror with
    AKUNU_NPM_REGISTRY."""
    registry = os.environ.get("AKUNU_NPM_REGISTRY", "https://registry.npmjs.org").rstrip("/")
    basename = package.rsplit("/", 1)[-1]
    url = f"{registry}/{package}/-/{basename}-{version}.tgz"
    log(f"download {url}")
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        data = resp.read()
    got = hashlib.new(algorithm, data).hexdigest()
    if got != pinned:
        sys.exit(f"{url}: {algorithm} {got} does not match the pinned {pinned}")
    return data
