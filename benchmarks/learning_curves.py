"""Learning curves from the run summaries that ``run_recbole_freq.py`` writes.

    python benchmarks/learning_curves.py saved/BSARec-*.json --out benchmarks/results/curves.png
    python benchmarks/learning_curves.py <compare --out>/runs/*.json --metric ndcg@10

Takes run summaries or the stored runs of ``--compare`` (``runs/*.json``).  Plots per
epoch the training loss and two validation metrics of each run (HR@20 / NDCG@20, or
``--metric``), and, for runs with learned masks (Rec-Denoiser), the masks after each
epoch: the pruned fraction and the mean keep probability, averaged over layers.  Prints
a Markdown table of each run's epochs and test metrics.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from recbole_freq.utils.files import write_atomic  # noqa: E402

METRICS = ["hit@5", "ndcg@5", "hit@10", "ndcg@10", "hit@20", "ndcg@20"]


def load(paths):
    """Run summaries; a stored run of ``--compare`` holds its summary under ``summary``."""
    loaded = [json.loads(Path(p).read_text()) for p in paths]
    return [entry.get("summary", entry) for entry in loaded]


def _layer_mean(epoch, key):
    values = epoch["model_report"][key]
    return sum(values) / len(values)


def plot(summaries, out: Path, metrics=("hit@20", "ndcg@20")):
    with_masks = any("model_report" in e for s in summaries for e in s["history"])
    panels = 1 + len(metrics) + with_masks
    figure, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    for summary in summaries:
        label = f"{summary['model']} / {summary['dataset']} / seed {summary['seed']}"
        epochs = [e["epoch"] for e in summary["history"]]
        (line,) = axes[0].plot(epochs, [e["train_loss"] for e in summary["history"]], label=label)
        scored = [e for e in summary["history"] if "valid" in e]
        for axis, metric in zip(axes[1:], metrics):
            axis.plot(
                [e["epoch"] for e in scored], [e["valid"][metric] for e in scored], label=label
            )
        masked = [e for e in summary["history"] if "model_report" in e]
        if masked:
            epochs = [e["epoch"] for e in masked]
            color = line.get_color()
            axes[-1].plot(epochs, [_layer_mean(e, "pruned_fraction") for e in masked], color=color)
            axes[-1].plot(
                epochs,
                [_layer_mean(e, "keep_probability_mean") for e in masked],
                color=color,
                linestyle="--",
            )
    titles = ["training loss (sum over batches)"] + [f"valid {m}" for m in metrics]
    if with_masks:
        titles.append("masks: pruned share (solid), mean keep prob. (dashed)")
    for axis, title in zip(axes, titles):
        axis.set_title(title)
        axis.set_xlabel("epoch")
    for axis in axes[: 1 + len(metrics)]:
        axis.legend(fontsize="small")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, lambda handle: figure.savefig(handle, format="png", dpi=100))


def table(summaries) -> str:
    rows = [
        "| model | dataset | seed | epochs (best) | s/epoch | "
        + " | ".join(f"test {m}" for m in METRICS)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(METRICS),
    ]
    for s in summaries:
        values = " | ".join(f"{s['test_result'][m]:.4f}" for m in METRICS)
        rows.append(
            f"| {s['model']} | {s['dataset']} | {s['seed']} | {s['epochs_run']} ({s['best_epoch']}) | "
            f"{s['train_seconds_per_epoch']:.0f} | {values} |"
        )
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "summaries", nargs="+", help="summary .json files written next to checkpoints"
    )
    parser.add_argument("--out", default="learning_curves.png")
    parser.add_argument(
        "--metric",
        action="append",
        help="validation metric to plot (twice at most; default hit@20 and ndcg@20)",
    )
    args = parser.parse_args(argv)
    metrics = args.metric or ["hit@20", "ndcg@20"]
    if len(metrics) > 2:
        parser.error("--metric: at most two")
    summaries = load(args.summaries)
    scored = [e["valid"] for s in summaries for e in s["history"] if "valid" in e]
    missing = [m for m in metrics if any(m not in valid for valid in scored)]
    if missing:
        parser.error(f"--metric: not every run has validation {', '.join(missing)}")
    plot(summaries, Path(args.out), metrics)
    print(table(summaries))
    print(f"\nfigure: {args.out}")


if __name__ == "__main__":
    main()
