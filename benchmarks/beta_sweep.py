"""Rec-Denoiser's sparsity weight beta against what the masks prune and what accuracy
keeps (issue: Rec-Denoiser that denoises).

    python benchmarks/beta_sweep.py --dataset lastfm --data_path /tmp/data
    python benchmarks/beta_sweep.py --dataset lastfm --report

Each run is ``RecDenoiser`` with the paper's settings for the dataset (``--paper``:
``properties/paper/RecDenoiser/<dataset>.yaml``, protocol ``sasrec``: eq. 4's BCE through
the denoising objective, ``sparsity_normalization: auto`` = Algorithm 1's once per
mini-batch), only ``sparsity_beta`` changed, trained to early stopping (or ``--epochs``),
tested against 100 unseen negatives.  ``--reference SASRec`` adds RecBole's SASRec with
the same sizes and protocol.  Every run writes its own JSON into ``--out/<dataset>/``,
so the sweep resumes where it stopped (a finished beta is skipped; an unfinished run
continues from its resume state).  ``--report`` writes the Markdown table and the
figure (pruned fraction against test NDCG@10) from what is there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import run_grid_then_report

from recbole_freq.files import plain_value, write_atomic

HERE = Path(__file__).resolve().parent
BETAS = [0.0, 1e-4, 1e-3, 1e-2, 1e-1, 1.0]
# The backbone sizes of the paper file, given to the reference model too.
SHARED = (
    "protocol",
    "MAX_ITEM_LIST_LENGTH",
    "n_layers",
    "n_heads",
    "hidden_size",
    "inner_size",
    "hidden_act",
    "layer_norm_eps",
    "hidden_dropout_prob",
    "attn_dropout_prob",
)
METRICS = ["hit@10", "ndcg@10", "hit@20", "ndcg@20"]


def run_file(folder: Path, name: str) -> Path:
    return folder / f"{name}.json"


def beta_name(beta: float) -> str:
    return f"RecDenoiser-beta{beta:g}"


def store(target: Path, summary: dict, extra: dict) -> None:
    kept = {key: value for key, value in summary.items() if key != "config"}
    kept.update(extra)
    kept["settings"] = {
        key: summary["config"].get(key)
        for key in SHARED
        + (
            "estimator",
            "sparsity_beta",
            "sparsity_normalization",
            "jacobian_gamma",
            "learning_rate",
            "train_batch_size",
            "epochs",
            "stopping_step",
        )
    }
    resolved = summary.get("model_report", {}).get("sparsity_normalization")
    if resolved:  # what "auto" became for this run
        kept["settings"]["sparsity_normalization"] = resolved
    write_atomic(target, json.dumps(plain_value(kept), indent=2))
    print(f"wrote {target}")


def run_sweep(args, folder: Path) -> None:
    from recbole_freq.config import FreqConfig
    from recbole_freq.quick_start import run

    common = {"data_path": args.data_path, "show_progress": False, "seed": args.seed}
    if args.epochs:
        common["epochs"] = args.epochs
    checkpoints = Path(args.checkpoint_dir) / args.dataset
    for beta in args.betas:
        target = run_file(folder, beta_name(beta))
        if target.exists():
            print(f"done already: {target.name}")
            continue
        overrides = dict(common, sparsity_beta=beta, checkpoint_dir=str(checkpoints))
        resume = checkpoints / "partial" / f"{beta_name(beta)}.resume.pth"
        resume.parent.mkdir(parents=True, exist_ok=True)
        summary = run(
            "RecDenoiser", args.dataset, cmd_overrides=overrides, paper=True, resume_file=resume
        )
        store(target, summary, {"beta": beta})
    if args.reference:
        target = run_file(folder, args.reference)
        if target.exists():
            print(f"done already: {target.name}")
            return
        paper = FreqConfig(
            "RecDenoiser", args.dataset, cmd_overrides={"data_path": args.data_path}, paper=True
        )
        overrides = dict(common, checkpoint_dir=str(checkpoints))
        overrides.update({key: paper[key] for key in SHARED})
        resume = checkpoints / "partial" / f"{args.reference}.resume.pth"
        resume.parent.mkdir(parents=True, exist_ok=True)
        summary = run(args.reference, args.dataset, cmd_overrides=overrides, resume_file=resume)
        store(target, summary, {"beta": None})


def pruned(run: dict) -> list[float]:
    """Pruned fraction of each layer's learned mask (empty for a model without masks)."""
    masks = run.get("model_report", {}).get("learned_masks", [])
    return [entry["pruned_fraction"] for entry in masks]


