#!/usr/bin/env bash
# On a lent GPU machine, from the repository root, after benchmarks/lease_pack.sh here:
#   bash benchmarks/lease_device.sh MINUTES OUT [lease.py run options...]
# installs the carried wheels, prepares the carried datasets, and runs
# `benchmarks/lease.py run` for MINUTES (applying .lease-data/code.bundle first, and the
# queue .lease-data/queue.json where one was written there instead of the repository's).
# Back here: python benchmarks/lease.py bring_back FILES_AT.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: bash benchmarks/lease_device.sh MINUTES OUT [options]" >&2; exit 2; }
minutes=$1
out=$2
shift 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD PYTHON=$(command -v python3) PYTHONUNBUFFERED=1
nvidia-smi -L || true
for raw in .lease-data/raw/*.txt; do
  [ -e "$raw" ] || continue
  name=$(basename "$raw" .txt)
  python3 -m dataset_prep "$name" --raw "$raw" --out .lease-data --format one-line \
    --quiet >/dev/null || { echo "lease_device: $name not prepared" >&2; exit 9; }
done
options=()
[ -f .lease-data/code.bundle ] && options+=(--code_bundle .lease-data/code.bundle)
queue=()
[ -f .lease-data/queue.json ] && queue=(--queue .lease-data/queue.json)
python3 benchmarks/lease.py "${queue[@]}" run --minutes "$minutes" --data_path .lease-data \
  --out "$out" "${options[@]}" "$@" 2>&1 | tee "$out/lease-log.txt"
