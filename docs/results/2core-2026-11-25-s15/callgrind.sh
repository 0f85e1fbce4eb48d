#!/bin/bash
# callgrind.sh N: the dispatcher's instructions per task (dispatcher_harness.py); PYTHONPATH must
# reach the gosched package to measure. Deterministic: the same code gives the same count (one
# OpenBLAS thread: its idle threads spin, and added up to 500 instructions a task of noise).
n=${1:-20000}; here=$(dirname "$0"); out=$(mktemp -d)
# First the same bytes to the shards and the same state after the reports as the code before the
# seventeenth session's cuts (batches.sha256, recorded at 20,000 jobs; the batches' hash again at
# eeb077d, whose Job gained time_limit and max_retries, before the cuts): a cut must change neither.
if ! python -P "$here/dispatcher_harness.py" 20000 check | diff - "$here/batches.sha256"; then
  echo "dispatcher_harness.py check: not what batches.sha256 recorded" >&2; exit 1
fi
for m in 0 1 2; do
  OPENBLAS_NUM_THREADS=1 PYTHONHASHSEED=0 setarch "$(uname -m)" -R \
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.$m" \
    python -P "$here/dispatcher_harness.py" "$n" $m > "$out/log.$m" 2>&1 &
done
wait
i() { grep -o "Collected : [0-9]*" "$out/log.$1" | awk '{print $3}'; }
echo "dispatcher instructions per task: $(( (2 * $(i 1) - $(i 0) - $(i 2)) / n ))"
