#!/usr/bin/env bash
# The runs of issue "PolyRec, FBSARec and BSARec's ablations", side by side in one call:
#   benchmarks/reproduce_ablations_and_polyrec.sh DATA_PATH OUT_DIR [SECONDS]
# - OUT_DIR/lastfm-ablations: lastfm, --paper, protocol bsarec: BSARec, its Table 7
#   ablations (only A, only A_IB, scalar beta) and FBSARec's six fusion variants (thesis
#   Tables 1-6), the Improv. rows against BSARec;
# - OUT_DIR/beauty-polyrec: amazon-beauty, --paper, protocol recbole: PolyRec beside
#   DuoRec and FEARec with their authors' settings (PolyRec in today's --paper reading of
#   eq. 13; the stored folder's PolyRec run is the reading before, trc_skip truncated).
# SEEDS (default 42) are the seeds of both; PARALLEL (default 1) the runs each command
# packs at once (auto on a lent GPU machine). DATA_PATH holds lastfm/ and amazon-beauty/
# prepared from the papers' one-line files (README, "Reproducing the papers' tables").
# Each folder is one resumable --compare: run the script again on the same OUT_DIR to
# continue (stored runs are skipped, a stopped run continues from OUT_DIR/<folder>/partial/).
# With SECONDS, every process is stopped after that long.
# On a lent GPU machine, put OUT_DIR outside the repository (e.g. /tmp/abl): each call
# lays the working tree anew and removes what it does not know, resume states included.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/side_by_side.sh" reproduce_ablations_and_polyrec.sh "$@"

seeds=${SEEDS:-42}
parallel=${PARALLEL:-1}
ablations=BSARec,BSARec@variant=only-self-attention,BSARec@variant=only-inductive-bias,BSARec@variant=scalar-beta
fusions=FBSARec@variant=fusion-sa,FBSARec@variant=fusion-ib,FBSARec@variant=fusion-sa-ib,FBSARec@variant=fusion-bsa-sa,FBSARec@variant=fusion-bsa-ib,FBSARec@variant=fusion-bsa-sa-ib

launch lastfm-ablations "$ablations,$fusions" --dataset=lastfm --paper --baselines BSARec \
  --seeds "$seeds" --parallel "$parallel" --threads_per_run 1
launch beauty-polyrec PolyRec,DuoRec,FEARec --dataset=amazon-beauty --paper --protocol=recbole \
  --seeds "$seeds" --parallel "$parallel" --threads_per_run 1
wait_and_report
