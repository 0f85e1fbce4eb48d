#!/bin/bash
# writer_callgrind.sh N: the store writer's instructions per task bound (writer_harness.py); PYTHONPATH
# (or a venv's python as PYTHON) must reach the gosched package to measure. Deterministic: the same
# code gives the same count. GROUP=k in the environment: k frames per transaction.
n=${1:-20000}; here=$(dirname "$0"); out=$(mktemp -d); py=${PYTHON:-python}
for m in setup child0 child commit pack; do
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONHASHSEED=0 setarch "$(uname -m)" -R valgrind --tool=callgrind --callgrind-out-file="$out/cg.$m" \
    "$py" -P "$here/writer_harness.py" "$n" $m > "$out/log.$m" 2>&1 &
done
wait
i() { grep -o "Collected : [0-9]*" "$out/log.$1" | awk '{print $3}'; }
echo "child (frames in, commit_many, acks) instructions per task: $(( ($(i child) - $(i child0)) / n ))"
echo "commit_many alone instructions per task: $(( ($(i commit) - $(i setup)) / n ))"
echo "binder's write (packing a frame) instructions per task: $(( ($(i pack) - $(i setup)) / n ))"
echo "callgrind outputs: $out"
