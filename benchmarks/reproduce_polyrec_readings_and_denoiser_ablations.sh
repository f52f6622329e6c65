#!/usr/bin/env bash
# The runs of issue "PolyRec and Rec-Denoiser as their papers describe them", side by side:
#   benchmarks/reproduce_polyrec_readings_and_denoiser_ablations.sh DATA_PATH OUT_DIR [SECONDS]
# - OUT_DIR/beauty-polyrec-readings: amazon-beauty, --paper, protocol recbole: PolyRec's
#   three readings of eq. 13 (trc_skip: skip-truncated, the reading before issue 66;
#   skip-identity-and-truncated, the reading since; skip-bsarec-mix) and the count
#   baselines, POLYREC_SEEDS (the chosen reading's seeds 43 and 44: the folder README);
# - OUT_DIR/beauty-recdenoiser-ablations: amazon-beauty, --paper (the Rec-Denoiser paper's
#   protocol sasrec, n 25), patience 30 (stopping_step 30, at most 200 epochs): SASRec,
#   RecDenoiser and its frozen-masks, without-sparsity and jacobian-as-written rows, the
#   count baselines;
# - OUT_DIR/beauty-recdenoiser-sasrec-block: the same, the backbone alone and RecDenoiser
#   on the plugin's core with SASRec's own block and optimizer (block_norm sasrec_pre,
#   adam_beta2 0.98), so that pair differs only in the denoiser.
# POLYREC_SEEDS (default 42) and DENOISER_SEEDS (default 2020) are the seeds; PARALLEL
# (default 1) the runs each command packs at once (auto on a lent GPU machine). DATA_PATH
# holds amazon-beauty/ prepared from Beauty.txt (README, "Reproducing the papers' tables").
# Each folder is one resumable --compare: run the script again on the same OUT_DIR to
# continue (stored runs are skipped, a stopped run continues from OUT_DIR/<folder>/partial/).
# With SECONDS, every process is stopped after that long.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/side_by_side.sh" \
  reproduce_polyrec_readings_and_denoiser_ablations.sh "$@"

polyrec_seeds=${POLYREC_SEEDS:-42}
denoiser_seeds=${DENOISER_SEEDS:-2020}
parallel=${PARALLEL:-1}
counts=TransitionCount,TransitionCount@variant=last-5
readings=PolyRec@variant=skip-truncated,PolyRec@variant=skip-identity-and-truncated,PolyRec@variant=skip-bsarec-mix
ablations=SASRec,RecDenoiser,RecDenoiser@variant=frozen-masks,RecDenoiser@variant=without-sparsity,RecDenoiser@variant=jacobian-as-written

launch beauty-polyrec-readings "$readings,$counts" --dataset=amazon-beauty --paper \
  --protocol=recbole --seeds "$polyrec_seeds" --parallel "$parallel" --threads_per_run 1
launch beauty-recdenoiser-ablations "$ablations,$counts" --dataset=amazon-beauty --paper \
  --stopping_step=30 --seeds "$denoiser_seeds" --parallel "$parallel" --threads_per_run 1
launch beauty-recdenoiser-sasrec-block RecDenoiser@variant=without-denoiser,RecDenoiser \
  --dataset=amazon-beauty --paper --stopping_step=30 --block_norm=sasrec_pre --adam_beta2=0.98 \
  --seeds "$denoiser_seeds" --parallel "$parallel" --threads_per_run 1
wait_and_report