def report(folder: Path, dataset: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    if not runs:
        raise SystemExit(f"no runs in {folder}")
    sweep = sorted((r for r in runs if r["beta"] is not None), key=lambda r: r["beta"])
    references = [r for r in runs if r["beta"] is None]
    example = (sweep or runs)[0]
    lines = [
        f"dataset {dataset}; protocol {example['protocol']['label']} (test: 100 unseen "
        f"negatives); seed {example['seed']}; device {example['device']}; each run to early "
        f"stopping on valid {example['valid_metric']} (at most "
        f"{example['settings']['epochs']} epochs, stopping_step "
        f"{example['settings']['stopping_step']}); RecDenoiser settings: "
        f"{ {k: v for k, v in example['settings'].items() if k != 'sparsity_beta'} }",
        "",
        "| model | beta | pruned per layer | "
        + " | ".join(METRICS)
        + " | best epoch / epochs | s/epoch |",
        "|---|---|---|" + "---|" * len(METRICS) + "---|---|",
    ]
    for r in references + sweep:
        fractions = ", ".join(f"{f:.3f}" for f in pruned(r)) or "-"
        beta = "-" if r["beta"] is None else f"{r['beta']:g}"
        values = " | ".join(f"{r['test_result'][m]:.4f}" for m in METRICS)
        lines.append(
            f"| {r['model']} | {beta} | {fractions} | {values} | "
            f"{r['best_epoch']} / {r['epochs_run']} | {r['train_seconds_per_epoch']:.1f} |"
        )
    text = "\n".join(lines)

    figure, axis = plt.subplots(figsize=(6, 4))
    xs = [100 * sum(pruned(r)) / max(len(pruned(r)), 1) for r in sweep]
    ys = [r["test_result"]["ndcg@10"] for r in sweep]
    axis.plot(xs, ys, marker="o", label="RecDenoiser")
    for x, y, r in zip(xs, ys, sweep):
        axis.annotate(f"beta {r['beta']:g}", (x, y), textcoords="offset points", xytext=(4, 4))
    for r in references:
        axis.axhline(r["test_result"]["ndcg@10"], linestyle="--", color="grey", label=r["model"])
    axis.set_xlabel("attention links pruned (%, mean over layers)")
    axis.set_ylabel("test NDCG@10 (100 unseen negatives)")
    axis.set_title(f"Rec-Denoiser's beta on {dataset}")
    axis.legend()
    figure.tight_layout()
    write_atomic(
        folder.parent / f"beta-sweep-{dataset}.png",
        lambda handle: figure.savefig(handle, format="png", dpi=100),
    )
    write_atomic(folder.parent / f"beta-sweep-{dataset}.md", text + "\n")
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="lastfm")
    parser.add_argument("--data_path", default="dataset/")
    parser.add_argument("--betas", default=",".join(f"{b:g}" for b in BETAS))
    parser.add_argument("--reference", default="SASRec", help="baseline run ('' for none)")
    parser.add_argument("--epochs", type=int, default=0, help="0: the protocol's budget")
    parser.add_argument("--seed", type=int, default=2020)
    parser.add_argument("--out", default=str(HERE / "results" / "beta-sweep"))
    parser.add_argument(
        "--checkpoint_dir", default="saved/beta-sweep", help="checkpoints and resume states"
    )
    parser.add_argument("--report", action="store_true", help="only write the table and figure")
    args = parser.parse_args(argv)
    args.betas = [float(b) for b in args.betas.split(",") if b]
    run_grid_then_report(args, run_sweep, report)


if __name__ == "__main__":
    main()
