"""What bit-identical runs cost: seconds per training epoch of one model under torch's
default threads, pinned to one thread, and ``deterministic: True`` (one thread, torch's
deterministic algorithms, MKL's reproducible kernels), each run in a fresh process,
interleaved round by round so that machine noise hits all alike; ratios are to the
default of the same round.

    python benchmarks/bench_determinism.py --data_path DATA            # lastfm, SASRec
    python benchmarks/bench_determinism.py --model BSARec --rounds 3 --out benchmarks/results

Each process trains ``--epochs`` epochs under the ``bsarec`` protocol and reports the
median of its epochs' training seconds (the first epoch included) and its losses, so that
the table also shows which settings gave the same numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SETTINGS = {
    "torch's default threads": {},
    "torch_threads=1": {"torch_threads": 1},
    "deterministic=True": {"deterministic": True},
}
REFERENCE = "torch's default threads"
CHILD = """
import json, statistics, sys
from recbole_freq.quick_start import run
model, dataset, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
summary = run(model, dataset, config_dict=config, saved=False)
seconds = [epoch["train_seconds"] for epoch in summary["history"]]
print(json.dumps({"seconds": statistics.median(seconds),
                  "losses": [epoch["train_loss"] for epoch in summary["history"]],
                  "environment": summary["environment"]}))
"""


def one_run(model, dataset, data_path, epochs, settings) -> dict:
    config = dict(
        data_path=str(data_path),
        protocol="bsarec",
        epochs=epochs,
        show_progress=False,
        state="WARNING",
        **settings,
    )
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, model, dataset, json.dumps(config)],
            capture_output=True,
            text=True,
            cwd=folder,
            env={key: value for key, value in os.environ.items() if key != "MKL_CBWR"},
            check=True,
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    from common import write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="SASRec")
    parser.add_argument("--dataset", default=None, help="default: lastfm if prepared")
    parser.add_argument("--data_path", default="dataset")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    dataset = args.dataset or (
        "lastfm" if Path(args.data_path, "lastfm", "lastfm.inter").is_file() else None
    )
    if dataset is None:
        import recbole

        args.data_path = str(Path(recbole.__file__).parent / "dataset_example")
        dataset = "ml-100k"
    results = {name: [] for name in SETTINGS}
    for _ in range(args.rounds):
        for name, settings in SETTINGS.items():
            results[name].append(
                one_run(args.model, dataset, args.data_path, args.epochs, settings)
            )
    environment = results[REFERENCE][0]["environment"]
    rows = [
        "| setting | torch threads | median s / epoch | / default | same losses in every round |",
        "|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        ratio = statistics.median(
            run["seconds"] / ref["seconds"] for run, ref in zip(runs, results[REFERENCE])
        )
        same = all(run["losses"] == runs[0]["losses"] for run in runs)
        rows.append(
            f"| {name} | {runs[0]['environment']['torch_threads']} | "
            f"{statistics.median(run['seconds'] for run in runs):.2f} | {ratio:.2f}x | "
            f"{'yes' if same else 'no'} |"
        )
    losses = {name: runs[0]["losses"] for name, runs in results.items()}
    header = (
        f"{args.model} on {dataset}, protocol bsarec, {args.epochs} epochs per process, "
        f"{args.rounds} interleaved rounds; {environment['device_name']}, "
        f"{environment['cpu_count']} cores, torch {environment['torch']} "
        f"({environment['cpu_capability']}). Command: `python benchmarks/bench_determinism.py "
        f"--model {args.model} --rounds {args.rounds} --epochs {args.epochs}`."
    )
    loss_lines = [f"- {name}: training losses {values}" for name, values in losses.items()]
    markdown = "\n".join([header, "", *rows, "", *loss_lines])
    print(markdown)
    stem = f"determinism-cost-{dataset}-{environment['device']}"
    write_results(args.out, stem, markdown, {"results": results, "args": vars(args)})


if __name__ == "__main__":
    main()
