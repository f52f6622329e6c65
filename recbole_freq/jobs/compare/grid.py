"""The models x datasets table of a comparison over several datasets (BSARec Table 2's
layout turned on its side: one block per metric, a column per dataset): each cell the
mean ± std of the runs stored so far (the seeds it holds named where some are missing),
and under each model the figures ``properties/reference/<dataset>.yaml`` holds for it (the
paper's, the authors' code run here) with our relative difference from each."""

from __future__ import annotations

import csv
import io
import statistics

from recbole_freq.jobs.compare.runs import entry_label, run_protocol_label, split_entry
from recbole_freq.jobs.compare.tables import published_figures


def grid_label(entry: str) -> str:
    """A grid row's name and the key of its published figures: ``entry_label``, except
    that another loss or protocol keeps its whole entry (``SASRec@train_loss=model``),
    so that no figure of the paper's row is set beside a row not trained as it was."""
    label = entry_label(entry)
    return entry if split_entry(entry)[1] and label == split_entry(entry)[0] else label


def grid_cells(stored: dict, entries, seeds, metrics) -> dict:
    """``{(dataset, entry, metric): [value per stored seed]}`` from ``stored``:
    ``{dataset: {(entry, seed): record}}`` (the runs stored so far)."""
    cells = {}
    for dataset, records in stored.items():
        for entry in entries:
            runs = [records[(entry, seed)] for seed in seeds if (entry, seed) in records]
            for metric in metrics:
                cells[(dataset, entry, metric)] = [
                    run["summary"]["test_result"][metric]
                    for run in runs
                    if metric in run["summary"]["test_result"]
                ]
    return cells


def dataset_figures(stored: dict) -> dict:
    """Each dataset's published figures for the protocol its stored runs were made under
    (none where they name several, or none is stored)."""
    return {
        dataset: published_figures(dataset, {run_protocol_label(r) for r in records.values()})
        if records
        else []
        for dataset, records in stored.items()
    }


def _cell(values: list, seeds) -> str:
    if not values:
        return "not run yet"
    mean = statistics.fmean(values)
    shown = f"{mean:.4f}" + (f" ± {statistics.stdev(values):.4f}" if len(values) > 1 else "")
    if len(values) < len(seeds):
        shown += f" ({len(values)} of {len(seeds)} seeds)"
    return shown


def _figure_rows(entry, datasets, cells, figures, metric) -> list[str]:
    """Under a model's row: each source's figure per dataset, and our difference."""
    model = grid_label(entry)
    names = dict.fromkeys(
        figure["name"]
        for dataset in datasets
        for figure in figures[dataset]
        if metric in figure["rows"].get(model, {})
    )
    lines = []
    for name in names:
        given, differences = [], []
        for dataset in datasets:
            value = next(
                (
                    figure["rows"][model].get(metric)
                    for figure in figures[dataset]
                    if figure["name"] == name and model in figure["rows"]
                ),
                None,
            )
            ours = cells[(dataset, entry, metric)]
            given.append("" if value is None else f"{value:.4f}")
            differences.append(
                f"{(statistics.fmean(ours) - value) / value:+.1%}" if value and ours else ""
            )
        lines.append(f"| {model}, {name} | " + " | ".join(given) + " |")
        lines.append(f"| ours vs {name} | " + " | ".join(differences) + " |")
    return lines


def grid_markdown(stored: dict, entries, seeds, metrics, out_names: dict) -> str:
    """The grid as markdown: one block per metric; ``out_names``: dataset -> the folder
    of its own full table."""
    datasets = list(stored)
    cells = grid_cells(stored, entries, seeds, metrics)
    figures = dataset_figures(stored)
    seeds_text = ", ".join(map(str, seeds))
    blocks = []
    for metric in metrics:
        lines = [
            f"### {metric} (test; mean ± std over seeds {seeds_text})",
            "",
            "| model | " + " | ".join(datasets) + " |",
            "|" + "---|" * (len(datasets) + 1),
        ]
        for entry in entries:
            row = [_cell(cells[(d, entry, metric)], seeds) for d in datasets]
            lines.append(f"| {grid_label(entry)} | " + " | ".join(row) + " |")
            lines += _figure_rows(entry, datasets, cells, figures, metric)
        blocks.append("\n".join(lines))
    protocols = "; ".join(
        f"{dataset}: "
        + (" / ".join(sorted({run_protocol_label(r) for r in stored[dataset].values()})) or "-")
        for dataset in datasets
    )
    notes = [
        f"Protocol per dataset: {protocols}.",
        "Each dataset's full table (losses, significance tests, time per epoch): "
        + ", ".join(f"{out_names[d]}/comparison.md" for d in datasets)
        + ".",
    ]
    return "\n\n".join(blocks) + "\n\n" + "\n".join(notes) + "\n"


def grid_csv_text(stored: dict, entries, seeds, metrics) -> str:
    """One row per (model, dataset, metric): mean, std, the seeds stored, and each
    published figure with our relative difference."""
    cells = grid_cells(stored, entries, seeds, metrics)
    figures = dataset_figures(stored)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        ["model", "dataset", "metric", "mean", "std", "seeds", "source", "figure", "difference"]
    )
    for (dataset, entry, metric), values in cells.items():
        mean = statistics.fmean(values) if values else None
        std = statistics.stdev(values) if len(values) > 1 else None
        base = [grid_label(entry), dataset, metric, mean, std, len(values)]
        writer.writerow(base + ["", "", ""])
        for figure in figures[dataset]:
            value = figure["rows"].get(grid_label(entry), {}).get(metric)
            if value is not None:
                difference = (mean - value) / value if mean is not None and value else None
                writer.writerow(base + [figure["name"], value, difference])
    return buffer.getvalue()
