#!/usr/bin/env bash
# BSARec Table 2 on the five datasets we have (ML-1M is not available here): BSARec and
# the baselines with paper settings (--paper: properties/paper/<model>/<dataset>.yaml,
# the authors' losses; protocol bsarec), seeds 42, 43, 44, packed onto this machine;
# resumable (the same command continues; with TIME_LIMIT, e.g. 4h, every run stops at an
# epoch boundary before it, exit code 3). Its models x datasets table: OUT/grid.md.
#   benchmarks/reproduce_bsarec_table2.sh DATA_PATH OUT_DIR [TIME_LIMIT] [--key=value ...]
# DATA_PATH holds the datasets prepared from ../shared/data/s3rec (README, "Reproducing
# the papers' tables"); MODELS (default BSARec,SASRec) and SEEDS override the grid.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
data=${1:?DATA_PATH}; out=${2:?OUT_DIR}; limit=${3:-}; shift $(( $# < 3 ? $# : 3 ))
exec "${PYTHON:-$here/.venv/bin/python}" "$here/run_recbole_freq.py" --compare "${MODELS:-BSARec,SASRec}" --dataset=lastfm,amazon-beauty,amazon-sports-outdoors,amazon-toys-games,yelp --paper --seeds "${SEEDS:-42,43,44}" --parallel auto --out "$out" --data_path="$data" --checkpoint_dir="$out/saved" ${limit:+--time_limit "$limit"} "$@"
