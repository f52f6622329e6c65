"""Time per training epoch of each ``train_rows`` choice: same model, data, sizes and
machine, in one run (interleaved rounds, so drift in the machine's speed hits every
choice alike).  The ratio is the result; absolute times depend on the machine.

    OMP_NUM_THREADS=1 python benchmarks/bench_train_rows.py --data_path <folder> \\
        [--dataset lastfm] [--model BSARec] [--rounds 2] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import write_results  # noqa: E402

from recbole_freq.config.configurator import FreqConfig  # noqa: E402
from recbole_freq.protocol import PIECES, ProtocolError, trainer_for  # noqa: E402
from recbole_freq.quick_start.quick_start import load_splits, new_model  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_path", required=True)
    parser.add_argument("--dataset", default="lastfm")
    parser.add_argument("--model", default="BSARec")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--out", default=None, help="write train-rows-<dataset>-<model>-cpu.{md,json}"
    )
    args = parser.parse_args(argv)

    choices = PIECES["train_rows"]
    runs = {}
    for choice in choices:
        config = FreqConfig(
            args.model,
            args.dataset,
            cmd_overrides={
                "data_path": args.data_path,
                "train_rows": choice,
                "seed": args.seed,
                "state": "WARNING",
                "show_progress": False,
            },
        )
        _, (train, _, _) = load_splits(config)
        trainer = trainer_for(config, new_model(config, train))
        runs[choice] = {"trainer": trainer, "train": train, "rows": len(train._dataset), "s": []}
    refused = {}
    for round_index in range(args.rounds):
        for choice in choices:
            if choice in refused:
                continue
            run = runs[choice]
            start = time.perf_counter()
            try:
                run["trainer"]._train_epoch(run["train"], round_index, show_progress=False)
            except ProtocolError as error:  # e.g. a non-causal model on all positions
                refused[choice] = str(error)
                print(f"{choice}: refused: {error}", flush=True)
                continue
            run["s"].append(time.perf_counter() - start)
            print(f"round {round_index} {choice}: {run['s'][-1]:.1f} s", flush=True)
    choices = [choice for choice in choices if choice not in refused]

    reference = min(runs[choices[0]]["s"])
    lines = [
        f"| train_rows | rows per epoch | s per epoch (best of {args.rounds}) | ratio to "
        f"{choices[0]} |",
        "|---|---:|---:|---:|",
    ]
    data = {
        "model": args.model,
        "dataset": args.dataset,
        "rounds": args.rounds,
        "choices": {},
        "refused": refused,
    }
    for choice in choices:
        best = min(runs[choice]["s"])
        lines.append(
            f"| {choice} | {runs[choice]['rows']:,} | {best:.1f} | {best / reference:.2f} |"
        )
        data["choices"][choice] = {"rows": runs[choice]["rows"], "seconds": runs[choice]["s"]}
    lines += [
        "",
        f"{args.model} with its default settings (batch 256, n 50) on {args.dataset}, one "
        f"training epoch per choice per round, {args.rounds} interleaved rounds, seed "
        f"{args.seed}; command: OMP_NUM_THREADS=1 python benchmarks/bench_train_rows.py "
        f"--data_path <folder> --dataset {args.dataset} --model {args.model}",
    ]
    lines += [f"{choice}: not run ({reason})" for choice, reason in refused.items()]
    markdown = "\n".join(lines)
    print(markdown)
    if args.out:
        write_results(
            args.out, f"train-rows-{args.dataset}-{args.model.lower()}-cpu", markdown, data
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
