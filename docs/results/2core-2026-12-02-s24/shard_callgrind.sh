#!/bin/bash
# shard_callgrind.sh N: the shard's instructions per unit scheduled (shard_harness.py); PYTHONPATH
# must reach the gosched package to measure. One OpenBLAS thread (its idle threads spin).
n=${1:-20000}; here=$(dirname "$0"); out=$(mktemp -d)
for m in 0 1; do
  OPENBLAS_NUM_THREADS=1 PYTHONHASHSEED=0 setarch "$(uname -m)" -R \
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.$m" \
    python -P "$here/shard_harness.py" "$n" $m > "$out/log.$m" 2>&1 &
done
wait
i() { grep -o "Collected : [0-9]*" "$out/log.$1" | awk '{print $3}'; }
echo "shard instructions per unit: $(( ($(i 1) - $(i 0)) / n ))"
