"""Learning curves from the run summaries that ``run_recbole_freq.py`` writes.

    python benchmarks/learning_curves.py saved/BSARec-*.json --out benchmarks/results/curves.png

Plots per epoch the training loss and the validation HR@20 / NDCG@20 of each run, and
prints a Markdown table of each run's best-epoch validation and test metrics.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from recbole_freq.files import write_atomic  # noqa: E402

METRICS = ["hit@5", "ndcg@5", "hit@10", "ndcg@10", "hit@20", "ndcg@20"]


def load(paths):
    return [json.loads(Path(p).read_text()) for p in paths]


def plot(summaries, out: Path):
    figure, axes = plt.subplots(1, 3, figsize=(15, 4))
    for summary in summaries:
        label = f"{summary['model']} / {summary['dataset']}"
        epochs = [e["epoch"] for e in summary["history"]]
        axes[0].plot(epochs, [e["train_loss"] for e in summary["history"]], label=label)
        scored = [e for e in summary["history"] if "valid" in e]
        for axis, metric in zip(axes[1:], ("hit@20", "ndcg@20")):
            axis.plot(
                [e["epoch"] for e in scored], [e["valid"][metric] for e in scored], label=label
            )
    for axis, title in zip(
        axes, ("training loss (sum over batches)", "valid HR@20", "valid NDCG@20")
    ):
        axis.set_title(title)
        axis.set_xlabel("epoch")
        axis.legend()
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, lambda handle: figure.savefig(handle, format="png", dpi=100))


def table(summaries) -> str:
    rows = [
        "| model | dataset | epochs (best) | s/epoch | "
        + " | ".join(f"test {m}" for m in METRICS)
        + " |",
        "|---|---|---|---|" + "---|" * len(METRICS),
    ]
    for s in summaries:
        values = " | ".join(f"{s['test_result'][m]:.4f}" for m in METRICS)
        rows.append(
            f"| {s['model']} | {s['dataset']} | {s['epochs_run']} ({s['best_epoch']}) | "
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
    args = parser.parse_args(argv)
    summaries = load(args.summaries)
    plot(summaries, Path(args.out))
    print(table(summaries))
    print(f"\nfigure: {args.out}")


if __name__ == "__main__":
    main()
