"""Validation at matched epochs: each run's best validation score within its first E
epochs, beside a reference run's best within the same E epochs.

    python benchmarks/matched_epochs.py FOLDER/runs/*.json FOLDER/partial/*.resume.pth \
        --reference SASRec-seed2020 --epochs 40,70,100,132,175

A run that trained longer, or was stopped later by its patience, can look better only
because it had more epochs; comparing each run's best among the same first epochs
separates that from the model.  Takes the stored runs of ``--compare`` (``runs/*.json``)
and the resume states of unfinished ones (``partial/*.resume.pth``, read with the
plugin's restricted loader: nothing in the file runs), names each by its file name (the
comparison's ``<entry>-seed<seed>``), and prints a Markdown table: one row per span
``0 .. E - 1``, the reference's best and each other run's with its difference in %.  A
run with fewer than ``E`` epochs has no entry for that span.  ``--metric`` reads one
validation metric (e.g. ``hit@10``) instead of each run's ``valid_metric`` score.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESUME_SUFFIX = ".resume.pth"


def run_name(path: Path) -> str:
    name = path.name
    return name[: -len(RESUME_SUFFIX)] if name.endswith(RESUME_SUFFIX) else path.stem


def validation_curve(path: Path, metric: str | None = None) -> list[float]:
    """The run's validation score after each epoch, from a stored run or a resume state."""
    if path.name.endswith(RESUME_SUFFIX):
        from recbole_freq.quick_start.resume import load_resume_state

        history = load_resume_state(path)["history"]
    else:
        loaded = json.loads(path.read_text(encoding="utf-8"))
        history = loaded.get("summary", loaded)["history"]
    scored = [epoch for epoch in history if "valid_score" in epoch]
    if metric is None:
        return [epoch["valid_score"] for epoch in scored]
    if any(metric not in epoch.get("valid", {}) for epoch in scored):
        raise ValueError(f"{path}: not every epoch has validation {metric}")
    return [epoch["valid"][metric] for epoch in scored]


def matched_table(curves: dict[str, list[float]], reference: str, spans: list[int]) -> str:
    if reference not in curves:
        raise ValueError(f"--reference {reference!r} is none of the runs: {sorted(curves)}")
    others = [name for name in curves if name != reference]
    lines = [
        "| epochs | " + " | ".join([reference, *others]) + " |",
        "|---|" + "---|" * (1 + len(others)),
    ]
    for span in spans:
        base = curves[reference]
        if len(base) < span:
            continue
        best = max(base[:span])
        cells = [f"{best:.4f}"]
        for name in others:
            curve = curves[name]
            if len(curve) < span:
                cells.append("-")
                continue
            value = max(curve[:span])
            cells.append(f"{value:.4f} ({100 * (value / best - 1):+.1f}%)")
        lines.append(f"| 0-{span - 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", help="runs/*.json and partial/*.resume.pth files")
    parser.add_argument("--reference", required=True, help="the run the others are set beside")
    parser.add_argument(
        "--epochs", required=True, help="span ends E, comma-separated: epochs 0 .. E - 1"
    )
    parser.add_argument("--metric", default=None, help="a validation metric, e.g. ndcg@10")
    args = parser.parse_args(argv)
    try:
        spans = sorted({int(value) for value in args.epochs.split(",")})
    except ValueError:
        parser.error(f"--epochs {args.epochs!r}: whole numbers, comma-separated")
    if spans[0] < 1:
        parser.error("--epochs: every span ends at 1 or more")
    try:
        curves = {run_name(Path(p)): validation_curve(Path(p), args.metric) for p in args.runs}
        print(matched_table(curves, args.reference, spans))
    except (OSError, ValueError, KeyError) as error:
        print(f"matched_epochs: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
