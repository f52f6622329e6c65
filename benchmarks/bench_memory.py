"""Peak training memory: calibrate and check the memory guard; fused attention on the CPU.

Part 1 (calibration): for each model family and (batch, length) point, a child process
builds the model through the real pipeline (FreqConfig, create_dataset,
data_preparation) on a dataset, takes a few training batches, resets its resident-set
high-water mark (``/proc/self/clear_refs``) and runs three training steps; the peak above
the set-up footprint is the measurement.  The two coefficients of each family in
``recbole_freq/memory.py`` are fitted by least squares and scaled so that no point's
estimate is below its measurement (``--fit`` prints them); the table reports the
estimate with the coefficients in the code, divided by the measurement.

Part 2 (operator): one attention operator's forward + backward at batch 64, two heads of
size 32, with the explicit softmax (what ``SoftmaxAttention`` runs in CPU training
with attention dropout) and with PyTorch's ``scaled_dot_product_attention`` with and
without dropout: peak memory and time per length, one child process per point.

    python benchmarks/bench_memory.py                     # both parts, ml-100k
    python benchmarks/bench_memory.py --models BSARec --fit
    python benchmarks/bench_memory.py --report benchmarks/results/memory-calibration-cpu.json

``--report`` re-tabulates saved measurements against the coefficients now in the code
(after they were updated from ``--fit``) without measuring again.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODELS = "SASRec,BSARec,FBSARec,PolyRec,RecDenoiser,BERT4RecDenoiser"
POINTS = "256x50,256x100,128x200,64x300,32x500"
SIZES = {
    "hidden_size": 64,
    "inner_size": 256,
    "n_layers": 2,
    "n_heads": 2,
    "show_progress": False,
    "state": "WARNING",
}


def _status_kb(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak():
    gc.collect()
    # Hand memory freed during set-up back to the OS, or the steps could reuse it unseen.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kb("VmRSS")


def model_child(model_name, dataset, batch, length, steps=3):
    sys.path.insert(0, str(ROOT))
    import torch

    from recbole_freq.config.configurator import FreqConfig
    from recbole_freq.quick_start.memory import estimate_bytes, step_shape
    from recbole_freq.quick_start.quick_start import load_splits, new_model

    overrides = dict(SIZES, MAX_ITEM_LIST_LENGTH=length, train_batch_size=batch, seed=2024)
    config = FreqConfig(model_name, dataset, cmd_overrides=overrides)
    _, (train, _, _) = load_splits(config)
    model = new_model(config, train)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = []
    for interaction in train:
        batches.append(interaction[0] if isinstance(interaction, tuple) else interaction)
        if len(batches) == steps:
            break
    shape = step_shape(config, train._dataset.item_num)
    base = _reset_peak()
    start = time.perf_counter()
    for interaction in batches:
        model.train()
        optimizer.zero_grad()
        model.calculate_loss(interaction).backward()
        optimizer.step()
    seconds = (time.perf_counter() - start) / len(batches)
    peak = (_status_kb("VmHWM") - base) * 1024
    print(
        json.dumps(
            {
                "model": model_name,
                "batch": batch,
                "length": length,
                "items": shape.items,
                "terms": shape.terms(),
                "measured_bytes": peak,
                "estimate_bytes": estimate_bytes(model_name, shape),
                "seconds_per_step": seconds,
            }
        )
    )


def operator_child(kind, length, batch=64, heads=2, head_size=32, dropout=0.5, steps=3):
    sys.path.insert(0, str(ROOT))
    import torch
    import torch.nn.functional as F

    from recbole_freq.model.layers import SoftmaxAttention, build_attention_mask

    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, length, head_size, requires_grad=True) for _ in range(3))
    lengths = torch.randint(1, length + 1, (batch,))
    mask = build_attention_mask((torch.arange(length)[None] < lengths[:, None]).long())
    explicit = SoftmaxAttention(dropout).train()

    def step():
        if kind == "explicit":
            out = explicit(q, k, v, mask)  # CPU training with dropout: explicit A
        else:
            p = dropout if kind == "fused" else 0.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        out.sum().backward()

    step()
    base = _reset_peak()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    print(
        json.dumps(
            {
                "kind": kind,
                "length": length,
                "peak_mb": (_status_kb("VmHWM") - base) / 1024,
                "ms_per_step": (time.perf_counter() - start) * 1000 / steps,
            }
        )
    )


def child(*args):
    result = subprocess.run(
        [sys.executable, __file__, "--child", *map(str, args)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"child {args} failed: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def fit(rows):
    """Least-squares coefficients (attention, activations), scaled up so that no
    estimate falls below its measurement."""
    terms = np.array([row["terms"] for row in rows], dtype=float)
    measured = np.array([row["measured_bytes"] for row in rows], dtype=float) / 4
    target = measured - terms[:, 2]
    coefficients, *_ = np.linalg.lstsq(terms[:, :2], target, rcond=None)
    coefficients = np.clip(coefficients, 0.0, None)
    variable = terms[:, :2] @ coefficients
    scale = max(1.0, float(np.max(target / variable)))
    # Rounded up, so that the rounding cannot bring an estimate below its measurement.
    return [math.ceil(float(c) * scale * 100) / 100 for c in coefficients]


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--points", default=POINTS, help="batch x length, comma-separated")
    parser.add_argument("--dataset", default="ml-100k")
    parser.add_argument("--lengths", default="50,200,500,1000", help="operator lengths")
    parser.add_argument("--fit", action="store_true", help="print fitted coefficients")
    parser.add_argument("--skip_operator", action="store_true")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--report", default=None, help="saved JSON to re-tabulate")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.child[0] == "model":
            model_child(args.child[1], args.child[2], int(args.child[3]), int(args.child[4]))
        else:
            operator_child(args.child[1], int(args.child[2]))
        return

    import torch

    from recbole_freq.quick_start.memory import StepShape, estimate_bytes
    from recbole_freq.utils.files import write_atomic

    points = [tuple(int(n) for n in p.split("x")) for p in args.points.split(",")]
    rows, fitted, operator_rows = [], {}, []
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        rows, operator_rows = saved["rows"], saved["operator"]
        for model in dict.fromkeys(row["model"] for row in rows):
            fitted[model] = fit([row for row in rows if row["model"] == model])
    for model in [] if args.report else args.models.split(","):
        mine = []
        for batch, length in points:
            row = child("model", model, args.dataset, batch, length)
            print(json.dumps(row), flush=True)
            mine.append(row)
        fitted[model] = fit(mine)
        rows += mine
    for row in rows:  # the estimate with the coefficients now in the code
        sizes = (SIZES["hidden_size"], SIZES["inner_size"], SIZES["n_heads"], SIZES["n_layers"])
        shape = StepShape(row["batch"], row["length"], *sizes, row["items"], 0)
        # The scored positions (1, or a cloze model's masked ones) from the saved terms.
        scored = (row["terms"][2] - shape.terms()[2]) / (3 * row["batch"] * row["items"])
        shape = StepShape(row["batch"], row["length"], *sizes, row["items"], round(scored))
        assert list(shape.terms()) == list(row["terms"]), "saved sizes differ from SIZES"
        row["estimate_bytes"] = estimate_bytes(row["model"], shape)
    if not args.skip_operator and not args.report:
        for length in (int(n) for n in args.lengths.split(",")):
            for kind in ("explicit", "fused", "fused_no_dropout"):
                row = child("operator", kind, length)
                print(json.dumps(row), flush=True)
                operator_rows.append(row)
    if args.fit:
        print("fitted COEFFICIENTS:", json.dumps(fitted))

    header = (
        f"Peak training-step memory above set-up (resident set), dataset {args.dataset}, "
        f"hidden {SIZES['hidden_size']}, inner {SIZES['inner_size']}, {SIZES['n_layers']} layers, "
        f"{SIZES['n_heads']} heads, 3 steps per point in its own process; torch "
        f"{torch.__version__}, CPU, {torch.get_num_threads()} threads"
    )
    lines = [
        header,
        "",
        "| model | batch | length | measured MB | estimate MB | estimate / measured | s/step |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        estimate = row["estimate_bytes"] or 0
        lines.append(
            f"| {row['model']} | {row['batch']} | {row['length']} | "
            f"{row['measured_bytes'] / 2**20:.0f} | {estimate / 2**20:.0f} | "
            f"{estimate / max(row['measured_bytes'], 1):.2f} | {row['seconds_per_step']:.2f} |"
        )
    lines += ["", "Coefficients fitted on these points (attention, activations):", ""]
    lines += [f"- {model}: {values}" for model, values in fitted.items()]
    if operator_rows:
        lines += [
            "",
            "Attention operator alone, forward + backward, batch 64, 2 heads of 32; "
            "explicit = softmax(QK^T) with attention dropout 0.5 as SoftmaxAttention trains "
            "on the CPU; fused = scaled_dot_product_attention with dropout 0.5; "
            "fused_no_dropout = the same with dropout 0. Times: one process per point, "
            "not interleaved, so indicative only.",
            "",
            "| length | kind | peak MB | ms/step |",
            "|---|---|---|---|",
        ]
        for row in operator_rows:
            lines.append(
                f"| {row['length']} | {row['kind']} | {row['peak_mb']:.0f} | {row['ms_per_step']:.0f} |"
            )
    report = "\n".join(lines) + "\n"
    print(report)
    write_atomic(Path(args.out) / "memory-calibration-cpu.md", report)
    write_atomic(
        Path(args.out) / "memory-calibration-cpu.json",
        json.dumps(
            {"header": header, "rows": rows, "fitted": fitted, "operator": operator_rows},
            indent=2,
        )
        + "\n",
    )


if __name__ == "__main__":
    main()
