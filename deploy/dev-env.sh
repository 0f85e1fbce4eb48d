#!/usr/bin/env bash
# Creates .venv (if missing) and installs GoSched with its dev tools into it. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.gosched-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[dev]"
  touch "$stamp"
fi

# The JS gRPC client of tests/test_api_other_language.py (tests/js_client): its pinned npm packages,
# when npm is there. Optional: on failure a warning, and that test skips.
js=tests/js_client
if command -v npm >/dev/null 2>&1; then
  if [ ! -f "$js/node_modules/.package-lock.json" ] \
    || [ "$js/package.json" -nt "$js/node_modules/.package-lock.json" ] \
    || [ "$js/package-lock.json" -nt "$js/node_modules/.package-lock.json" ]; then
    if ! (cd "$js" && npm ci --no-audit --no-fund --loglevel=error --fetch-retries=1 --fetch-timeout=60000 >/dev/null); then
      echo "warning: npm ci in $js failed; tests/test_api_other_language.py will skip" >&2
    fi
  fi
else
  echo "note: npm not found; tests/test_api_other_language.py will skip (it needs node)" >&2
fi
