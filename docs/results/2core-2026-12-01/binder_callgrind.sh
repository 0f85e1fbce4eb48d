#!/bin/bash
# binder_callgrind.sh N: the binder's instructions per task (binder_harness.py); $PYTHON (default python)
# must import the gosched package to measure. Deterministic up to the writer's ack thread: the same
# code gives the same count within a few instructions per task.
n=${1:-20000}; here=$(dirname "$0"); out=$(mktemp -d); py=${PYTHON:-python}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1  # idle BLAS threads spin: millions of instructions of noise
"$py" -P "$here/binder_harness.py" "$n" 0 > /dev/null  # records the batches the first time
for m in 0 1 2; do
  PYTHONHASHSEED=0 setarch "$(uname -m)" -R valgrind --tool=callgrind --callgrind-out-file="$out/cg.$m" \
    "$py" -P "$here/binder_harness.py" "$n" $m > "$out/log.$m" 2>&1 &
done
wait
grep -h "replies\|reference" "$out/log.1" "$out/log.2"
i() { grep -o "Collected : [0-9]*" "$out/log.$1" | awk '{print $3}'; }
echo "binder instructions per task: $(( (2 * $(i 1) - $(i 0) - $(i 2)) / n )) (callgrind files in $out)"
