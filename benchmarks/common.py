"""What the benchmarks share: the real pipeline's models on one split, and result files
written atomically (a killed benchmark never leaves a half-written table)."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def load_models(configs: dict, seed: int, reference: str):
    """``configs``: label -> FreqConfig, all on one dataset.  The split is built once from
    ``configs[reference]``; every model is built on it with the same seed.  Returns
    ``(reference config, (train, valid, test), {label: model})``."""
    from recbole_freq.quick_start.quick_start import load_splits, new_model

    first = configs[reference]
    first["seed"] = seed
    # The shared data holds every column any of the models reads (TiSASRec's real_time).
    columns = [c["load_col"]["inter"] for c in configs.values() if isinstance(c["load_col"], dict)]
    if isinstance(first["load_col"], dict) and columns:
        first["load_col"] = dict(first["load_col"], inter=list(dict.fromkeys(sum(columns, []))))
    _, splits = load_splits(first)
    models = {}
    for label, config in configs.items():
        config["seed"] = seed
        models[label] = new_model(config, splits[0])
    # Loading a RecBole built-in imports recbole.model.sequential_recommender, whose
    # sine.py switches autograd anomaly detection on for the whole process; it checks
    # every backward output for NaN and would blur the timing ratios.
    torch.autograd.set_detect_anomaly(False)
    return first, splits, models


def with_optimizers(models: dict) -> dict:
    """label -> (model, Adam at lr 1e-3), the step the speed benchmarks time."""
    return {
        label: (model, torch.optim.Adam(model.parameters(), lr=1e-3))
        for label, model in models.items()
    }


def write_results(out, stem: str, markdown: str, data: dict) -> None:
    """``<out>/<stem>.md`` and ``<out>/<stem>.json``, each whole or not at all."""
    from recbole_freq.utils.files import write_atomic

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"{stem}.md", markdown.rstrip("\n") + "\n")
    write_atomic(out / f"{stem}.json", json.dumps(data, indent=2) + "\n")


def run_grid_then_report(args, run, report) -> None:
    """The resumable grids (noise curve, beta sweep): runs go into ``<out>/<dataset>/``,
    one JSON each; ``run(args, folder)`` adds the missing ones unless ``--report``, then
    ``report(folder, dataset)`` prints (and writes) the table from what is there."""
    folder = Path(args.out) / args.dataset
    folder.mkdir(parents=True, exist_ok=True)
    if not args.report:
        import recbole_freq  # noqa: F401  (compatibility fixes)

        run(args, folder)
    print(report(folder, args.dataset))


def grid_parser(description: str, name: str):
    """The arguments every resumable grid shares; ``name``: its results folder under
    ``benchmarks/results/`` and checkpoint folder under ``saved/``."""
    import argparse

    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="lastfm")
    parser.add_argument("--data_path", default="dataset/")
    parser.add_argument("--seed", type=int, default=2020)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / name))
    parser.add_argument(
        "--checkpoint_dir", default=f"saved/{name}", help="checkpoints and resume states"
    )
    parser.add_argument("--report", action="store_true", help="only write the table and figure")
    return parser


def grid_checkpoints(args) -> Path:
    """Checkpoint folder of a grid's runs: one per results folder, so that two grids never
    resume each other's runs."""
    return Path(args.checkpoint_dir) / Path(args.out).name / args.dataset


def write_report(folder: Path, stem: str, text: str, figure) -> None:
    """A grid's table and figure beside its run folder, each whole or not at all."""
    from recbole_freq.utils.files import write_atomic

    write_atomic(
        folder.parent / f"{stem}.png", lambda handle: figure.savefig(handle, format="png", dpi=100)
    )
    write_atomic(folder.parent / f"{stem}.md", text + "\n")
