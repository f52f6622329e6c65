"""Rec-Denoiser's sparsity weight beta (or another of its settings, ``--vary``) against
what the masks prune and what accuracy keeps (issue: Rec-Denoiser that denoises).

    python benchmarks/beta_sweep.py --dataset lastfm --data_path /tmp/data
    python benchmarks/beta_sweep.py --dataset lastfm --report
    python benchmarks/beta_sweep.py --dataset lastfm --set mask_learning_rate=0.01 \
        --out benchmarks/results/beta-sweep-mask-lr-0.01
    python benchmarks/beta_sweep.py --dataset lastfm --vary jacobian_gamma \
        --values 0,2e-5,1e-4,1e-3 --set sparsity_beta=0 --out ...

``--set KEY=VALUE`` (repeatable) fixes another setting for every run of the sweep.

Each run is ``RecDenoiser`` with the paper's settings for the dataset (``--paper``:
``properties/paper/RecDenoiser/<dataset>.yaml``, protocol ``sasrec``: eq. 4's BCE through
the denoising objective, ``sparsity_normalization: auto`` = Algorithm 1's once per
mini-batch), only the varied setting changed, trained to early stopping (or ``--epochs``),
tested against 100 unseen negatives.  ``--reference SASRec`` adds RecBole's SASRec with
the same sizes and protocol.  Every run writes its own JSON into ``--out/<dataset>/``,
so the sweep resumes where it stopped (a finished value is skipped; an unfinished run
continues from its resume state).  ``--report`` writes the Markdown table and the
figure (pruned fraction against test NDCG@10) from what is there.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from common import grid_checkpoints, grid_parser, run_grid_then_report, write_report

from recbole_freq.config.configurator import paper_reference_settings
from recbole_freq.utils.files import plain_value, write_atomic

BETAS = [0.0, 1e-4, 1e-3, 1e-2, 1e-1, 1.0]
METRICS = ["hit@10", "ndcg@10", "hit@20", "ndcg@20"]
# The backbone settings each stored run records.
BACKBONE_KEYS = (
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


def run_file(folder: Path, name: str) -> Path:
    return folder / f"{name}.json"


def run_name(key: str, value: float) -> str:
    short = "beta" if key == "sparsity_beta" else key
    return f"RecDenoiser-{short}{value:g}"


def store(target: Path, summary: dict, extra: dict) -> None:
    kept = {key: value for key, value in summary.items() if key != "config"}
    kept.update(extra)
    kept["settings"] = {
        key: summary["config"].get(key)
        for key in BACKBONE_KEYS
        + (
            "estimator",
            "sparsity_beta",
            "sparsity_normalization",
            "mask_learning_rate",
            "mask_init_prob",
            "jacobian_gamma",
            "jacobian_normalization",
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
    from recbole_freq.quick_start.quick_start import run

    common = {"data_path": args.data_path, "show_progress": False, "seed": args.seed}
    denoiser = dict(args.settings)  # --set: every RecDenoiser run, not the reference
    if args.epochs:
        common["epochs"] = args.epochs
    checkpoints = grid_checkpoints(args)
    for value in args.values:
        name = run_name(args.vary, value)
        target = run_file(folder, name)
        if target.exists():
            print(f"done already: {target.name}")
            continue
        overrides = dict(common, **denoiser, checkpoint_dir=str(checkpoints))
        overrides[args.vary] = value
        resume = checkpoints / "partial" / f"{name}.resume.pth"
        resume.parent.mkdir(parents=True, exist_ok=True)
        summary = run(
            "RecDenoiser", args.dataset, cmd_overrides=overrides, paper=True, resume_file=resume
        )
        store(target, summary, {"vary": args.vary, "value": value})
    if args.reference:
        target = run_file(folder, args.reference)
        if target.exists():
            print(f"done already: {target.name}")
            return
        overrides = dict(common, checkpoint_dir=str(checkpoints))
        overrides.update(paper_reference_settings("RecDenoiser", args.dataset))
        resume = checkpoints / "partial" / f"{args.reference}.resume.pth"
        resume.parent.mkdir(parents=True, exist_ok=True)
        summary = run(args.reference, args.dataset, cmd_overrides=overrides, resume_file=resume)
        store(target, summary, {"vary": None, "value": None})


def pruned(run: dict) -> list[float]:
    """Pruned fraction of each layer's learned mask (empty for a model without masks)."""
    masks = run.get("model_report", {}).get("learned_masks", [])
    return [entry["pruned_fraction"] for entry in masks]


