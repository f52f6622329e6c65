"""Where a comparison's unfinished runs stand: ``unfinished.md`` and ``unfinished.csv``.

A run stopped at ``--time_limit`` (or by Ctrl-C) keeps its completed epochs in a resume
state (``<out>/partial/``) but has no test metric until it ends, so the comparison's
tables cannot hold it.  These files say, from the resume states alone, how far each such
run has got: its epochs, its best epoch and that epoch's validation metrics, and its
validation curve, so that a comparison spread over days shows its partial results
without anyone opening a checkpoint.  They are validation numbers, labelled so, and they
are removed once every run of the comparison is stored.
"""

from __future__ import annotations

import csv
import io

from recbole_freq.jobs.compare.execution import RunJob
from recbole_freq.jobs.compare.runs import entry_model_name, run_file

CSV_FIELDS = (
    "model", "seed", "epochs_stored", "best_epoch", "valid_metric", "best_valid_score",
    "last_valid_score", "train_hours", "segments",
)  # fmt: skip


def unfinished_rows(jobs: list[RunJob], metrics: list[str]) -> tuple[list[dict], list[str]]:
    """``(rows, not_started)``: a row per run with a resume state and no stored run file
    (read with the restricted loader), and the names of the runs with neither."""
    from recbole_freq.quick_start.resume import best_epoch, load_resume_state, progress_problem

    rows, not_started = [], []
    for job in jobs:
        if run_file(job.out, job.entry, job.seed).is_file():
            continue
        if not job.resume_file.is_file():
            not_started.append(f"{job.entry}, seed {job.seed}")
            continue
        state = load_resume_state(job.resume_file)
        model = entry_model_name(job.entry)
        problem = progress_problem(state, model=model, dataset=job.dataset, seed=job.seed)
        if problem is not None:
            not_started.append(
                f"{job.entry}, seed {job.seed} (its resume state is not usable: {problem})"
            )
            continue
        history = state.get("history") or []
        scored = [epoch for epoch in history if epoch.get("valid_score") is not None]
        best = best_epoch(state)
        row = {
            "model": job.entry,
            "seed": job.seed,
            "epochs_stored": state["next_epoch"],
            "best_epoch": best["epoch"] if best else None,
            "valid_metric": state["config"]["valid_metric"],
            "best_valid_score": state.get("best_valid_score"),
            "last_valid_score": scored[-1]["valid_score"] if scored else None,
            "train_hours": sum(e.get("train_seconds") or 0.0 for e in history) / 3600,
            "segments": state.get("segments"),
            "curve": [epoch["valid_score"] for epoch in scored],
        }
        valid = {key.lower(): value for key, value in (best or {}).get("valid", {}).items()}
        row.update({f"valid_{m}": valid.get(m.lower()) for m in metrics})
        rows.append(row)
    return rows, not_started


def _number(value, digits=4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def unfinished_markdown(rows: list[dict], not_started: list[str], metrics: list[str]) -> str:
    """The table of ``unfinished_rows`` with each run's validation curve below it."""
    lines = [
        "## Unfinished runs (validation only)",
        "",
        "Read from each run's resume state: no test metric exists until a run stops, so "
        "these are validation scores, not results. The same command continues them.",
        "",
        "| model | seed | epochs stored | best epoch | best valid | last valid | "
        + " | ".join(f"valid {m} at best" for m in metrics)
        + " | train hours |",
        "|---|---:|---:|---:|---:|---:|" + "---:|" * len(metrics) + "---:|",
    ]
    for row in rows:
        cells = [row["model"], str(row["seed"]), str(row["epochs_stored"])]
        best = row["best_epoch"]
        cells += ["-" if best is None else str(best), _number(row["best_valid_score"])]
        cells += [_number(row["last_valid_score"])]
        cells += [_number(row[f"valid_{m}"]) for m in metrics]
        lines.append("| " + " | ".join(cells + [_number(row["train_hours"], 2)]) + " |")
    for row in rows:
        curve = ", ".join(f"{score:.4f}" for score in row["curve"])
        lines.append(f"\n{row['model']}, seed {row['seed']}, valid {row['valid_metric']} "
                     f"by epoch from 0: {curve}")  # fmt: skip
    if not_started:
        lines.append(f"\nNot started: {'; '.join(not_started)}.")
    return "\n".join(lines) + "\n"


def unfinished_csv(rows: list[dict], metrics: list[str]) -> str:
    """``unfinished_rows`` as CSV, the curve as ``;``-separated scores."""
    fields = [*CSV_FIELDS, *(f"valid_{m}" for m in metrics), "curve"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "curve": ";".join(f"{s:.6g}" for s in row["curve"])})
    return buffer.getvalue()
