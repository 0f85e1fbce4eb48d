#!/bin/bash
# admission_callgrind.sh N [R] [C]: the dispatcher's admission instructions per job (admission_harness.py);
# PYTHONPATH must reach the gosched package. Deterministic: the same code gives the same count.
n=${1:-30000}; r=${2:-1}; c=${3:-300}; here=$(dirname "$0"); out=$(mktemp -d)
for m in 0 1; do
  OPENBLAS_NUM_THREADS=1 PYTHONHASHSEED=0 setarch "$(uname -m)" -R valgrind --tool=callgrind --callgrind-out-file="$out/cg.$m" \
    python -P "$here/admission_harness.py" "$n" $m "$r" "$c" > "$out/log.$m" 2>&1 &
done
wait
i() { grep -o "Collected : [0-9]*" "$out/log.$1" | awk '{print $3}'; }
echo "admission instructions per job ($n jobs of $r tasks, calls of $c): $(( ($(i 1) - $(i 0)) / n ))  [$out]"
