"""A comparison's numbers: mean and std over seeds, the improvement over the best baseline
(its tests are ``statistics``), and the CSV, markdown and plot outputs."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import yaml

from recbole_freq.jobs.compare.runs import (
    DEFAULT_EXTRA_MODE_METRICS,
    DEFAULT_METRICS,
    ComparisonError,
)
from recbole_freq.jobs.compare.statistics import (
    metric_value,
    paired_p_value,
    smaller_is_better,
)
from recbole_freq.protocol import comparable_label, protocol_label
from recbole_freq.protocol.pieces import fearec_terms, loss_base_label
from recbole_freq.quick_start.preflight import extra_test_modes
from recbole_freq.utils.files import write_atomic

# ------------------------------------------------------------------------------- metrics


def _available_metrics(config) -> set[str]:
    """The test metrics of the run's own protocol (``hit@10``) and, for every entry of
    ``extra_test_modes``, the same metrics under that mode (``uni100:hit@10``)."""
    names = [m.lower() for m in config["metrics"]]
    topk = config["topk"] if isinstance(config["topk"], list) else [config["topk"]]
    own = {f"{name}@{k}" for name in names for k in topk} | set(names)
    return own | {f"{mode}:{m}" for mode in extra_test_modes(config) for m in own}


def choose_metrics(metrics, config) -> list[str]:
    available = _available_metrics(config)
    if metrics is None:
        chosen = [m for m in DEFAULT_METRICS if m in available] or sorted(
            m for m in available if ":" not in m
        )
        # Metrics the user's settings add beyond the papers' two (Recall, MRR ...) were
        # dropped unless --metrics repeated them: each joins at every cut-off.
        topk = config["topk"] if isinstance(config["topk"], list) else [config["topk"]]
        added = [m.lower() for m in config["metrics"] if m.lower() not in ("hit", "ndcg")]
        chosen += [f"{name}@{k}" for name in added for k in topk if f"{name}@{k}" not in chosen]
        extra = [
            f"{mode}:{m}" for mode in extra_test_modes(config) for m in DEFAULT_EXTRA_MODE_METRICS
        ]
        return chosen + [m for m in extra if m in available]
    chosen = [m.strip().lower() for m in metrics if m.strip()]
    missing = [m for m in chosen if m not in available]
    if missing:
        raise ComparisonError(
            f"metric(s) {', '.join(missing)} are not evaluated with this configuration; "
            f"available: {', '.join(sorted(available))} (set RecBole's metrics/topk to add, "
            "or extra_test_modes for <mode>:<metric>)"
        )
    if len(set(chosen)) != len(chosen):
        raise ComparisonError(f"--metrics lists a metric twice: {metrics}")
    return chosen


def improvement(value: float, baseline: float, smaller_better: bool = False) -> float | None:
    """Relative improvement in percent, positive = better (the papers' "Improv.")."""
    if baseline == 0:
        return None
    change = float((value - baseline) / abs(baseline) * 100)
    return -change if smaller_better else change


def pruned_fractions(summaries) -> list[float] | None:
    """Per attention layer, the share of links the learned masks prune (Rec-Denoiser's
    inference masks), averaged over the runs; ``None`` for a model without masks."""
    layers = [
        [entry["pruned_fraction"] for entry in s.get("model_report", {}).get("learned_masks", [])]
        for s in summaries
    ]
    if not layers or not all(layers) or len({len(x) for x in layers}) != 1:
        return None
    return [float(value) for value in np.mean(layers, axis=0)]


def recorded_loss(summary: dict) -> str:
    """The training loss a run file names (``training_loss``); for a run stored before
    runs named it, the same name read from its settings (the protocol's ``train_loss``
    and ``train_rows``, the model's ``loss_type`` and the terms its settings turn on)."""
    if summary.get("training_loss"):
        return str(summary["training_loss"])
    protocol = summary.get("protocol") if isinstance(summary.get("protocol"), dict) else {}
    config = summary.get("config") or {}
    if "train_loss" not in protocol:
        return "unrecorded"
    base = loss_base_label(
        protocol["train_loss"], protocol.get("train_rows"), config.get("loss_type")
    )
    terms = fearec_terms(config.get("contrast"), config.get("fredom"))
    if summary.get("model") == "Caser":
        terms.append("L2 terms")
    return " + ".join([base, *terms])


def capped_by_epochs(summary: dict) -> bool:
    """Whether a run ended at its ``epochs`` cap before early stopping could end it (its
    best epoch fewer than ``stopping_step`` epochs before the last): a budget's result,
    not a converged one."""
    config = summary.get("config") or {}
    epochs, patience = config.get("epochs"), config.get("stopping_step")
    ran, best = summary.get("epochs_run"), summary.get("best_epoch")
    if not all(isinstance(v, int) for v in (epochs, patience, ran, best)):
        return False
    return ran >= epochs and ran - 1 - best < patience


def summarise(records: dict, models, seeds, metrics, baselines) -> list[dict]:
    """One row per model: mean/std per metric and, for proposed models, improvement over
    the best baseline per metric and the paired t-test against it."""
    rows = []
    per_model = {}
    for model in models:
        summaries = [records[(model, seed)]["summary"] for seed in seeds]
        values = {m: [metric_value(s, m) for s in summaries] for m in metrics}
        per_model[model] = values
        seconds = [s["train_seconds_per_epoch"] for s in summaries]
        epochs = [s["epochs_run"] for s in summaries]
        row = {
            "model": model,
            "role": "baseline" if model in baselines else "proposed",
            "loss": " / ".join(dict.fromkeys(recorded_loss(s) for s in summaries)),
            "seeds": len(seeds),
        }
        if any(s.get("learns_by_gradient") is False for s in summaries):
            row["count_baseline"] = True  # TransitionCount: nothing learned by gradient
        else:
            row["capped_runs"] = sum(map(capped_by_epochs, summaries))
        for metric in metrics:
            row[f"{metric}_mean"] = float(np.mean(values[metric]))
            row[f"{metric}_std"] = sample_std(values[metric])
        row.update(
            train_seconds_per_epoch_mean=float(np.mean(seconds)),
            train_seconds_per_epoch_std=sample_std(seconds),
            epochs_run_mean=float(np.mean(epochs)),
            parameters=int(summaries[0]["parameters"]),
            pruned_fractions=pruned_fractions(summaries),
        )
        rows.append(row)

    best_baseline = {}
    baseline_rows = [row for row in rows if row["role"] == "baseline"]
    for metric in metrics:
        if baseline_rows:
            pick = min if smaller_is_better(metric) else max
            best_baseline[metric] = pick(baseline_rows, key=lambda r: r[f"{metric}_mean"])["model"]
    for row in rows:
        for metric in metrics:
            gain = p_value = reference = None
            if row["role"] == "proposed" and metric in best_baseline:
                reference = best_baseline[metric]
                gain = improvement(
                    row[f"{metric}_mean"],
                    np.mean(per_model[reference][metric]),
                    smaller_is_better(metric),
                )
                p_value = paired_p_value(
                    per_model[row["model"]][metric], per_model[reference][metric]
                )
            row[f"{metric}_best_baseline"] = reference
            row[f"{metric}_improv_pct"] = gain
            row[f"{metric}_p_value"] = p_value
    _mark_count_floor(rows, metrics)
    return rows


def _mark_count_floor(rows, metrics) -> None:
    """With count baselines in the comparison, each other row's ``<metric>_above_counts``:
    whether its mean beats the best count baseline's (None on the count rows)."""
    counts = [row for row in rows if row.get("count_baseline")]
    if not counts:
        return
    for metric in metrics:
        pick, better = (min, float.__lt__) if smaller_is_better(metric) else (max, float.__gt__)
        floor = pick(row[f"{metric}_mean"] for row in counts)
        for row in rows:
            above = None if row.get("count_baseline") else better(row[f"{metric}_mean"], floor)
            row[f"{metric}_above_counts"] = above
    for row in rows:
        row.setdefault("count_baseline", False)


def sample_std(values) -> float:
    # Sample standard deviation across seeds (ddof=1), 0 for a single seed.
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


# ---------------------------------------------------------------------------- output


def csv_text(rows: list[dict]) -> str:
    """The rows as csv, a column for every key any row has (a count baseline's row has no
    ``capped_runs``, a trained model's none of a count row's own): empty where a row
    lacks it."""
    buffer = io.StringIO()
    fields = list(dict.fromkeys(key for row in rows for key in row))
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buffer.getvalue()


def runs_csv_text(records: dict, models, seeds, metrics) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        ["model", "seed", *metrics, "train_seconds_per_epoch", "epochs_run", "best_epoch",
         "parameters", "checkpoint"]
    )  # fmt: skip
    for model in models:
        for seed in seeds:
            s = records[(model, seed)]["summary"]
            writer.writerow(
                [model, seed, *(metric_value(s, m) for m in metrics),
                 s["train_seconds_per_epoch"], s["epochs_run"], s["best_epoch"],
                 s["parameters"], s["checkpoint"]]
            )  # fmt: skip
    return buffer.getvalue()


