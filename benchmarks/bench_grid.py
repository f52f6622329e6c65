"""What packing a comparison grid onto the machine buys: the same models x datasets x
seeds grid run one after another in one process (one torch thread per run) and packed
(``--parallel``, one thread per run), wall time of each and the ratio, and whether every
metric of every run is the same (packing must not change a number).

    python benchmarks/bench_grid.py --data_path DATA --datasets lastfm,ml-100k \\
        --out benchmarks/results

A dataset not under ``--data_path`` is taken from RecBole's wheel when it ships it
(ml-100k).  Every grid writes into a temporary folder; the result is
``<out>/grid-packing-<device>.{md,json}``.  On a GPU (``--device cuda --packings
1,4,auto``) the table gives the runs per hour one GPU delivers with 1, 4 and as many runs
as the cores hold sharing it.
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
    from recbole_freq.jobs.compare import Execution, compare

    overrides = {
        "data_path": str(data),
        "checkpoint_dir": str(out / "saved"),
        "epochs": args.epochs,
        "show_progress": False,
    }
    if args.device:
        overrides["device"] = args.device
    if "parallel" not in execution:
        overrides["torch_threads"] = 1  # what each packed run gets
    start = time.perf_counter()
    compare(
        args.models, args.datasets, seeds=args.seeds, overrides=overrides, out=out,
        log=lambda line: print(line, flush=True), execution=Execution(**execution),
    )  # fmt: skip
    seconds = time.perf_counter() - start
    import json

    runs = {}
    datasets = args.datasets.split(",")
    for dataset in datasets:
        folder = out / dataset if len(datasets) > 1 else out  # one dataset: no grid folder
        for path in sorted((folder / "runs").glob("*.json")):
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
    parser.add_argument(
        "--packings",
        default="auto",
        help="runs at once to time against one after another, comma-separated (auto: as "
        "many as the cores hold), e.g. 1,4,auto on a GPU",
    )
    parser.add_argument("--device", default=None, help="e.g. cuda: the packed runs share it")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    from common import write_results

    packings = [item.strip() for item in args.packings.split(",") if item.strip()]
    timings = {}
    with tempfile.TemporaryDirectory() as temp:
        data = data_folder(args.data_path, args.datasets.split(","), Path(temp) / "data")
        timings["one after another, one process"] = timed_grid(args, data, Path(temp) / "seq")
        for runs in packings:
            timings[f"packed, --parallel {runs} --threads_per_run 1"] = timed_grid(
                args, data, Path(temp) / f"packed-{runs}", parallel=runs, threads_per_run=1
            )
    write_results(args.out, f"grid-packing-{args.device or 'cpu'}", *report(args, timings))


def report(args, timings: dict) -> tuple[str, dict]:
    """Markdown and JSON of the timings: wall seconds, ratio to one after another, runs
    per hour, and the runs whose metrics differ from one after another."""
    reference, runs_first = next(iter(timings.values()))
    cores = len(os.sched_getaffinity(0))
    lines = ["| how | wall seconds | ratio | runs per hour | runs with other metrics |"]
    lines.append("|---|---|---|---|---|")
    data = {"grid": {k: getattr(args, k) for k in ("models", "datasets", "seeds", "epochs")}}
    data.update(device=args.device or "cpu", cores=cores, timings={})
    for how, (seconds, runs) in timings.items():
        differing = sorted(k for k in runs_first if runs_first[k] != runs.get(k))
        per_hour = len(runs) * 3600 / seconds
        lines.append(
            f"| {how} | {seconds:.1f} | {seconds / reference:.2f} | {per_hour:.1f} | "
            f"{len(differing)} of {len(runs)}{' (' + ', '.join(differing) + ')' if differing else ''} |"
        )
        data["timings"][how] = {"seconds": seconds, "runs_per_hour": per_hour, "differ": differing}
    markdown = (
        f"# Packing a grid onto {args.device or f'{cores} CPU cores'}\n\n"
        f"Grid: {args.models} x {args.datasets} x seeds {args.seeds}, {args.epochs} epochs "
        "each, protocol recbole, each model's own loss; one torch thread per run.\n\n"
        + "\n".join(lines)
        + f"\n\nCommand: python benchmarks/bench_grid.py {' '.join(sys.argv[1:])}\n"
    )
    print(markdown)
    return markdown, data


if __name__ == "__main__":
    main()