def varied(run: dict) -> tuple[str | None, float | None]:
    """The setting a run varied and its value (runs stored before ``--vary``: the beta)."""
    if "value" in run:
        return run["vary"], run["value"]
    return ("sparsity_beta" if run["beta"] is not None else None), run["beta"]


def report(folder: Path, dataset: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    if not runs:
        raise SystemExit(f"no runs in {folder}")
    sweep = sorted((r for r in runs if varied(r)[1] is not None), key=lambda r: varied(r)[1])
    references = [r for r in runs if varied(r)[1] is None]
    example = (sweep or runs)[0]
    key = varied(example)[0] or "sparsity_beta"
    label = "beta" if key == "sparsity_beta" else key
    stem = f"{label}-sweep".replace("_", "-")  # beta-sweep, jacobian-gamma-sweep
    lines = [
        f"dataset {dataset}; protocol {example['protocol']['label']} (test: 100 unseen "
        f"negatives); seed {example['seed']}; device {example['device']}; each run to early "
        f"stopping on valid {example['valid_metric']} (at most "
        f"{example['settings']['epochs']} epochs, stopping_step "
        f"{example['settings']['stopping_step']}); RecDenoiser settings: "
        f"{ {k: v for k, v in example['settings'].items() if k != key} }",
        "",
        f"| model | {label} | pruned per layer | "
        + " | ".join(METRICS)
        + " | best epoch / epochs | s/epoch |",
        "|---|---|---|" + "---|" * len(METRICS) + "---|---|",
    ]
    for r in references + sweep:
        fractions = ", ".join(f"{f:.3f}" for f in pruned(r)) or "-"
        value = varied(r)[1]
        shown = "-" if value is None else f"{value:g}"
        values = " | ".join(f"{r['test_result'][m]:.4f}" for m in METRICS)
        lines.append(
            f"| {r['model']} | {shown} | {fractions} | {values} | "
            f"{r['best_epoch']} / {r['epochs_run']} | {r['train_seconds_per_epoch']:.1f} |"
        )
    text = "\n".join(lines)

    figure, axis = plt.subplots(figsize=(6, 4))
    if key == "sparsity_beta":  # what beta buys: pruning against accuracy
        xs = [100 * sum(pruned(r)) / max(len(pruned(r)), 1) for r in sweep]
        axis.set_xlabel("attention links pruned (%, mean over layers)")
    else:  # another setting: accuracy against its value
        xs = [varied(r)[1] for r in sweep]
        positive = [x for x in xs if x > 0]
        if positive:
            axis.set_xscale("symlog", linthresh=min(positive))
        axis.set_xlabel(key)
    ys = [r["test_result"]["ndcg@10"] for r in sweep]
    axis.plot(xs, ys, marker="o", label="RecDenoiser")
    for x, y, r in zip(xs, ys, sweep):
        axis.annotate(
            f"{label} {varied(r)[1]:g}", (x, y), textcoords="offset points", xytext=(4, 4)
        )
    for r in references:
        axis.axhline(r["test_result"]["ndcg@10"], linestyle="--", color="grey", label=r["model"])
    axis.set_ylabel("test NDCG@10 (100 unseen negatives)")
    axis.set_title(f"Rec-Denoiser's {label} on {dataset}")
    axis.legend()
    figure.tight_layout()
    write_report(folder, f"{stem}-{dataset}", text, figure)
    return text


def main(argv=None):
    parser = grid_parser(__doc__, "beta-sweep")
    parser.add_argument("--vary", default="sparsity_beta", help="the setting swept")
    parser.add_argument(
        "--values", "--betas", default=",".join(f"{b:g}" for b in BETAS), help="its values"
    )
    parser.add_argument("--reference", default="SASRec", help="baseline run ('' for none)")
    parser.add_argument("--epochs", type=int, default=0, help="0: the protocol's budget")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a RecDenoiser setting for every run (repeatable), e.g. mask_learning_rate=0.01",
    )
    args = parser.parse_args(argv)
    args.values = [float(value) for value in args.values.split(",") if value]
    args.settings = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--set {item!r}: write KEY=VALUE, e.g. mask_learning_rate=0.1")
        args.settings[key] = yaml.safe_load(value)
    run_grid_then_report(args, run_sweep, report)


if __name__ == "__main__":
    main()
