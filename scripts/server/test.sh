#!/usr/bin/env bash
# The `akunu serve` tests: installs scripts/server/requirements*.txt into the venv (again only
# when they change), then runs pytest over scripts/server; the tests start the server binary
# themselves. Extra arguments go to pytest.
# Environment: AKUNU_VENV (default .venv), AKUNU_BIN (default target/release/akunu),
# AKUNU_MODEL (default: the path `akunu pull` prints), AKUNU_PORTS (default 18100-18199).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
venv=${AKUNU_VENV:-$root/.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# Every requirements file of this folder (pytest collects every test file here: the API tests'
# requirements.txt, the chat page test's requirements-page.txt, ...), installed again only
# when one of them changed.
stamp=$venv/.akunu-server-requirements
wanted=$(mktemp)
trap 'rm -f "$wanted"' EXIT
reqs=(scripts/server/requirements*.txt)
cat "${reqs[@]}" >"$wanted"
if ! cmp -s "$wanted" "$stamp"; then
  args=()
  for r in "${reqs[@]}"; do args+=(-r "$r"); done
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${args[@]}"
  cp "$wanted" "$stamp"
fi
rm -f "$wanted"
export AKUNU_BIN=${AKUNU_BIN:-$root/target/release/akunu}
if [ -z "${AKUNU_MODEL:-}" ]; then
  AKUNU_MODEL=$("$AKUNU_BIN" pull)
fi
export AKUNU_MODEL
exec "$venv/bin/python" -m pytest -q scripts/server "$@"
