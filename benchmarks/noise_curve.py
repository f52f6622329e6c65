"""Robustness to noisy training sequences (Rec-Denoiser section 5.3, Fig. 2).

    python benchmarks/noise_curve.py --dataset lastfm --epochs 4
    python benchmarks/noise_curve.py --dataset lastfm --report
    python benchmarks/noise_curve.py --dataset lastfm --paper --seeds 2020,2021,2022 \
        --out benchmarks/results/noise-curve-paper

Trains each model at each noise ratio (``noise_ratio``: that fraction of the training
interactions replaced by uniform random items outside the user's validation and test
part; validation and test stay clean) and tests it under full-sort ranking and, on the
same checkpoint, under 100 sampled negatives (``extra_test_modes``).

``--paper`` is the paper's experiment instead: its protocol and settings
(``properties/paper/RecDenoiser/<dataset>.yaml``: ``--protocol=sasrec``, test against 100
unseen negatives), the reference model with the same sizes, the corrupted histories also
feeding validation and test (``noise_scope: observed``; the targets stay clean), each run
to early stopping unless ``--epochs``; ``--seeds`` repeats it (the paper: five times) and
the table averages them.

Every run writes its own JSON into ``--out/<dataset>/``, so the grid resumes where it
stopped (an unfinished ``--paper`` run from its resume state) and several processes can
share it (``--ratios`` picks a part).  ``--report`` writes the Markdown table and the
figure from what is there.
"""

from __future__ import annotations

import json
from pathlib import Path

from common import grid_checkpoints, grid_parser, run_grid_then_report, write_report

from recbole_freq.config.configurator import paper_reference_settings
from recbole_freq.utils.files import plain_value, write_atomic

RATIOS = [0.0, 0.05, 0.10, 0.15, 0.20, 0.25]
MODELS = ["SASRec", "RecDenoiser"]
METRICS = ["hit@10", "ndcg@10", "hit@20", "ndcg@20"]


def run_name(model: str, ratio: float, seed: int | None) -> str:
    # One seed (--seed) keeps the names of the first grids; --seeds adds the seed.
    suffix = "" if seed is None else f"-seed{seed}"
    return f"{model}-noise{round(ratio * 100):02d}{suffix}"


def run_grid(args, folder: Path):
    from recbole_freq.quick_start.quick_start import run

    seeds = args.seeds or [None]
    checkpoints = grid_checkpoints(args)
    for seed in seeds:
        for ratio in args.ratios:
            for model in args.models:
                run_one(args, folder, checkpoints, model, ratio, seed, run)


def run_one(args, folder, checkpoints, model, ratio, seed, run) -> None:
    name = run_name(model, ratio, seed)
    target = folder / f"{name}.json"
    if target.exists():
        print(f"done already: {target.name}")
        return
    settings = {
        "noise_ratio": ratio,
        "data_path": args.data_path,
        "show_progress": False,
        "seed": args.seed if seed is None else seed,
    }
    if args.epochs:
        settings["epochs"] = args.epochs
    if not args.paper:
        settings["extra_test_modes"] = ["uni100"]
        summary = run(model, args.dataset, config_dict=settings)
    else:
        settings.update(noise_scope="observed", checkpoint_dir=str(checkpoints))
        if model != "RecDenoiser":
            settings.update(paper_reference_settings("RecDenoiser", args.dataset))
        resume = checkpoints / "partial" / f"{name}.resume.pth"
        resume.parent.mkdir(parents=True, exist_ok=True)
        summary = run(
            model,
            args.dataset,
            cmd_overrides=settings,
            paper=model == "RecDenoiser",
            resume_file=resume,
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
            "mask_learning_rate",
            "jacobian_gamma",
            "jacobian_normalization",
            "noise_scope",
            "epochs",
            "stopping_step",
        )
    }
    write_atomic(target, json.dumps(plain_value(kept), indent=2))
    print(f"wrote {target}")


def metric_value(run: dict, source: str, metric: str) -> float:
    """Test ``metric`` of a run: ``test`` its own protocol's test, else an extra test."""
    if source == "test":
        return run["test_result"][metric]
    return run["extra_test_results"][source][metric]


