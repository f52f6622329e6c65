"""Robustness to noisy training sequences (Rec-Denoiser section 5.3, Fig. 2).

    python benchmarks/noise_curve.py --dataset lastfm --epochs 4
    python benchmarks/noise_curve.py --dataset lastfm --report

Trains each model at each noise ratio (``noise_ratio``: that fraction of the training
interactions replaced by uniform random items outside the user's validation and test
part; validation and test stay clean) and tests it under full-sort ranking and, on the
same checkpoint, under the paper's 100-sampled-negatives protocol (``extra_test_modes``).
Every run writes its own JSON into ``--out/<dataset>/``, so the grid resumes where it
stopped and several processes can share it (``--ratios`` picks a part).  ``--report``
writes the Markdown table and the figure from what is there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import run_grid_then_report

from recbole_freq.files import plain_value, write_atomic

HERE = Path(__file__).resolve().parent
RATIOS = [0.0, 0.05, 0.10, 0.15, 0.20, 0.25]
MODELS = ["SASRec", "RecDenoiser"]
METRICS = ["hit@10", "ndcg@10", "hit@20", "ndcg@20"]


def run_file(folder: Path, model: str, ratio: float) -> Path:
    return folder / f"{model}-noise{round(ratio * 100):02d}.json"


def run_grid(args, folder: Path):
    from recbole_freq.quick_start import run

    for ratio in args.ratios:
        for model in args.models:
            target = run_file(folder, model, ratio)
            if target.exists():
                print(f"done already: {target.name}")
                continue
            summary = run(
                model,
                args.dataset,
                config_dict={
                    "epochs": args.epochs,
                    "noise_ratio": ratio,
                    "extra_test_modes": ["uni100"],
                    "data_path": args.data_path,
                    "show_progress": False,
                    "seed": args.seed,
                },
            )
            kept = {key: value for key, value in summary.items() if key != "config"}
            kept["noise_ratio"] = ratio
            kept["settings"] = {
                key: summary["config"].get(key)
                for key in (
                    "learning_rate",
                    "train_batch_size",
                    "MAX_ITEM_LIST_LENGTH",
                    "n_layers",
                    "n_heads",
                    "hidden_size",
                    "estimator",
                    "sparsity_beta",
                    "sparsity_normalization",
                    "jacobian_gamma",
                    "jacobian_normalization",
                    "noise_scope",
                )
            }
            write_atomic(target, json.dumps(plain_value(kept), indent=2))
            print(f"wrote {target}")


def metric_value(run: dict, source: str, metric: str) -> float:
    """Test ``metric`` of a run under full sort or the sampled protocol."""
    if source == "full":
        return run["test_result"][metric]
    return run["extra_test_results"][source][metric]


def report(folder: Path, dataset: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    if not runs:
        raise SystemExit(f"no runs in {folder}")
    models = sorted({r["model"] for r in runs}, key=lambda m: (m != "SASRec", m))
    by_key = {(r["model"], r["noise_ratio"]): r for r in runs}
    ratios = sorted({r["noise_ratio"] for r in runs})
    example = runs[0]
    lines = [
        f"dataset {dataset}; {example['epochs_run']} training epochs per run "
        f"(best epoch by valid {example['valid_metric']}), seed {example['seed']}, "
        f"device {example['device']}; settings of the first run: {example['settings']}",
        "",
        "| noise | model | full-sort "
        + " | full-sort ".join(METRICS)
        + " | uni100 "
        + " | uni100 ".join(METRICS)
        + " | s/epoch |",
        "|---|---|" + "---|" * (2 * len(METRICS) + 1),
    ]
    for ratio in ratios:
        for model in models:
            r = by_key.get((model, ratio))
            if r is None:
                continue
            full = " | ".join(f"{metric_value(r, 'full', m):.4f}" for m in METRICS)
            sampled = " | ".join(f"{metric_value(r, 'uni100', m):.4f}" for m in METRICS)
            lines.append(
                f"| {ratio:.0%} | {model} | {full} | {sampled} | "
                f"{r['train_seconds_per_epoch']:.0f} |"
            )
    relative = ["", "Relative change of RecDenoiser over SASRec (test, same noise):", ""]
    relative.append(
        "| noise | "
        + " | ".join(f"full {m}" for m in METRICS)
        + " | "
        + " | ".join(f"uni100 {m}" for m in METRICS)
        + " |"
    )
    relative.append("|---|" + "---|" * (2 * len(METRICS)))
    for ratio in ratios:
        base, ours = by_key.get(("SASRec", ratio)), by_key.get(("RecDenoiser", ratio))
        if not (base and ours):
            continue
        cells = []
        for source in ("full", "uni100"):
            for m in METRICS:
                value, reference = metric_value(ours, source, m), metric_value(base, source, m)
                cells.append(f"{(value / reference - 1) * 100:+.1f}%" if reference else "-")
        relative.append(f"| {ratio:.0%} | " + " | ".join(cells) + " |")
    text = "\n".join(lines + relative)

    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for axis, (source, metric) in zip(axes, (("full", "ndcg@10"), ("uni100", "hit@10"))):
        for model in models:
            points = [(q, by_key[(model, q)]) for q in ratios if (model, q) in by_key]
            values = [metric_value(r, source, metric) for _, r in points]
            axis.plot([q * 100 for q, _ in points], values, marker="o", label=model)
        axis.set_xlabel("training interactions replaced (%)")
        axis.set_title(f"test {metric} ({'full sort' if source == 'full' else '100 sampled'})")
        axis.legend()
    figure.suptitle(f"Noise robustness on {dataset}")
    figure.tight_layout()
    png = folder.parent / f"noise-curve-{dataset}.png"
    write_atomic(png, lambda handle: figure.savefig(handle, format="png", dpi=100))
    write_atomic(folder.parent / f"noise-curve-{dataset}.md", text + "\n")
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="lastfm")
    parser.add_argument("--data_path", default="dataset/")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--ratios", default=",".join(str(r) for r in RATIOS))
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=2020)
    parser.add_argument("--out", default=str(HERE / "results" / "noise-curve"))
    parser.add_argument("--report", action="store_true", help="only write the table and figure")
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.ratios = [float(r) for r in args.ratios.split(",") if r]
    run_grid_then_report(args, run_grid, report)


if __name__ == "__main__":
    main()