def markdown_table(rows, metrics, dataset, seeds, protocol: str = "", correction="holm") -> str:
    """The papers' layout: a mean ± std row per model (best mean in bold) naming the loss
    it trained with, then per proposed model an "Improv." row and a paired t-test row
    against the best baseline; the notes that say what each row means below it."""
    header = ["Model", "loss", *metrics, "s/epoch (train)", "epochs", "parameters"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += _model_lines(rows, metrics, spread=len(seeds) > 1)
    lines += _gain_lines(rows, metrics, correction)
    notes = _table_notes(rows, metrics, dataset, seeds, correction)
    if protocol:
        notes.append(protocol)
    return "\n".join(lines + notes) + "\n"


def _model_lines(rows, metrics, spread: bool) -> list[str]:
    """One line per model: mean (± std with several seeds) per metric, best in bold."""
    best = {}
    for metric in metrics:
        pick = min if smaller_is_better(metric) else max
        best[metric] = pick(row[f"{metric}_mean"] for row in rows)
    mixed = len({row.get("protocol") for row in rows}) > 1
    lines = []
    for row in rows:
        cells = [row["model"] + (" (baseline)" if row["role"] == "baseline" else "")]
        if mixed:
            cells[0] += f" [{row['protocol']}]"
        cells.append(row.get("loss", ""))
        for metric in metrics:
            text = f"{row[f'{metric}_mean']:.4f}"
            text += f" ± {row[f'{metric}_std']:.4f}" if spread else ""
            text = f"**{text}**" if row[f"{metric}_mean"] == best[metric] else text
            cells.append(text + (" †" if row.get(f"{metric}_above_counts") is False else ""))
        seconds = _seconds(row["train_seconds_per_epoch_mean"])
        cells += [
            seconds + (f" ± {_seconds(row['train_seconds_per_epoch_std'])}" if spread else ""),
            f"{row['epochs_run_mean']:.1f}",
            f"{row['parameters']:,}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _gain_lines(rows, metrics, correction) -> list[str]:
    """Per proposed model: its Improv. row, the paired t-test across seeds and, where
    there are per-user ranks, the per-user tests."""
    lines = []
    for row in rows:
        if row["role"] != "proposed" or not any(row[f"{m}_best_baseline"] for m in metrics):
            continue
        gains, tests = [f"Improv. {row['model']}", ""], [f"p (paired t) {row['model']}", ""]
        for metric in metrics:
            gain, p_value = row[f"{metric}_improv_pct"], row[f"{metric}_p_value"]
            gains.append("n/a" if gain is None else f"{gain:+.2f}%")
            tests.append("n/a" if p_value is None else f"{p_value:.3g}")
        lines.append("| " + " | ".join(gains + [""] * 3) + " |")
        lines.append("| " + " | ".join(tests + [""] * 3) + " |")
        if any(f"{m}_p_wilcoxon_users" in row for m in metrics):
            for key, name in (("p_wilcoxon_users", "Wilcoxon"), ("p_t_users", "paired t")):
                cells = [f"p ({name}, users, {correction}) {row['model']}", ""]
                for metric in metrics:
                    p_value = row.get(f"{metric}_{key}")
                    cells.append("n/a" if p_value is None else f"{p_value:.3g}")
                lines.append("| " + " | ".join(cells + [""] * 3) + " |")
    return lines


def _table_notes(rows, metrics, dataset, seeds, correction) -> list[str]:
    spread = len(seeds) > 1
    notes = [
        "",
        f"Dataset {dataset}; test results, "
        + (
            f"mean ± sample std over {len(seeds)} seeds ({', '.join(map(str, seeds))}); "
            "best mean per metric in bold."
            if spread
            else f"one seed ({seeds[0]}); best per metric in bold."
        ),
    ]
    # The best baseline per metric is the same for every proposed row.
    references = {
        metric: row[f"{metric}_best_baseline"]
        for row in rows
        for metric in metrics
        if row[f"{metric}_best_baseline"]
    }
    if references:
        notes.append(
            "Improv.: relative change of the proposed model's mean over the best baseline's "
            "mean per metric (positive = better); p: two-sided paired t-test across seeds "
            "against that baseline (n/a with fewer than 2 seeds or no variance). Best "
            "baseline: " + _describe_references(references) + "."
        )
        if any(f"{m}_p_wilcoxon_users" in row for row in rows for m in metrics):
            method = {"holm": "Holm", "bh": "Benjamini-Hochberg"}[correction]
            notes.append(
                "p (Wilcoxon / paired t, users): two-sided paired Wilcoxon signed-rank and "
                "paired t-tests across the test users of each user's value (averaged over "
                f"seeds) against that baseline, {method}-corrected across every such test "
                "of this table (n/a: a metric without per-user ranks, e.g. a uni<N>: column)."
            )
    else:
        notes.append("No Improv. rows: the comparison has no baseline or no proposed model.")
    counts = [row["model"] for row in rows if row.get("count_baseline")]
    if counts:
        below = [
            row["model"]
            for row in rows
            if any(row.get(f"{m}_above_counts") is False for m in metrics)
        ]
        others = len(rows) > len(counts)
        verdict = f" ({', '.join(below)})." if below else "; every other row is above them."
        notes.append(
            f"Count baselines ({', '.join(counts)}): each item scored by how often it followed "
            "the row's newest items in the training rows, nothing learned."
            + (" †: not above the best count baseline on that metric" + verdict if others else "")
        )
    masked = [row for row in rows if row.get("pruned_fractions")]
    if masked:
        notes.append(
            "Attention links pruned by the learned masks (inference masks, share of the "
            "allowed links per layer"
            + (", mean over seeds" if spread else "")
            + "): "
            + "; ".join(
                f"{row['model']} "
                + ", ".join(
                    f"layer {i} {value:.1%}" for i, value in enumerate(row["pruned_fractions"])
                )
                for row in masked
            )
            + "."
        )
    return notes


def published_figures(dataset: str, labels) -> list[dict]:
    """The figures of ``properties/reference/<dataset>.yaml`` for a table whose runs carry
    ``labels``: ``[{"name", "source", "rows": {model: {metric: value}}}]`` (a paper's table,
    the authors' code run here), or none when the runs' protocol (model pieces aside) is
    not the one the figures were made under.  Read with ``yaml.safe_load``: plain data."""
    from recbole_freq.utils.property_files import properties_dir

    protocols = {comparable_label(label) for label in labels}
    path = properties_dir() / "reference" / f"{dataset}.yaml"
    if len(protocols) != 1 or "/" in str(dataset) or not path.is_file():
        return []
    figures = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return figures.get(protocols.pop(), [])


def published_section(rows, metrics, figures: list[dict], seeds) -> str:
    """Each model's mean, then each published figure for it (one row per source, named by
    its ``name``) and our relative difference from it; empty when no figure names a model
    of the table."""
    lines, capped = [], False
    for row in rows:
        sources = [figure for figure in figures if figure["rows"].get(row["model"])]
        if not sources:
            continue
        ours = [row[f"{metric}_mean"] for metric in metrics]
        mark = " †" if row.get("capped_runs") else ""
        capped = capped or bool(mark)
        lines.append(
            f"| {row['model']} (ours{mark}) | " + " | ".join(f"{v:.4f}" for v in ours) + " |"
        )
        for figure in sources:
            given = [figure["rows"][row["model"]].get(metric) for metric in metrics]
            lines.append(
                f"| {row['model']} ({figure['name']}) | "
                + " | ".join("n/a" if v is None else f"{v:.4f}" for v in given)
                + " |"
            )
            lines.append(
                f"| difference from {figure['name']}{' (not comparable: †)' if mark else ''} | "
                + " | ".join(
                    "" if v is None else f"{(o - v) / v:+.1%}" for o, v in zip(ours, given)
                )
                + " |"
            )
    if not lines:
        return ""
    header = ["| Model | " + " | ".join(metrics) + " |", "|" + "---|" * (len(metrics) + 1)]
    count = f"mean of {len(seeds)} seeds" if len(seeds) > 1 else f"seed {seeds[0]}"
    named = "; ".join(f"{figure['name']}: {figure['source']}" for figure in figures)
    note = (
        f"Beside the published figures for this protocol (properties/reference/; ours: "
        f"{count}; difference: ours relative to the figure). {named}."
    )
    if capped:
        note += (
            " † Trained to the --epochs cap before early stopping could end it: a budget's "
            "result, not the paper's training, so its difference from the figure is not "
            "comparable."
        )
    return "\n" + note + "\n\n" + "\n".join(header + lines) + "\n"


def _describe_references(references: dict) -> str:
    if len(set(references.values())) == 1:
        return f"{next(iter(references.values()))} for every metric"
    return ", ".join(f"{metric} {model}" for metric, model in references.items())


def _seconds(value: float) -> str:
    return f"{value:.2f}" if value >= 1 else f"{value:.3f}"


def save_plot(path: Path, rows, metrics, dataset, seeds) -> None:
    """Grouped bars (one group per metric, one bar per model) with std error bars."""
    # Figure without pyplot: no GUI backend, safe in headless workers and threads.
    from matplotlib.figure import Figure

    n_models = len(rows)
    width = 0.8 / n_models
    figure = Figure(figsize=(max(6.0, 1.1 * len(metrics) * max(1, n_models / 2)), 4.2))
    axes = figure.subplots()
    positions = np.arange(len(metrics))
    for index, row in enumerate(rows):
        axes.bar(
            positions + (index - (n_models - 1) / 2) * width,
            [row[f"{m}_mean"] for m in metrics],
            width,
            yerr=[row[f"{m}_std"] for m in metrics],
            capsize=3,
            label=row["model"] + (" (baseline)" if row["role"] == "baseline" else ""),
        )
    axes.set_xticks(positions, metrics)
    axes.set_ylabel("test value (mean ± std)")
    axes.set_title(f"{dataset}: {n_models} models, {len(seeds)} seed(s)")
    axes.legend(fontsize="small")
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    write_atomic(path, lambda handle: figure.savefig(handle, format="png", dpi=120))


def protocol_side_by_side(rows, metrics, seeds, protocols) -> str:
    """Each model's test results under every protocol, side by side: how much of a gap
    between two tables is the protocol's."""
    spread = len(seeds) > 1
    header = ["Model", *(f"{metric} {protocol}" for metric in metrics for protocol in protocols)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    by_key = {(row["model"], row["protocol"].split("+")[0]): row for row in rows}
    models = list(dict.fromkeys(row["model"] for row in rows))
    for model in models:
        cells = [model]
        for metric in metrics:
            for protocol in protocols:
                row = by_key.get((model, protocol))
                if row is None:
                    cells.append("")
                    continue
                text = f"{row[f'{metric}_mean']:.4f}"
                cells.append(text + (f" ± {row[f'{metric}_std']:.4f}" if spread else ""))
        lines.append("| " + " | ".join(cells) + " |")
    seeds_text = ", ".join(map(str, seeds))
    lines += [
        "",
        f"The same models trained and tested under each protocol ({', '.join(protocols)}); "
        f"test results, {'mean ± sample std over seeds ' if spread else 'seed '}{seeds_text}. "
        "Each protocol's own table, with its Improv. rows, follows.",
        "",
    ]
    return "## Protocols side by side\n\n" + "\n".join(lines)


def protocol_note(config, labels=()) -> str:
    labels = list(labels) or [protocol_label(config)]
    common = sorted({comparable_label(label) for label in labels})
    if len(labels) == 1:
        named = f"Protocol {labels[0]} (docs/protocols.md)"
    elif len(common) == 1:
        named = (
            f"Protocol {common[0]} (docs/protocols.md), each model with its own training loss "
            f"({', '.join(labels)})"
        )
    else:
        named = f"Mixed protocols ({', '.join(labels)}; each row names its own)"
    note = (
        f"{named}: eval_args {dict(config['eval_args'])}, valid_metric {config['valid_metric']}, "
        f"epochs ≤ {config['epochs']}, stopping_step {config['stopping_step']}."
    )
    modes = extra_test_modes(config)
    if modes:
        note += (
            f" Columns <mode>:<metric> test the same best checkpoint, on the same split, "
            f"under the extra test mode(s) {', '.join(modes)} (uni<N>: the target ranked "
            "against N uniformly sampled negatives)."
        )
    return note