def test_sources(run: dict) -> list[tuple[str, str]]:
    """``(source, column label)`` of the tests a run holds."""
    if "uni100" in run.get("extra_test_results", {}):
        return [("test", "full-sort"), ("uni100", "uni100")]
    return [("test", f"{protocol_label(run)} test")]


def protocol_label(run: dict) -> str:
    return run.get("protocol", {}).get("label", "recbole")  # runs before protocols: RecBole


def pruned(runs: list[dict]) -> str:
    """Rec-Denoiser's pruned fraction per layer, mean over the runs ("-" without masks)."""
    layers = [
        [entry["pruned_fraction"] for entry in r.get("model_report", {}).get("learned_masks", [])]
        for r in runs
    ]
    if not any(layers):
        return "-"
    return ", ".join(f"{sum(values) / len(values):.3f}" for values in zip(*layers))


def mean_value(runs: list[dict], source: str, metric: str) -> float:
    return sum(metric_value(r, source, metric) for r in runs) / len(runs)


def per_seed(runs: list[dict], source: tuple[str, str], metric: str) -> list[str]:
    """Each seed's SASRec and RecDenoiser ``metric`` per noise ratio (same seed, same
    corruption), and a paired test of RecDenoiser against SASRec over those pairs: with
    few seeds per ratio the means above hide how often each model is ahead."""
    from scipy import stats

    key, label = source
    value = {(r["model"], r["noise_ratio"], r["seed"]): metric_value(r, key, metric) for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    pairs = sorted(
        (ratio, seed)
        for model, ratio, seed in value
        if model == "SASRec" and ("RecDenoiser", ratio, seed) in value
    )
    if len(seeds) < 2 or not pairs:
        return []
    lines = [
        "",
        f"Per seed, {label} {metric}: SASRec / RecDenoiser (change; RecDenoiser's pruned "
        "fraction per layer):",
        "",
        "| noise | " + " | ".join(f"seed {seed}" for seed in seeds) + " | RecDenoiser ahead |",
        "|---|" + "---|" * (len(seeds) + 1),
    ]
    masks = {
        (r["noise_ratio"], r["seed"]): pruned([r]) for r in runs if r["model"] == "RecDenoiser"
    }
    for ratio in sorted({ratio for ratio, _ in pairs}):
        cells, ahead, count = [], 0, 0
        for seed in seeds:
            if (ratio, seed) not in pairs:
                cells.append("-")
                continue
            base, ours = value[("SASRec", ratio, seed)], value[("RecDenoiser", ratio, seed)]
            count += 1
            ahead += ours > base
            change = (ours / base - 1) * 100
            cells.append(f"{base:.4f} / {ours:.4f} ({change:+.1f}%; {masks[(ratio, seed)]})")
        lines.append(f"| {ratio:.0%} | " + " | ".join(cells) + f" | {ahead} of {count} |")
    if len(pairs) >= 2:
        base = [value[("SASRec", ratio, seed)] for ratio, seed in pairs]
        ours = [value[("RecDenoiser", ratio, seed)] for ratio, seed in pairs]
        t_test = stats.ttest_rel(ours, base)
        wilcoxon = stats.wilcoxon(ours, base)
        change = sum(o / b - 1 for o, b in zip(ours, base)) / len(pairs) * 100
        lines += [
            "",
            f"Over all {len(pairs)} (noise, seed) pairs: RecDenoiser ahead in "
            f"{sum(o > b for o, b in zip(ours, base))}, mean change {change:+.1f}%; "
            f"paired t p = {t_test.pvalue:.3g}, paired Wilcoxon p = {wilcoxon.pvalue:.3g} "
            "(two-sided).",
        ]
    return lines


def report(folder: Path, dataset: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    if not runs:
        raise SystemExit(f"no runs in {folder}")
    models = sorted({r["model"] for r in runs}, key=lambda m: (m != "SASRec", m))
    by_key: dict[tuple, list[dict]] = {}
    for r in runs:
        by_key.setdefault((r["model"], r["noise_ratio"]), []).append(r)
    ratios = sorted({r["noise_ratio"] for r in runs})
    example = runs[0]
    sources = test_sources(example)
    seeds = sorted({r["seed"] for r in runs})
    stopping = example["settings"].get("stopping_step")
    if len({r["epochs_run"] for r in runs}) == 1 and stopping is None:
        budget = f"{example['epochs_run']} training epochs per run"
    else:
        budget = (
            f"each run to early stopping (at most {example['settings'].get('epochs')} "
            f"epochs, stopping_step {stopping})"
        )
    lines = [
        f"dataset {dataset}; protocol {protocol_label(example)}; {budget}, best epoch "
        f"by valid {example['valid_metric']}; seeds {seeds} (cells: mean over the seeds "
        f"run; n = runs per cell); device {example['device']}; settings of the first run: "
        f"{example['settings']}",
        "",
        "| noise | model | n | "
        + " | ".join(f"{label} {m}" for _, label in sources for m in METRICS)
        + " | pruned per layer | s/epoch |",
        "|---|---|---|" + "---|" * (len(sources) * len(METRICS) + 2),
    ]
    for ratio in ratios:
        for model in models:
            cell = by_key.get((model, ratio))
            if not cell:
                continue
            values = " | ".join(
                f"{mean_value(cell, source, m):.4f}" for source, _ in sources for m in METRICS
            )
            seconds = sum(r["train_seconds_per_epoch"] for r in cell) / len(cell)
            lines.append(
                f"| {ratio:.0%} | {model} | {len(cell)} | {values} | {pruned(cell)} | "
                f"{seconds:.1f} |"
            )
    relative = ["", "Relative change of RecDenoiser over SASRec (test means, same noise):", ""]
    relative.append(
        "| noise | " + " | ".join(f"{label} {m}" for _, label in sources for m in METRICS) + " |"
    )
    relative.append("|---|" + "---|" * (len(sources) * len(METRICS)))
    for ratio in ratios:
        base, ours = by_key.get(("SASRec", ratio)), by_key.get(("RecDenoiser", ratio))
        if not (base and ours):
            continue
        cells = []
        for source, _ in sources:
            for m in METRICS:
                value, reference = mean_value(ours, source, m), mean_value(base, source, m)
                cells.append(f"{(value / reference - 1) * 100:+.1f}%" if reference else "-")
        relative.append(f"| {ratio:.0%} | " + " | ".join(cells) + " |")
    text = "\n".join(lines + relative + per_seed(runs, sources[0], "ndcg@10"))

    panels = [(sources[0], "ndcg@10"), (sources[-1], "hit@10")]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for axis, ((source, label), metric) in zip(axes, panels):
        for model in models:
            points = [(q, by_key[(model, q)]) for q in ratios if (model, q) in by_key]
            values = [mean_value(cell, source, metric) for _, cell in points]
            axis.plot([q * 100 for q, _ in points], values, marker="o", label=model)
        axis.set_xlabel("training interactions replaced (%)")
        axis.set_title(f"{label} {metric}")
        axis.legend()
    figure.suptitle(f"Noise robustness on {dataset}")
    figure.tight_layout()
    write_report(folder, f"noise-curve-{dataset}", text, figure)
    return text


def main(argv=None):
    parser = grid_parser(__doc__, "noise-curve")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--ratios", default=",".join(str(r) for r in RATIOS))
    parser.add_argument(
        "--epochs", type=int, default=None, help="4; --paper: 0 = to early stopping"
    )
    parser.add_argument("--seeds", default="", help="several seeds, e.g. 2020,2021,2022")
    parser.add_argument("--paper", action="store_true", help="the paper's protocol and settings")
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.ratios = [float(r) for r in args.ratios.split(",") if r]
    args.seeds = [int(seed) for seed in args.seeds.split(",") if seed]
    if args.epochs is None:
        args.epochs = 0 if args.paper else 4
    run_grid_then_report(args, run_grid, report)


if __name__ == "__main__":
    main()
