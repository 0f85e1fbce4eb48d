#!/usr/bin/env bash
# One command on a fresh machine: install, then run GoSched on its embedded default (a local Ray, the
# master with 4 shards, this machine's own node agent and 16 simulated nodes), show it working
# (nodes, sample jobs run to success, the output of one, why another is pending), and stop.
# `.venv/bin/gosched up` does the same and keeps running until Ctrl-C.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/deploy/dev-env.sh"
cd "$root"
exec "$root/.venv/bin/gosched" up --exit-after-demo "$@"
