"""Our runs beside a paper's table: one markdown table from ``--compare`` run files.

    python benchmarks/beside_paper.py RUNS_DIR [RUNS_DIR ...] --paper paper.json \
        [--metrics hit@5,hit@10,hit@20,ndcg@5,ndcg@10,ndcg@20] > table.md

``RUNS_DIR``: the ``runs/`` folders that ``--compare --out DIR`` writes (several, when the
models of one table were run by separate commands; every run must name the same protocol
and dataset).  ``paper.json``: ``{"source": "...", "rows": {"Model": [values in metric
order], ...}}`` (or in the order of its own ``"metrics": [...]``, matched by name;
``"entries": {"Model@variant=v": "Model"}`` names the paper row an entry stands for),
optionally with ``"authors_here": {"source": "...", "rows": {...}}``: the
authors' own code run on the machine our numbers come from (``null`` where a value was not
measured).  Each model gets its row, the paper's row under it and the difference, then
the authors' code's row and our difference from it; the last columns say how each run
ended (epochs, best epoch, seconds per training epoch), so that a reader sees which runs
the budget cut short.

``--seed_means``: one row per ``--compare`` entry (a variant is its own entry) and loss
instead of one per run: the mean and sample standard deviation over its seeds, each
seed's best epoch and how its run ended, the paper's row and our difference from it in
percent and in our seed standard deviations; with ``--reference MODEL``, each entry's gain
over that entry's means (over the seeds both have) beside the paper's gain.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from recbole_freq.jobs.compare.statistics import add_per_user_tests, metric_value
from recbole_freq.jobs.compare.tables import recorded_loss, sample_std, summarise

DEFAULT_METRICS = "hit@5,hit@10,hit@20,ndcg@5,ndcg@10,ndcg@20"


def load_runs(folders: list[Path]) -> list[dict]:
    runs = []
    for folder in folders:
        for path in sorted(folder.glob("*.json")):
            record = json.loads(path.read_text())
            if record.get("finished"):
                # The --compare entry (``Model@variant=...``); the summary names the class.
                runs.append({**record["summary"], "entry": record.get("model")})
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
    head = ["model", "loss", *metrics, "epochs (best)", "s/epoch"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        ours = [run["test_result"][m] for m in metrics]
        stop = "early stop" if run["stopped_early"] else "budget"
        label = run["protocol"]["label"]
        shown = "" if label == run["protocol"]["protocol"] else f", {label}"
        seed = f", seed {run['seed']}" if run.get("seed") is not None else ""
        lines.append(
            f"| {run['model']} (ours{seed}{shown}) | {recorded_loss(run)} | "
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
            loss = paper.get("losses", {}).get(run["model"], "") if source == "paper" else ""
            lines.append(
                f"| {run['model']} ({source}) | {loss} | "
                + " | ".join(_value(v) for v in reported)
                + " | | |"
            )
            lines.append(
                f"| difference from {named} | | "
                + " | ".join(_difference(o, r) for o, r in zip(ours, reported))
                + " | | |"
            )
    return "\n".join(lines)


def gains(runs: list[dict], paper: dict, metrics: list[str], proposed: str) -> str:
    """The proposed model's relative gain over every other (model, loss) of ours (means
    over the seeds both have), with the package's tests of ``--compare``: paired t across
    those seeds, paired t and Wilcoxon across the test users (per-user values averaged
    over the seeds, Holm-corrected over the metrics of one baseline); each beside the
    paper's and the authors' code's gain over that model."""
    groups: dict[str, dict[int, dict]] = {}
    for run in runs:
        name = f"{run['model']}, {recorded_loss(run)}"
        groups.setdefault(name, {})[run.get("seed")] = {"summary": run}
    mine = [name for name in groups if name.split(", ", 1)[0] == proposed]
    if len(mine) != 1:
        raise SystemExit(f"--proposed {proposed}: needs runs of it with one loss, found {mine}")
    head = ["gain of " + proposed, "over", "seeds", *metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    here = paper.get("authors_here", {}).get("rows", {})
    for name, by_seed in groups.items():
        if name == mine[0]:
            continue
        seeds = sorted(set(by_seed) & set(groups[mine[0]]))
        if not seeds:
            continue
        records = {
            (entry, seed): groups[entry][seed] for entry in (name, mine[0]) for seed in seeds
        }
        rows = summarise(records, [name, mine[0]], seeds, metrics, {name})
        add_per_user_tests(rows, records, seeds, metrics, "holm")
        row = rows[1]
        seeds_text = ", ".join(map(str, seeds))
        lines.append(
            f"| ours | {name} | {seeds_text} | "
            + " | ".join(_gain(row[f"{m}_improv_pct"]) for m in metrics)
            + " |"
        )
        for key, test in (
            ("p_value", "p, paired t across seeds"),
            ("p_t_users", "p, paired t across users (Holm)"),
            ("p_wilcoxon_users", "p, Wilcoxon across users (Holm)"),
        ):
            lines.append(
                f"| {test} | | | " + " | ".join(_p(row.get(f"{m}_{key}")) for m in metrics) + " |"
            )
        model = name.split(", ", 1)[0]
        for source, rows_given, loss_of in (
            ("paper", paper["rows"], paper.get("losses", {}).get(model, "as the paper trained it")),
            ("authors' code here", here, "as their code trains it"),
        ):
            if proposed in rows_given and model in rows_given:
                lines.append(
                    f"| {source} | {model}, {loss_of} | | "
                    + " | ".join(
                        _relative(a, b) for a, b in zip(rows_given[proposed], rows_given[model])
                    )
                    + " |"
                )
    note = (
        f"{mine[0]}; each gain: the relative change of its mean over the baseline's mean, "
        "over the seeds both have."
    )
    return note + "\n\n" + "\n".join(lines)


def seed_means(runs: list[dict], paper: dict, metrics: list[str], reference=None) -> str:
    """Mean +- sample std over seeds per (entry, loss), beside the paper's row."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        entry = run.get("entry") or run["model"]
        groups.setdefault((entry, recorded_loss(run)), []).append(run)
    head = ["row", "loss", "seeds", *metrics, "best epoch of epochs run (per seed)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (entry, loss), group in groups.items():
        group.sort(key=lambda run: run.get("seed") or 0)
        values = [[metric_value(run, m) for run in group] for m in metrics]
        means = [float(np.mean(v)) for v in values]
        stds = [sample_std(v) for v in values]
        label = group[0]["protocol"]["label"]
        ends = ", ".join(map(_how_it_ended, group))
        lines.append(
            f"| {entry} (ours, {label}) | {loss} | {_seeds(group)} | "
            + " | ".join(_mean_std(m, s, "{:.4f}", len(group)) for m, s in zip(means, stds))
            + f" | {ends} |"
        )
        paper_row, reported = _paper_row(paper, entry)
        if reported is not None:
            lines.append(
                f"| {entry} (paper{'' if paper_row == entry else ': ' + paper_row}) | "
                f"{paper.get('losses', {}).get(paper_row, '')} | | "
                + " | ".join(_value(v) for v in reported)
                + " | |"
            )
            lines.append(
                "| difference from the paper (in our seed std) | | | "
                + " | ".join(_difference_in_stds(m, s, r) for m, s, r in zip(means, stds, reported))
                + " | |"
            )
    if reference is not None:
        lines.extend(_gains_over(groups, reference, paper, metrics))
    return "\n".join(lines)


def _gains_over(groups: dict, reference: str, paper: dict, metrics: list[str]) -> list[str]:
    references = [key for key in groups if key[0] == reference]
    if len(references) != 1:
        raise SystemExit(f"--reference {reference}: needs runs of it with one loss")
    base = {run.get("seed"): run for run in groups[references[0]]}
    _, reported_base = _paper_row(paper, reference)
    lines = []
    for key, group in groups.items():
        if key == references[0]:
            continue
        paired = [run for run in group if run.get("seed") in base]
        if not paired:
            continue
        ours, spreads = [], []
        for metric in metrics:
            mine = [metric_value(run, metric) for run in paired]
            theirs = [metric_value(base[run.get("seed")], metric) for run in paired]
            ours.append(np.mean(mine) / np.mean(theirs) - 1)
            spreads.append(sample_std([a / b - 1 for a, b in zip(mine, theirs)]))
        lines.append(
            f"| gain of {key[0]} over {reference} (ours; ± its std over seeds) | | "
            f"{_seeds(paired)} | "
            + " | ".join(
                _mean_std(g * 100, s * 100, "{:+.1f}%", len(paired)) for g, s in zip(ours, spreads)
            )
            + " | |"
        )
        _, reported_entry = _paper_row(paper, key[0])
        if reported_entry is not None and reported_base is not None:
            reported = [
                None if a is None or b is None else a / b - 1
                for a, b in zip(reported_entry, reported_base)
            ]
            lines.append(
                f"| gain of {key[0]} over {reference} (paper) | | | "
                + " | ".join("" if g is None else f"{g * 100:+.1f}%" for g in reported)
                + " | |"
            )
            lines.append(
                "| our gain minus the paper's, points (in the gain's seed std) | | | "
                + " | ".join(map(_gain_difference, ours, reported, spreads))
                + " | |"
            )
    return lines


def _paper_row(paper: dict, entry: str) -> tuple[str, list | None]:
    """The paper row a --compare entry stands for and its values (``None``: no row).

    ``"entries"`` maps an entry to a row (a variant that is today's --paper model); any
    other entry stands for the row of its own name, so other variants have none."""
    row = paper.get("entries", {}).get(entry, entry)
    return row, paper["rows"].get(row)


def aligned(paper: dict, metrics: list[str], source) -> dict:
    """The paper's rows (and ``authors_here``'s) as values in the order of ``metrics``.

    A paper file that names its ``"metrics"`` is matched by name (``None`` where the
    paper has no such metric); one that does not must give one value per metric asked
    for, in that order, or this stops with one line saying so: a row silently read
    against the wrong metrics would misstate every difference."""
    named = paper.get("metrics")
    sections = [paper] + ([paper["authors_here"]] if paper.get("authors_here") else [])
    for section in sections:
        for model, values in section["rows"].items():
            if named is not None:
                by_name = dict(zip(named, values))
                section["rows"][model] = [by_name.get(metric) for metric in metrics]
            elif len(values) != len(metrics):
                raise SystemExit(
                    f"{source}: {model} has {len(values)} values for {len(metrics)} metrics "
                    f"({','.join(metrics)}); give --metrics in the paper's order or add "
                    '"metrics": [...] to the file'
                )
    return paper


def _how_it_ended(run: dict) -> str:
    if run.get("learns_by_gradient") is False:
        return "no training (counts)"
    return f"{run['best_epoch']} of {run['epochs_run']}" + (
        "" if run["stopped_early"] else " (budget)"
    )


def _mean_std(mean: float, std: float, form: str, count: int = 2) -> str:
    # One seed has no spread to show: its value alone, not a misleading "± 0".
    return form.format(mean) + (f" ± {form.format(std).lstrip('+')}" if count > 1 else "")


def _gain_difference(ours: float, reported, spread: float) -> str:
    if reported is None:
        return ""
    in_stds = f"{(ours - reported) / spread:+.1f}" if spread > 0 else "n/a"
    return f"{(ours - reported) * 100:+.1f} ({in_stds})"


def _seeds(runs: list[dict]) -> str:
    return ", ".join(str(run.get("seed")) for run in runs)


def _difference_in_stds(mean: float, std: float, reported) -> str:
    if reported is None:
        return ""
    spread = f"{(mean - reported) / std:+.1f}" if std > 0 else "n/a"
    return f"{(mean - reported) / reported:+.1%} ({spread})"


def _gain(percent) -> str:
    return "n/a" if percent is None else f"{percent:+.1f}%"


def _p(value) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _relative(value, reference) -> str:
    if value is None or reference is None:
        return "n/a"
    return f"{(value - reference) / reference * 100:+.1f}%"


def _value(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _difference(ours: float, reported) -> str:
    return "" if reported is None else f"{(ours - reported) / reported:+.1%}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="runs/ folders of --compare")
    parser.add_argument("--paper", type=Path, required=True, help="the paper's rows (json)")
    parser.add_argument("--metrics", default=DEFAULT_METRICS)
    parser.add_argument("--proposed", help="add its gain over each other model and loss")
    parser.add_argument(
        "--seed_means", action="store_true", help="one row per entry: mean +- std over seeds"
    )
    parser.add_argument("--reference", help="with --seed_means: each entry's gain over it")
    args = parser.parse_args(argv)
    runs = load_runs(args.runs)
    metrics = args.metrics.split(",")
    paper = aligned(json.loads(args.paper.read_text()), metrics, args.paper)
    order = list(paper["rows"])
    runs.sort(key=lambda run: order.index(run["model"]) if run["model"] in order else 99)
    if args.seed_means:
        sys.stdout.write(seed_means(runs, paper, metrics, args.reference) + "\n")
        return 0
    sys.stdout.write(table(runs, paper, metrics) + "\n")
    if args.proposed:
        sys.stdout.write("\n" + gains(runs, paper, metrics, args.proposed) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
