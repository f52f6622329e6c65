"""What packing a comparison grid onto the machine buys: the same models x datasets x
seeds grid run one after another in one process (one torch thread per run) and packed
(``--parallel``, one thread per run), wall time of each and the ratio, and whether every
metric of every run is the same (packing must not change a number).

    python benchmarks/bench_grid.py --data_path DATA --datasets lastfm,ml-100k \\
        --out benchmarks/results

A dataset not under ``--data_path`` is taken from RecBole's wheel when it ships it
(ml-100k).  Both grids write into a temporary folder; the result is
``<out>/grid-packing-cpu.{md,json}``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def data_folder(data_path: str | None, datasets: list[str], where: Path) -> Path:
    """A folder holding each dataset (a link to ``data_path/<dataset>``, else to the
    copy RecBole's wheel ships)."""
    import recbole

    wheel = Path(recbole.__file__).parent / "dataset_example"
    where.mkdir(parents=True, exist_ok=True)
    for dataset in datasets:
        source = Path(data_path or "") / dataset
        if not (data_path and source.is_dir()):
            source = wheel / dataset
        if not source.is_dir():
            raise SystemExit(f"dataset {dataset!r} is neither under --data_path nor in the wheel")
        (where / dataset).symlink_to(source.resolve())
    return where


def timed_grid(args, data: Path, out: Path, **execution) -> tuple[float, dict]:
    from recbole_freq.jobs.compare import compare

    overrides = {
        "data_path": str(data),
        "checkpoint_dir": str(out / "saved"),
        "epochs": args.epochs,
        "show_progress": False,
    }
    if "parallel" not in execution:
        overrides["torch_threads"] = 1  # what each packed run gets
    start = time.perf_counter()
    compare(
        args.models, args.datasets, seeds=args.seeds, overrides=overrides, out=out,
        log=lambda line: print(line, flush=True), **execution,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    import json

    runs = {}
    for dataset in args.datasets.split(","):
        for path in sorted((out / dataset / "runs").glob("*.json")):
            summary = json.loads(path.read_text())["summary"]
            runs[f"{dataset}/{path.stem}"] = summary["test_result"]
    return seconds, runs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_path", default=None)
    parser.add_argument("--datasets", default="lastfm,ml-100k")
    parser.add_argument("--models", default="SASRec,BSARec")
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--parallel", default="auto")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    from common import write_results

    with tempfile.TemporaryDirectory() as temp:
        data = data_folder(args.data_path, args.datasets.split(","), Path(temp) / "data")
        one_by_one, runs_in_order = timed_grid(args, data, Path(temp) / "in-order")
        packed, runs_packed = timed_grid(
            args, data, Path(temp) / "packed", parallel=args.parallel, threads_per_run=1
        )
    differing = sorted(k for k in runs_in_order if runs_in_order[k] != runs_packed.get(k))
    cores = len(os.sched_getaffinity(0))
    data = {
        "grid": {k: getattr(args, k) for k in ("models", "datasets", "seeds", "epochs")},
        "runs": len(runs_in_order),
        "cores": cores,
        "parallel": args.parallel,
        "seconds_one_after_another": one_by_one,
        "seconds_packed": packed,
        "speed_up": one_by_one / packed,
        "runs_with_different_metrics": differing,
    }
    markdown = (
        f"# Packing a grid onto {cores} CPU cores\n\n"
        f"Grid: {args.models} x {args.datasets} x seeds {args.seeds}, {args.epochs} epochs "
        f"each, protocol recbole, each model's own loss; one torch thread per run.\n\n"
        "| how | wall seconds | ratio |\n|---|---|---|\n"
        f"| one after another, one process | {one_by_one:.1f} | 1.00 |\n"
        f"| packed, --parallel {args.parallel} --threads_per_run 1 | {packed:.1f} | "
        f"{packed / one_by_one:.2f} |\n\n"
        f"Runs whose test metrics differ between the two: {len(differing)} of "
        f"{len(runs_in_order)}{' (' + ', '.join(differing) + ')' if differing else ''}.\n\n"
        f"Command: python benchmarks/bench_grid.py {' '.join(sys.argv[1:])}\n"
    )
    print(markdown)
    write_results(args.out, "grid-packing-cpu", markdown, data)


if __name__ == "__main__":
    main()
