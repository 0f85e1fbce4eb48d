#!/usr/bin/env bash
# The benchmark runs behind the figures in docs/benchmarks.md and the README, most telling first,
# each under its own time limit, so that a run cut short still leaves the ones before it:
#
#   bash deploy/bench-suite.sh OUT [quick|full]      # GOSCHED=path/to/gosched to pick the command
#
# OUT/<run>/ gets each run's bench.txt, bench.json and plot; OUT/suite.log what they printed, with
# the machine's description first. `quick` (the default) fits about nine minutes on a 16-core
# machine: the bodies, the 1/2/4/8-shard sweep at 10,000 nodes (default chain and `minimal`),
# 100,000 tasks at 8 shards, and the latency at half the 8-shard peak. `full` adds 50,000 nodes
# on 16 shards, the cluster filled to 90%, ingest through gRPC and the control plane's memory.
# Give Ray actors room: every actor is created with num_cpus=0, so none waits for a CPU slot.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash deploy/bench-suite.sh OUT [quick|full]" >&2; exit 2; }
out=$1
mode=${2:-quick}
case $mode in quick | full) ;; *) echo "error: mode: $mode is neither quick nor full" >&2; exit 2 ;; esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
gosched=${GOSCHED:-$root/.venv/bin/gosched}
command -v "$gosched" >/dev/null || gosched=gosched
mkdir -p "$out"
log="$out/suite.log"

{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "cores: $(nproc)"
  grep -m1 'model name' /proc/cpuinfo 2>/dev/null
  free -g | head -n 2
  python3 --version 2>&1
  python3 -c 'import time; t = time.perf_counter(); sum(range(10**7)); print("sum(range(10**7)) s", round(time.perf_counter() - t, 3))'
} >"$log" 2>&1

# run NAME SECONDS ARGS...: one bench invocation into OUT/NAME, its output appended to the log.
run() {
  local name=$1 limit=$2
  shift 2
  echo "== $name: gosched bench $* (limit ${limit}s)" >>"$log"
  local t0=$SECONDS
  timeout --signal=INT --kill-after=20 "$limit" "$gosched" bench "$@" --out "$out/$name" >>"$log" 2>&1
  echo "== $name: exit $? after $((SECONDS - t0))s" >>"$log"
}

run bodies 60 --bodies --nodes 10000 --pods 50000
run sweep 240 --workload scheduling-basic --nodes 10000 --pods 50000 --shards 1,2,4,8 --profile both
run sweep-100k 100 --workload scheduling-basic --nodes 10000 --pods 100000 --shards 8
run rate-half 120 --workload scheduling-basic --nodes 10000 --pods 50000 --shards 8 --rate half
if [ "$mode" = full ]; then
  run n50k 240 --workload scheduling-basic --nodes 50000 --pods 100000 --shards 16
  run fill 120 --workload fill-90 --nodes 10000 --pods 50000 --shards 8
  run ingest 120 --ingest --pods 100000 --nodes 100
  run memory 180 --memory --nodes 10000 --pods 100000 --shards 8
fi
echo "wrote $out"
