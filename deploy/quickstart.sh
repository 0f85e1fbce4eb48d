#!/usr/bin/env bash
# One command on a fresh machine: install, then run GoSched on its embedded default and show it working.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/deploy/dev-env.sh"
exec "$root/.venv/bin/gosched" demo "$@"
