#!/usr/bin/env bash
# The runs of issue "the authors' sequence layout", side by side in one call:
#   benchmarks/reproduce_bsarec_layout.sh DATA_PATH OUT_DIR [SECONDS]
# DATA_PATH holds lastfm/ and amazon-beauty/ prepared from the papers' one-line files
# (python -m dataset_prep lastfm --raw LastFM.txt --out DATA_PATH --format one-line).
# Every run is a --compare of its own folder under OUT_DIR (each resumable: run the
# script again on the same OUT_DIR to continue), one torch thread each:
# - lastfm, --paper (bsarec protocol, sequence_layout left): BSARec then SASRec, seeds
#   42, 43 and 44, one process per seed;
# - lastfm, --protocol=bsarec: FMLPRec and DuoRec, seed 42, one process each;
# - amazon-beauty, --paper: BSARec and SASRec, seed 42, one process each (each folder
#   trains the other model after its first; only its first is used).
# With SECONDS, every process is stopped after that long; a run stopped mid-way keeps
# its completed epochs in <folder>/partial/ and continues from there next time.
# Every folder shares one checkpoint_dir (OUT_DIR/saved), so that the run files of the
# three lastfm seeds (and of the two Beauty folders) can be gathered into one folder and
# tabulated with the same --compare command (it skips stored runs).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/side_by_side.sh" reproduce_bsarec_layout.sh "$@"

for seed in 42 43 44; do
  launch "lastfm-seed$seed" BSARec,SASRec --dataset=lastfm --paper --seeds "$seed"
done
launch lastfm-FMLPRec FMLPRec --dataset=lastfm --protocol=bsarec --seeds 42
launch lastfm-DuoRec DuoRec --dataset=lastfm --protocol=bsarec --seeds 42
launch beauty-BSARec BSARec,SASRec --dataset=amazon-beauty --paper --seeds 42
launch beauty-SASRec SASRec,BSARec --dataset=amazon-beauty --paper --seeds 42
wait_and_report
