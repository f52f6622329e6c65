#!/usr/bin/env bash
# The runs of issue "like with like": BSARec Table 2's baselines trained as the authors'
# code trains them (--paper: their loss and settings), side by side in one call:
#   benchmarks/reproduce_like_with_like.sh DATA_PATH OUT_DIR [SECONDS]
# DATA_PATH holds lastfm/ and amazon-beauty/ prepared from the papers' one-line files
# (python -m dataset_prep lastfm --raw LastFM.txt --out DATA_PATH --format one-line).
# Every run is a --compare of its own folder under OUT_DIR (each resumable: run the
# script again on the same OUT_DIR to continue), one torch thread each (--paper pins it):
# - lastfm, --paper: SASRec (BCE, one negative) seeds 42, 43 and 44; GRU4Rec (BPR),
#   Caser (BCE and its L2 terms) and FMLPRec (BCE) seed 42;
# - amazon-beauty, --paper: SASRec seeds 42, 43 and 44; BSARec seeds 43 and 44.
# With SECONDS, every process is stopped after that long; a run stopped mid-way keeps
# its completed epochs in <folder>/partial/ and continues from there next time.
# Every folder shares one checkpoint_dir (OUT_DIR/saved).
# On a lent GPU machine, put OUT_DIR outside the repository (e.g. /tmp/like): each call
# lays the working tree anew and removes what it does not know, resume states included;
# a folder outside it stays while the machine is held.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/side_by_side.sh" reproduce_like_with_like.sh "$@"

for seed in 42 43 44; do
  launch "beauty-SASRec-seed$seed" SASRec --dataset=amazon-beauty --paper --seeds "$seed"
done
for seed in 43 44; do
  launch "beauty-BSARec-seed$seed" BSARec --dataset=amazon-beauty --paper --seeds "$seed"
done
for seed in 42 43 44; do
  launch "lastfm-SASRec-seed$seed" SASRec --dataset=lastfm --paper --seeds "$seed"
done
for model in GRU4Rec Caser FMLPRec; do
  launch "lastfm-$model" "$model" --dataset=lastfm --paper --seeds 42
done
wait_and_report
