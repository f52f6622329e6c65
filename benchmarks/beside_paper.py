"""Our runs beside a paper's table: one markdown table from ``--compare`` run files.

    python benchmarks/beside_paper.py RUNS_DIR [RUNS_DIR ...] --paper paper.json \
        [--metrics hit@5,hit@10,hit@20,ndcg@5,ndcg@10,ndcg@20] > table.md

``RUNS_DIR``: the ``runs/`` folders that ``--compare --out DIR`` writes (several, when the
models of one table were run by separate commands; every run must name the same protocol
and dataset).  ``paper.json``: ``{"source": "...", "rows": {"Model": [values in metric
order], ...}}``, optionally with ``"authors_here": {"source": "...", "rows": {...}}``: the
authors' own code run on the machine our numbers come from (``null`` where a value was not
measured).  Each model gets its row, the paper's row under it and the difference, then
the authors' code's row and our difference from it; the last columns say how each run
ended (epochs, best epoch, seconds per training epoch), so that a reader sees which runs
the budget cut short.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_METRICS = "hit@5,hit@10,hit@20,ndcg@5,ndcg@10,ndcg@20"


def load_runs(folders: list[Path]) -> list[dict]:
    runs = []
    for folder in folders:
        for path in sorted(folder.glob("*.json")):
            record = json.loads(path.read_text())
            if record.get("finished"):
                runs.append(record["summary"])
    if not runs:
        raise SystemExit(f"no finished runs in {', '.join(map(str, folders))}")
    # One protocol; a model may change one of its pieces as its authors' code does
    # (e.g. FMLP-Rec's BCE training under the BSARec protocol): its row shows the label.
    protocols = {run["protocol"]["protocol"] for run in runs}
    datasets = {run["dataset"] for run in runs}
    if len(protocols) > 1 or len(datasets) > 1:
        raise SystemExit(f"runs of several protocols {protocols} or datasets {datasets}")
    return runs


def table(runs: list[dict], paper: dict, metrics: list[str]) -> str:
    head = ["model", *metrics, "epochs (best)", "s/epoch"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        ours = [run["test_result"][m] for m in metrics]
        stop = "early stop" if run["stopped_early"] else "budget"
        label = run["protocol"]["label"]
        shown = "" if label == run["protocol"]["protocol"] else f", {label}"
        seed = f", seed {run['seed']}" if run.get("seed") is not None else ""
        lines.append(
            f"| {run['model']} (ours{seed}{shown}) | "
            + " | ".join(f"{v:.4f}" for v in ours)
            + f" | {run['epochs_run']} ({run['best_epoch']}), {stop} | "
            f"{run['train_seconds_per_epoch']:.0f} |"
        )
        here = paper.get("authors_here", {}).get("rows", {})
        sources = (("paper", "the paper", paper["rows"]),
                   ("authors' code here", "the authors' code", here))  # fmt: skip
        for source, named, rows in sources:
            reported = rows.get(run["model"])
            if reported is None:
                continue
            lines.append(
                f"| {run['model']} ({source}) | "
                + " | ".join(_value(v) for v in reported)
                + " | | |"
            )
            lines.append(
                f"| difference from {named} | "
                + " | ".join(_difference(o, r) for o, r in zip(ours, reported))
                + " | | |"
            )
    return "\n".join(lines)


def _value(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _difference(ours: float, reported) -> str:
    return "" if reported is None else f"{(ours - reported) / reported:+.1%}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="runs/ folders of --compare")
    parser.add_argument("--paper", type=Path, required=True, help="the paper's rows (json)")
    parser.add_argument("--metrics", default=DEFAULT_METRICS)
    args = parser.parse_args(argv)
    runs = load_runs(args.runs)
    paper = json.loads(args.paper.read_text())
    metrics = args.metrics.split(",")
    order = list(paper["rows"])
    runs.sort(key=lambda run: order.index(run["model"]) if run["model"] in order else 99)
    sys.stdout.write(table(runs, paper, metrics) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
