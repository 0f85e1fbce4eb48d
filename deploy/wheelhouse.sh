#!/usr/bin/env bash
# Wheels to install GoSched on a machine that cannot reach a package index (an air-gapped cluster,
# a benchmark box), built on one that can:
#
#   bash deploy/wheelhouse.sh DIR [--python 3.12] [--skip numpy,grpcio,...] [--no-java]
#
# DIR gets the gosched wheel and every runtime dependency as x86-64 manylinux binary wheels for
# that CPython version (default: this machine's python3). --skip leaves out packages the target
# already has (their wheels are dropped after pip resolves the whole set, so the versions of the
# rest still fit together). --no-java strips ray/jars/ (Ray's Java worker support, about 32 MB of
# its wheel) from the Ray wheel: GoSched runs no Java actors. On the target:
#
#   pip install --no-index --find-links DIR gosched                         # a normal install
#   pip install --no-index --no-deps --target /tmp/site DIR/*.whl           # beside what is there
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage="usage: bash deploy/wheelhouse.sh DIR [--python X.Y] [--skip NAME,...] [--no-java]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
out=$1
shift
py=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
skip=""
no_java=0
while [ $# -gt 0 ]; do
  case $1 in
    --python) py=${2:?--python: needs a version such as 3.12}; shift 2 ;;
    --skip) skip=${2:?--skip: needs a comma-separated list of package names}; shift 2 ;;
    --no-java) no_java=1; shift ;;
    *) echo "error: $1: unknown option" >&2; echo "$usage" >&2; exit 2 ;;
  esac
done
[[ $py =~ ^3\.[0-9]+$ ]] || { echo "error: --python: $py is not a version such as 3.12" >&2; exit 2; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"
pip=(python3 -m pip)
[ -x "$root/.venv/bin/python" ] && pip=("$root/.venv/bin/python" -m pip)

# The project's own wheel (pure Python), then its dependency closure for the target's interpreter.
"${pip[@]}" wheel --quiet --no-deps -w "$out" "$root"
wheel=$(ls -t "$out"/gosched-*.whl | head -n 1)
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done
"${pip[@]}" download --quiet --only-binary=:all: --python-version "$py" --implementation cp \
  "${platforms[@]}" -d "$out" "$wheel"

# Package names compare as PEP 503 normalises them (lower case, runs of -_. as one -).
normal() { tr 'A-Z' 'a-z' <<<"$1" | sed -E 's/[-_.]+/-/g'; }
IFS=, read -r -a skipped <<<"$skip"
for name in "${skipped[@]}"; do
  [ -n "$name" ] || continue
  want=$(normal "$name")
  for f in "$out"/*.whl; do
    have=$(normal "$(basename "$f" | cut -d- -f1)")
    [ "$have" = "$want" ] && rm -f "$f"
  done
done

if [ "$no_java" = 1 ]; then
  for f in "$out"/ray-*.whl; do
    [ -e "$f" ] || continue
    # Rewritten without ray/jars/ and without their RECORD lines, so pip installs it unchanged.
    python3 - "$f" <<'EOF'
import os
import sys
import zipfile

path = sys.argv[1]
tmp = path + ".tmp"
with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
    for info in src.infolist():
        if info.filename.startswith("ray/jars/"):
            continue
        data = src.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines(keepends=True)
            data = "".join(line for line in lines if not line.startswith("ray/jars/")).encode()
        dst.writestr(info, data)
os.replace(tmp, path)
EOF
  done
fi
ls -1 "$out"
du -sh "$out"
