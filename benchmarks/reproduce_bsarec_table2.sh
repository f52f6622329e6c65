#!/usr/bin/env bash
# BSARec Table 2 columns BSARec and SASRec under the BSARec authors' protocol
# (--paper: Table 6 settings for BSARec, RecBole's SASRec defaults, which are the
# authors' SASRec defaults; protocol bsarec), trained to early stopping, seeds 42 (the
# authors') then 43 and 44. Resumable: run the same command again after an interruption
# (stored runs are skipped, an unfinished one continues from its last epoch).
#
#   benchmarks/reproduce_bsarec_table2.sh <dataset> <data folder> <out folder>
#   e.g. OMP_NUM_THREADS=1 benchmarks/reproduce_bsarec_table2.sh lastfm /tmp/data /tmp/repro
set -euo pipefail
dataset=${1:?dataset}
data=${2:?data folder holding <dataset>/}
out=${3:?output folder}
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$here/.venv/bin/python}
for seeds in 42 42,43,44; do
    "$python" "$here/run_recbole_freq.py" --compare BSARec,SASRec --dataset="$dataset" --paper \
        --seeds "$seeds" --out "$out/$dataset" --data_path="$data" \
        --checkpoint_dir="$out/saved" --show_progress=False
done
