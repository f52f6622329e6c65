"""Seconds per epoch of one run alone, training and validation apart, with the plain step,
the overlapped loader (``overlap_loader``) and the overlapped loader with the compiled
step (``compile_step``: CUDA graphs on CUDA, inductor's kernels on the CPU); on request
(``--modes "RecBole's loop,plain"``) the plain step in RecBole's own training loop, which
reads each step's loss from the device, against the plugin's (``fast_step.train_pass``).

    python benchmarks/bench_epoch.py --dataset lastfm --data_path /work/data \\
        --models SASRec,BSARec --epochs 3 --out benchmarks/results/epoch-time

Each (model, mode) is one real run (``quick_start.run``: the dataset's loaders, RecBole's
trainer, full-sort validation every epoch) under ``--paper`` unless ``--no-paper``, for
``--epochs`` epochs.  The first epoch is reported apart: it holds the compilation and the
loader's first pass.  The table gives the mean of the later epochs; ratios are to the
plain step of the same model in the same invocation (modes alternate within each round,
so a slow drift of a shared machine cancels).  Each run's metrics are kept in the JSON so
the modes can be compared: the overlapped loader must give the plain run's numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

MODES = {
    # RecBole's own training loop (a read of the loss and a NaN test each step), against
    # which "plain" (fast_step.train_pass: neither) is measured.
    "RecBole's loop": {"overlap_loader": False, "compile_step": False, "loop": "recbole"},
    "plain": {"overlap_loader": False, "compile_step": False},
    "overlapped loader": {"overlap_loader": True, "compile_step": False},
    "overlapped + compiled": {"overlap_loader": True, "compile_step": True},
}


def one_run(model: str, mode: str, args) -> dict:
    from recbole_freq.quick_start import run

    settings = dict(
        {key: value for key, value in MODES[mode].items() if key != "loop"},
        data_path=args.data_path,
        epochs=args.epochs,
        show_progress=False,
        state="WARNING",
        stopping_step=args.epochs + 1,
        seed=args.seed,
    )
    if args.device:
        settings["device"] = args.device
    if args.threads:
        settings["torch_threads"] = args.threads
    started = time.perf_counter()
    paper = args.paper
    with recboles_loop(MODES[mode].get("loop") == "recbole"):
        try:
            summary = run(model, args.dataset, config_dict=settings, paper=paper, saved=False)
        except ValueError as error:
            if not (paper and str(error).startswith("no paper settings")):
                raise
            paper = False  # the model's own defaults, labelled in the table
            summary = run(model, args.dataset, config_dict=settings, paper=paper, saved=False)
    history = summary["history"]
    return {
        "model": model,
        "mode": mode,
        "paper": paper,
        "wall_seconds": time.perf_counter() - started,
        "train_seconds": [epoch["train_seconds"] for epoch in history],
        "valid_seconds": [epoch.get("valid_seconds") for epoch in history],
        "train_loss": [epoch["train_loss"] for epoch in history],
        "valid_score": [epoch.get("valid_score") for epoch in history],
        "test_result": summary["test_result"],
        "protocol": summary.get("protocol"),
        "training_loss": summary.get("training_loss"),
        "device": summary["device"],
        "environment": summary.get("environment"),
    }


@contextlib.contextmanager
def recboles_loop(wanted: bool):
    """RecBole's ``Trainer._train_epoch`` in place of ``fast_step.train_pass`` while the
    block runs (a run in this process)."""
    from recbole.trainer import Trainer

    from recbole_freq.protocol import trainer as trainer_module

    ours = trainer_module.train_pass
    if wanted:
        trainer_module.train_pass = lambda trainer, *args: Trainer._train_epoch(trainer, *args)
    try:
        yield
    finally:
        trainer_module.train_pass = ours


def later_mean(values: list) -> float | None:
    later = [v for v in values[1:] if v is not None]
    return statistics.fmean(later) if later else None


def report(results: list, args, device: str) -> str:
    lines = [
        f"# Seconds per epoch, one run alone: {args.dataset}, {device}",
        "",
        f"Command: `python benchmarks/bench_epoch.py {' '.join(sys.argv[1:])}`",
        "",
        f"{'--paper' if args.paper else 'the plugin defaults'}, {args.epochs} epochs, seed "
        f"{args.seed}, {args.rounds} round(s); mean of epochs 2..{args.epochs} (the first "
        "epoch, with compilation, apart); ratios to the plain step of the same model.",
        "",
        "| model | mode | train s / epoch | valid s / epoch | train vs plain | valid vs plain "
        "| first epoch train + valid s | test NDCG@10 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model in args.models:
        rows = {
            mode: [r for r in results if r["model"] == model and r["mode"] == mode]
            for mode in args.modes
        }
        base = rows.get("plain")
        base_train = (
            statistics.fmean(later_mean(r["train_seconds"]) for r in base) if base else None
        )
        base_valid = (
            statistics.fmean(later_mean(r["valid_seconds"]) for r in base) if base else None
        )
        for mode, runs in rows.items():
            if not runs:
                continue
            train = statistics.fmean(later_mean(r["train_seconds"]) for r in runs)
            valid = statistics.fmean(later_mean(r["valid_seconds"]) for r in runs)
            first = statistics.fmean(
                r["train_seconds"][0] + (r["valid_seconds"][0] or 0) for r in runs
            )
            ndcg = runs[-1]["test_result"].get("ndcg@10")
            if args.paper and not runs[-1].get("paper", True):
                model_cell = f"{model} (no paper settings here: its defaults)"
            else:
                model_cell = model
            train_ratio = f"{train / base_train:.2f}x" if base_train else "-"
            valid_ratio = f"{valid / base_valid:.2f}x" if base_valid else "-"
            lines.append(
                f"| {model_cell} | {mode} | {train:.2f} | {valid:.2f} | {train_ratio} | "
                f"{valid_ratio} | {first:.1f} | {ndcg if ndcg is None else f'{ndcg:.4f}'} |"
            )
    return "\n".join(lines)


def stem(args, results) -> str:
    device = results[0]["device"] if results else "cpu"
    return args.name or f"epoch-{args.dataset}-{device.split(':')[0]}"


def main(argv=None) -> int:
    import recbole_freq  # noqa: F401  (its thread policy must precede torch)

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="ml-100k")
    parser.add_argument(
        "--data_path",
        default=None,
        help="folder of prepared datasets (default: RecBole's bundled ml-100k)",
    )
    parser.add_argument("--models", default="SASRec,BSARec")
    parser.add_argument("--modes", default=",".join(m for m in MODES if m != "RecBole's loop"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=2020)
    parser.add_argument("--device", default=None, help="e.g. cuda or cpu (default: RecBole's)")
    parser.add_argument("--threads", type=int, default=None, help="torch_threads of each run")
    parser.add_argument("--no-paper", dest="paper", action="store_false")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument(
        "--name", default=None, help="file stem (default: epoch-<dataset>-<device>)"
    )
    parser.add_argument(
        "--merge",
        default=None,
        help="a JSON this bench wrote: its runs join this table (an interrupted bench goes on)",
    )
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in args.modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}: choose from {', '.join(MODES)}")
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the first epoch is reported apart")
    if args.data_path is None:
        import recbole

        args.data_path = str(Path(recbole.__file__).parent / "dataset_example")

    from common import write_results

    results = []
    if args.merge:
        import json

        results = json.loads(Path(args.merge).read_text())["results"]
        if results:
            args.models = list(dict.fromkeys([r["model"] for r in results] + args.models))
    done = {(r["model"], r["mode"], r.get("round", 0)) for r in results}
    for round_index in range(args.rounds):
        for model in args.models:
            order = args.modes if round_index % 2 == 0 else list(reversed(args.modes))
            for mode in order:
                if (model, mode, round_index) in done:
                    continue
                result = one_run(model, mode, args)
                result["round"] = round_index
                results.append(result)
                # Each run kept at once: an interrupted bench goes on with --merge.
                write_results(args.out, stem(args, results), report(results, args, "?"),
                              {"argv": sys.argv[1:], "results": results})  # fmt: skip
                print(
                    f"{model:12s} {mode:22s} train {result['train_seconds']} "
                    f"valid {result['valid_seconds']}",
                    flush=True,
                )
    device = results[0]["device"] if results else "?"
    markdown = report(results, args, device)
    write_results(
        args.out, stem(args, results), markdown, {"argv": sys.argv[1:], "results": results}
    )
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
