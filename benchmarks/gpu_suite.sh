#!/usr/bin/env bash
# The GPU suite in one command, on a machine with a CUDA device (nothing else needed):
#   benchmarks/gpu_suite.sh [OUT_DIR] [DATA_PATH]   (default: benchmarks/results/gpu-suite)
# DATA_PATH: a folder with lastfm/ prepared for the speed benchmark (default: RecBole's
# bundled ml-100k, which needs no data step).
# 1. tests/test_gpu.py: every model trains an epoch on CUDA in fp32 and with AMP, and the
#    fused attention's CUDA branches compute the explicit attention;
# 2. benchmarks/bench_epoch.py (with DATA_PATH holding amazon-beauty): seconds of training
#    and of validation per epoch of one run alone, Beauty under --paper, plain step against
#    the overlapped loader and the captured (CUDA graph) step (SASRec and BSARec; then
#    PolyRec and FEARec, plain and captured);
# 3. benchmarks/bench_speed.py: training and inference time per step of the plugin models
#    and the papers' baselines against RecBole's SASRec, same sizes and batches, one run;
# then OUT_DIR/gpu-suite.md holds both as markdown tables. Exit status: the tests'.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
python=${PYTHON:-$root/.venv/bin/python}
if [ ! -x "$python" ]; then
  scripts/dev setup
  python=$root/.venv/bin/python
fi
out=${1:-benchmarks/results/gpu-suite}
data=${2:-$("$python" -c 'import pathlib, recbole; print(pathlib.Path(recbole.__file__).parent / "dataset_example")')}
mkdir -p "$out"

"$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else
    f"gpu_suite: torch {torch.__version__} sees no CUDA device; run this on a GPU machine")'

set +e
"$python" -m pytest -p no:cacheprovider -m gpu tests/test_gpu.py -q \
  --junitxml="$out/tests.xml" >"$out/tests.txt" 2>&1
tests_status=$?
set -e
tail -n 1 "$out/tests.txt"

# The benches in the order of what a short lease needs most (each writes its own table,
# so a suite stopped at its time keeps the ones done); one failing does not stop the next.
if [ -d "$data/amazon-beauty" ]; then
  "$python" benchmarks/bench_epoch.py --out "$out" --name epoch-amazon-beauty-cuda \
    --dataset amazon-beauty --data_path "$data" --device cuda --epochs 3 \
    --models SASRec,BSARec || echo "gpu_suite: bench_epoch (SASRec, BSARec) failed: $?"
  # What bounds the plain epoch: RecBole's loop (a read of the loss every step) against
  # the plugin's; then 8 CPU threads (--paper's determinism gives torch one, and on CUDA
  # the loader's collation is the CPU's work).
  "$python" benchmarks/bench_epoch.py --out "$out" --name epoch-amazon-beauty-cuda-loop \
    --dataset amazon-beauty --data_path "$data" --device cuda --epochs 3 \
    --modes "RecBole's loop,plain" --models BSARec || echo "gpu_suite: bench_epoch (loop) failed: $?"
  "$python" benchmarks/bench_epoch.py --out "$out" --name epoch-amazon-beauty-cuda-8-threads \
    --dataset amazon-beauty --data_path "$data" --device cuda --epochs 3 --threads 8 \
    --modes plain --models BSARec || echo "gpu_suite: bench_epoch (8 threads) failed: $?"
  "$python" benchmarks/bench_epoch.py --out "$out" --name epoch-amazon-beauty-cuda-more \
    --dataset amazon-beauty --data_path "$data" --device cuda --epochs 2 \
    --modes "plain,overlapped + compiled" --models PolyRec,FEARec \
    || echo "gpu_suite: bench_epoch (PolyRec, FEARec) failed: $?"
fi

"$python" benchmarks/bench_speed.py --out "$out" --name speed --data_path "$data" \
  --models SASRec,BSARec,FBSARec,PolyRec,RecDenoiser,FMLPRec,DuoRec,CL4SRec,TiSASRec,SSEPT,FEARec \
  || echo "gpu_suite: bench_speed failed: $?"

"$python" - "$out" <<'PY'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

out = Path(sys.argv[1])
rows = ["| test | outcome | seconds |", "|---|---|---|"]
for case in ET.parse(out / "tests.xml").iter("testcase"):
    outcome = "passed"
    for kind in ("failure", "error", "skipped"):
        if case.find(kind) is not None:
            outcome = kind
    rows.append(f"| {case.get('name')} | {outcome} | {float(case.get('time', 0)):.1f} |")
speed = sorted(out.glob("speed-*.md")) + sorted(out.glob("epoch-*.md"))
text = [
    f"# GPU suite: {torch.cuda.get_device_name(0)}, torch {torch.__version__}",
    "",
    "Command: `benchmarks/gpu_suite.sh`. Tests: tests/test_gpu.py (tiny data, one epoch).",
    "",
    *rows,
    "",
    "## Speed (benchmarks/bench_speed.py, ratios to RecBole's SASRec in the same run)",
    "",
    *(path.read_text() for path in speed),
]
(out / "gpu-suite.md").write_text("\n".join(text) + "\n")
print(f"wrote {out / 'gpu-suite.md'}")
PY
exit "$tests_status"
