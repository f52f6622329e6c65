"""How much of the papers' tables the stored runs cover, derived from the run files.

    python benchmarks/coverage.py            # print the table
    python benchmarks/coverage.py --write    # put it into benchmarks/results/README.md
    python benchmarks/coverage.py --check    # exit 1 if the README's table is not this one

Every cell of a published table (``properties/reference/<dataset>.yaml``: the papers'
tables and the thesis's, per protocol; "the authors' code here" is not a paper's cell)
is looked up among the run files under ``benchmarks/results/**/runs/``: a run counts for
a cell when it records that dataset, a protocol label whose non-model pieces are the
figure's protocol (``comparable_label``: ``bsarec+sequence_layout=right`` is not
``bsarec``), and that row (``entry_label``: ``BSARec@variant=only-self-attention`` is the
row ``BSARec [only-self-attention]``).  A cell's runs come from one folder, the one that
holds most of its seeds (ties: the first by name), so a mean never mixes two folders' code
and hardware; each seed counts once there.  For each cell: the seeds stored, whether every one was trained with
``--paper`` (the paper's settings for that model and dataset), the loss the runs
record (a paper row trained with another loss is not that row), the mean test NDCG@20
(else the first metric the figure gives) and its difference from the figure.  A run
stored before one of its model's settings existed, where today's default is not what the
code did then (``SETTINGS_BEFORE_THEY_EXISTED``: PolyRec's ``trc_skip``), is named with
the value it was trained with: its ``--paper`` was that of its day.  Each covered cell
also says how its runs were budgeted (stopped early or capped), on which hardware and
with which code (the commits the run files record; older files record none).  The README's table
is this script's output (``tests/test_stored_results.py`` checks it).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "benchmarks" / "results" / "README.md"
START, END = "<!-- coverage:start -->", "<!-- coverage:end -->"
METRIC = "ndcg@20"


def settings_of_its_day(record: dict, root: Path = ROOT) -> list[str]:
    """``key value`` for each setting the run predates whose default has changed since."""
    from recbole_freq.jobs.compare.runs import SETTINGS_BEFORE_THEY_EXISTED

    config = record["summary"].get("config") or {}
    model = record["model"].split("@")[0]
    properties = root / "properties" / "model" / f"{model}.yaml"
    today = yaml.safe_load(properties.read_text(encoding="utf-8")) if properties.is_file() else {}
    return [
        f"{key} {then}"
        for key, then in SETTINGS_BEFORE_THEY_EXISTED.items()
        if key not in config and key in (today or {}) and str(today[key]) != str(then)
    ]


def hardware_of(summary: dict) -> str:
    """The devices a run trained on, each segment's (a run continued on another machine
    has several), with the device's name where the run file records one."""
    segments = [*(summary.get("earlier_segments_environment") or []), summary.get("environment")]
    found = []
    for environment in segments:
        environment = environment if isinstance(environment, dict) else {}
        device = str(environment.get("device") or summary.get("device") or "unrecorded")
        device = "GPU" if device.startswith("cuda") else "CPU" if device == "cpu" else device
        name = environment.get("device_name")
        found.append(f"{device} ({name})" if name else device)
    return " then ".join(dict.fromkeys(found))


def budget_of(summary: dict) -> str:
    """``early stop`` where the run stopped by its patience, else the epochs it ran to."""
    if summary.get("stopped_early"):
        return "early stop"
    return f"capped at {summary.get('epochs_run')} epochs"


def code_of_run(record: dict) -> str:
    """The commits of the run's segments, or ``unrecorded`` (runs from before run files
    recorded their code: the folder README names the commit)."""
    from recbole_freq.jobs.compare.runs import code_label, run_codes

    codes = [code for code in run_codes(record) if code is not None]
    return ", ".join(dict.fromkeys(code_label(code) for code in codes)) or "unrecorded"


@functools.lru_cache(maxsize=4)
def run_files(root: Path = ROOT) -> tuple:
    """``(path, record)`` of every stored run file, read once per process: the coverage
    table, the trust lines and the rows blocks all derive from them (read-only)."""
    return tuple(
        (path, json.loads(path.read_text(encoding="utf-8")))
        for path in sorted((root / "benchmarks" / "results").glob("**/runs/*.json"))
    )


def stored_runs(root: Path = ROOT) -> list[dict]:
    from recbole_freq.jobs.compare.runs import entry_label
    from recbole_freq.jobs.compare.tables import recorded_loss
    from recbole_freq.protocol.pieces import comparable_label

    runs = []
    for path, record in run_files(root):
        summary = record["summary"]
        protocol = summary.get("protocol")
        if not isinstance(protocol, dict):
            continue  # stored before protocols were recorded: no cell can be claimed
        runs.append(
            {
                "dataset": summary.get("dataset"),
                "row": entry_label(record["model"]),
                "seed": record["seed"],
                "protocol": comparable_label(protocol["label"]),
                "paper": bool(record["settings"].get("paper")),
                "then": settings_of_its_day(record, root),
                "hardware": hardware_of(summary),
                "budget": budget_of(summary),
                "code": code_of_run(record),
                "loss": recorded_loss(summary),
                "test": summary["test_result"],
                "folder": path.parent.parent.relative_to(
                    root / "benchmarks" / "results"
                ).as_posix(),
            }
        )
    return runs


def published_cells(root: Path = ROOT) -> list[dict]:
    cells = []
    for path in sorted((root / "properties" / "reference").glob("*.yaml")):
        figures = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for protocol, sources in figures.items():
            for source in sources:
                if not source["name"].startswith(("paper", "thesis")):
                    continue
                for row, values in source["rows"].items():
                    cells.append(
                        {
                            "dataset": path.stem,
                            "protocol": protocol,
                            "table": source["source"],
                            "row": row,
                            "figure": values,
                        }  # fmt: skip
                    )
    return cells


def cell_runs(cell: dict, runs: list[dict]) -> list[dict]:
    """The runs standing for ``cell``: those of the folder holding most of its seeds
    (ties: the first folder by name), one run per seed, so a mean never mixes folders."""
    by_folder: dict[str, dict] = {}
    for run in runs:
        if (run["dataset"], run["row"], run["protocol"]) == (
            cell["dataset"],
            cell["row"],
            cell["protocol"],
        ):
            by_folder.setdefault(run["folder"], {}).setdefault(run["seed"], run)
    if not by_folder:
        return []
    folder = min(by_folder, key=lambda name: (-len(by_folder[name]), name))
    return list(by_folder[folder].values())


def coverage_markdown(root: Path = ROOT) -> str:
    runs = stored_runs(root)
    lines = [
        "| paper table | protocol | row | seeds stored | all --paper | loss | budget | "
        f"hardware | code | {METRIC} ours (mean) | paper | difference | folders |",
        "|---|---|---|---|---|---|---|---|---|---:|---:|---:|---|",
    ]
    covered = 0
    cells = published_cells(root)
    for cell in cells:
        matching = cell_runs(cell, runs)
        metric = METRIC if METRIC in cell["figure"] else next(iter(cell["figure"]))
        figure = cell["figure"][metric]
        if not matching:
            lines.append(
                f"| {cell['table']} | {cell['protocol']} | {cell['row']} | none | | | | | | | "
                f"{figure:.4f} | | |"
            )
            continue
        covered += 1
        values = [run["test"][metric] for run in matching]
        mean = sum(values) / len(values)
        seeds = ", ".join(str(run["seed"]) for run in sorted(matching, key=lambda r: r["seed"]))
        folders = ", ".join(sorted({f"`{run['folder']}`" for run in matching}))
        paper = "yes" if all(run["paper"] for run in matching) else "no"
        then = sorted({item for run in matching for item in run["then"]})
        if then:
            paper += f" (of its day: {', '.join(then)})"
        loss = " / ".join(sorted({run["loss"] for run in matching}))
        budget, hardware, code = (
            " / ".join(sorted({run[key] for run in matching}))
            for key in ("budget", "hardware", "code")
        )
        lines.append(
            f"| {cell['table']} | {cell['protocol']} | {cell['row']} | {len(matching)} ({seeds}) "
            f"| {paper} | {loss} | {budget} | {hardware} | {code} | {mean:.4f} ({metric}) | "
            f"{figure:.4f} | "
            f"{(mean - figure) / figure:+.1%} | {folders} |"
        )
    head = (
        f"{covered} of the {len(cells)} published cells (paper tables and the thesis, per "
        f"dataset, protocol and row) have at least one stored run; generated by "
        f"`python benchmarks/coverage.py --write` from the run files "
        f"(`benchmarks/coverage.py` says what counts)."
    )
    return head + "\n\n" + "\n".join(lines) + "\n"


def authors_log_models(root: Path = ROOT) -> dict[str, list[tuple[str, str]]]:
    """Model -> ``(dataset, protocol)`` of the figures in properties/reference/ from its
    authors' released runs (sources named "authors' log, ..."), which are not paper
    tables."""
    found: dict[str, list[tuple[str, str]]] = {}
    for path in sorted((root / "properties" / "reference").glob("*.yaml")):
        figures = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for protocol, sources in figures.items():
            for source in sources:
                if source["name"].startswith("authors' log"):
                    for row in source["rows"]:
                        found.setdefault(row, []).append((path.stem, protocol))
    return found


def trust_lines(root: Path = ROOT) -> str:
    """ "Should I trust model X?": for each model with a published cell, one line of what
    the stored runs show beside it (dataset, protocol, seeds, loss, difference from the
    figure), or that none is stored; facts from the run files, no verdict."""
    import re

    runs = stored_runs(root)
    by_model: dict[str, list[str]] = {}
    cells = published_cells(root)
    plain = {cell["row"] for cell in cells if " [" not in cell["row"]}
    for cell in cells:
        model = cell["row"].split(" [")[0]
        lines = by_model.setdefault(model, [])
        variant = cell["row"][len(model) :].strip()
        if variant and model in plain:
            continue  # an ablation row of a model with its own row: the table has it
        matching = cell_runs(cell, runs)
        if not matching:
            continue
        metric = METRIC if METRIC in cell["figure"] else next(iter(cell["figure"]))
        mean = sum(r["test"][metric] for r in matching) / len(matching)
        figure = cell["figure"][metric]
        losses = " / ".join(sorted({r["loss"] for r in matching}))
        losses += "".join(sorted({f", {item}" for r in matching for item in r["then"]}))
        paper = re.match(r"[^(,]+", cell["table"]).group().strip()
        table = re.search(r"Tables? [\d-]+", cell["table"])
        lines.append(
            f"{cell['dataset']}{' ' + variant if variant else ''} ({cell['protocol']}, "
            f"{len(matching)} seed{'s' if len(matching) > 1 else ''}, {losses}): {metric} "
            f"{(mean - figure) / figure:+.1%} from {paper}{' ' + table.group() if table else ''}"
            f" (`{matching[0]['folder']}`)"
        )
    from recbole_freq.utils.command import PLUGIN_MODEL_NAMES

    text = []
    logged = authors_log_models(root)
    for model in PLUGIN_MODEL_NAMES:
        if model in by_model:
            continue
        if model in logged:
            beside = []
            for dataset, protocol in logged[model]:
                seeds = {
                    run["seed"]
                    for run in runs
                    if (run["row"], run["dataset"], run["protocol"]) == (model, dataset, protocol)
                }
                beside.append(f"{dataset} ({protocol}): {len(seeds)} seed(s) of ours stored")
            text.append(
                f"- **{model}**: no paper table in properties/reference/, its authors' "
                f"released runs only; {'; '.join(beside)} (`benchmarks/results/README.md`)."
            )
        else:
            text.append(
                f"- **{model}**: no published figure in properties/reference/ to set its runs "
                "beside (its measurements, if any: benchmarks/results/README.md)."
            )
    for model in sorted(by_model):
        found = by_model[model]
        text.append(
            f"- **{model}**: "
            + ("; ".join(found) if found else "no stored run beside a published figure yet")
            + "."
        )
    head = (
        "What the stored runs show beside each model's published figures (generated from "
        "the run files by `python benchmarks/coverage.py --write`; the loss is the runs', "
        "which may not be the paper row's: `benchmarks/results/README.md`, coverage table):"
    )
    return head + "\n\n" + "\n".join(text) + "\n"


ROWS_START, ROWS_END = "<!-- rows:start -->", "<!-- rows:end -->"
ROWS_HEADING = "## How each row here was trained (generated from its run files)"


def _same_setting(ran, wanted) -> bool:
    """Whether a recorded setting is the paper file's (``1e-12`` read as text by one yaml
    reader and as a number by another is the same setting)."""
    try:
        return math.isclose(float(ran), float(wanted), rel_tol=1e-9)
    except (TypeError, ValueError):
        return json.dumps(ran, sort_keys=True, default=str) == json.dumps(
            wanted, sort_keys=True, default=str
        )


def todays_paper_settings(record: dict) -> tuple[dict | None, str]:
    """The settings today's ``--paper`` gives the run's row under the run's protocol, and
    the file they come from: its model's paper file for that dataset when that file names
    the run's protocol, else the paper file of a denoiser whose backbone the model is (SASRec
    beside RecDenoiser shares RecDenoiser's settings but its own); a named variant's file
    on top.  ``(None, why)`` when no paper file names that dataset and protocol."""
    from recbole_freq.config.configurator import (
        DENOISER_ONLY_SETTINGS,
        paper_file,
        read_config_file,
        variant_file,
    )
    from recbole_freq.jobs.compare.runs import entry_model_name, split_entry

    summary = record["summary"]
    model, dataset = entry_model_name(record["model"]), summary.get("dataset")
    protocol = summary["protocol"].get("protocol")
    candidates = [(model, False)] + [(denoiser, True) for denoiser in denoisers_of(model)]
    for owner, as_backbone in candidates:
        path = paper_file(owner, dataset)
        settings = read_config_file(path) if path else {}
        if path is None or settings.get("protocol") != protocol:
            continue
        if as_backbone:
            settings = {k: v for k, v in settings.items() if k not in DENOISER_ONLY_SETTINGS}
        source = path.relative_to(ROOT).as_posix() + (
            f" ({owner}'s backbone)" if as_backbone else ""
        )
        _, variant = split_entry(record["model"])
        piece, _, name = (variant or "").partition("=")
        if piece == "variant":
            settings = {**settings, **read_config_file(variant_file(model, name))}
            source += f" + variant {name}"
        return settings, source
    return None, f"no paper file names {dataset} under protocol {protocol}"


# Settings of a paper file that do not make a run another row: the protocol (compared by
# its label's pieces instead) and deterministic kernels (the same model and training,
# older run files do not record it).
NOT_THE_ROWS_SETTINGS = ("protocol", "deterministic")


def denoisers_of(backbone: str) -> list[str]:
    """The plugin's denoisers whose ``default_backbone`` is ``backbone``: a denoiser's
    paper row sets its backbone's row beside it (``jobs.compare._paper_models``)."""
    from recbole_freq.model import MODELS
    from recbole_freq.model.sequential_recommender.recdenoiser import DenoisingRecommender

    return [
        name
        for name, klass in MODELS.items()
        if issubclass(klass, DenoisingRecommender) and klass.default_backbone == backbone
    ]


def paper_deviations(record: dict) -> list[str] | None:
    """What the run did otherwise than today's ``--paper`` file for its row: its protocol's
    pieces beyond the paper's protocol (left or right padding, training rows), each setting
    of the file it ran with another value (the loss, sizes, patience; a setting the run
    predates is read as what the code then did), and an epoch cap that ended it before its
    patience could; ``None`` when no paper file names its dataset and protocol."""
    return deviations_from(record, todays_paper_settings(record)[0])


def deviations_from(record: dict, settings: dict | None) -> list[str] | None:
    """``paper_deviations`` against paper settings already read."""
    from recbole_freq.jobs.compare.runs import SETTINGS_BEFORE_THEY_EXISTED
    from recbole_freq.jobs.compare.tables import capped_by_epochs
    from recbole_freq.protocol.pieces import comparable_label

    if settings is None:
        return None
    summary = record["summary"]
    config = summary.get("config") or {}
    found = []
    label = comparable_label(summary["protocol"]["label"])
    if label != settings["protocol"]:
        found.append(f"protocol {label} (paper {settings['protocol']})")
    pieces = summary["protocol"]
    for key, wanted in settings.items():
        if key in NOT_THE_ROWS_SETTINGS:
            continue
        # A protocol piece's value in force is the protocol record's (the config may hold
        # None where the protocol supplied it).
        source = pieces if key in pieces else config
        ran = source.get(key, SETTINGS_BEFORE_THEY_EXISTED.get(key, "unrecorded"))
        if not _same_setting(ran, wanted):
            found.append(f"{key} {ran} (paper {wanted})")
    if capped_by_epochs(summary):
        found.append(f"capped at {summary['epochs_run']} epochs, before its patience ended it")
    return found


def _budget_with_epochs(summary: dict) -> str:
    if summary.get("learns_by_gradient") is False:
        return "none (counted once from the training rows)"
    best = summary.get("best_epoch")
    return f"{budget_of(summary)}, best epoch {best} of {summary.get('epochs_run')}"


def row_records(root: Path = ROOT) -> list[dict]:
    """Every stored run grouped by its folder, row, dataset and protocol, with what decides
    whether it is the paper's row (``paper_deviations``) and where and how it ran."""
    from recbole_freq.jobs.compare.tables import recorded_loss

    groups: dict[tuple, dict] = {}
    for path, record in run_files(root):
        summary = record["summary"]
        protocol = summary.get("protocol") if isinstance(summary.get("protocol"), dict) else None
        folder = path.parent.parent.relative_to(root / "benchmarks" / "results").as_posix()
        key = (folder, record["model"], summary.get("dataset"), (protocol or {}).get("label"))
        group = groups.setdefault(
            key,
            {
                "folder": folder,
                "entry": record["model"],
                "dataset": key[2],
                "protocol": key[3] or "unrecorded",
                "seeds": [],
            },  # fmt: skip
        )
        if protocol is None:
            verdict, source = "cannot tell: its run file records no protocol", ""
        else:
            settings, source = todays_paper_settings(record)
            deviations = deviations_from(record, settings)
            verdict = (
                "no published row: " + source
                if deviations is None
                else "yes"
                if not deviations
                else "no: " + "; ".join(deviations)
            )
        group["seeds"].append(
            {
                "seed": record["seed"],
                "verdict": verdict,
                "source": source if verdict == "yes" or verdict.startswith("no:") else "",
                "loss": recorded_loss(summary),
                "budget": _budget_with_epochs(summary),
                "hardware": hardware_of(summary),
                "code": code_of_run(record),
            }
        )
    return list(groups.values())


def _joined(seeds: list[dict], key: str) -> str:
    values = list(dict.fromkeys(seed[key] for seed in seeds))
    if len(values) == 1:
        return values[0]
    return "; ".join(f"seed {seed['seed']}: {seed[key]}" for seed in seeds)


def rows_markdown(groups: list[dict], with_folder: bool) -> str:
    """One line per stored row: seeds, whether it was trained as today's ``--paper`` file
    trains that paper row (and if not, how it differs), loss, budget, hardware, code."""
    head = "| folder " if with_folder else ""
    lines = [
        f"{head}| row | dataset | protocol | seeds | as the paper's row (today's --paper file) "
        "| loss | budget | hardware | code |",
        ("|---" if with_folder else "") + "|---|---|---|---|---|---|---|---|---|",
    ]
    for group in sorted(groups, key=lambda g: (g["folder"], g["dataset"] or "", g["entry"])):
        seeds = sorted(group["seeds"], key=lambda s: s["seed"])
        verdict = _joined(seeds, "verdict")
        sources = {s["source"] for s in seeds if s["source"]}
        if sources:
            verdict += " (" + ", ".join(f"`{s}`" for s in sorted(sources)) + ")"
        cells = [
            f"`{group['folder']}`" if with_folder else None,
            group["entry"],
            group["dataset"],
            group["protocol"],
            ", ".join(str(s["seed"]) for s in seeds),
            verdict,
            _joined(seeds, "loss"),
            _joined(seeds, "budget"),
            _joined(seeds, "hardware"),
            _joined(seeds, "code"),
        ]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells if c is not None) + " |")
    return "\n".join(lines) + "\n"


def readme_of(folder: str, root: Path = ROOT) -> Path:
    """The README that describes a results folder: its own, else the nearest one above it
    (the index for a folder without one)."""
    results = root / "benchmarks" / "results"
    here = results / folder
    while here != results and not (here / "README.md").is_file():
        here = here.parent
    return here / "README.md"


def folder_row_blocks(root: Path = ROOT) -> dict[Path, str]:
    """README -> its generated rows block: each folder README the rows it describes, the
    index every stored row (``rows_markdown``)."""
    groups = row_records(root)
    index = root / "benchmarks" / "results" / "README.md"
    by_readme: dict[Path, list[dict]] = {}
    for group in groups:
        readme = readme_of(group["folder"], root)
        if readme != index:
            by_readme.setdefault(readme, []).append(group)
    blocks = {
        readme: (
            "Generated by `python benchmarks/coverage.py --write` from the run files below "
            "this folder (`benchmarks/coverage.py`, `paper_deviations`, says what is compared):\n\n"
            + rows_markdown(found, with_folder=True)
        )
        for readme, found in by_readme.items()
    }
    blocks[index] = (
        "Every stored run, grouped by folder and row; generated by `python "
        'benchmarks/coverage.py --write`. "As the paper\'s row" compares what each run '
        "recorded with today's `--paper` file for its model, dataset and protocol (a row "
        "without one has no published row to be): protocol pieces, every setting of the "
        "file, and an epoch cap that ended it early. Hardware is each run segment's device; "
        "code the commit its run file records (older files record none; their folder README "
        "names the commit).\n\n" + rows_markdown(groups, with_folder=True)
    )
    return blocks


TRUST_FILES = (ROOT / "docs" / "models.md",)
TRUST_START, TRUST_END = "<!-- trust:start -->", "<!-- trust:end -->"


def readme_block(text: str, start: str = START, end: str = END) -> str | None:
    if start not in text or end not in text:
        return None
    return text.split(start, 1)[1].split(end, 1)[0].strip("\n") + "\n"


def replaced_block(text: str, block: str, start: str, end: str) -> str:
    before, rest = text.split(start, 1)
    return f"{before}{start}\n{block}{end}{rest.split(end, 1)[1]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="write it into the results README")
    action.add_argument("--check", action="store_true", help="exit 1 if the README differs")
    args = parser.parse_args(argv)
    from recbole_freq.utils.files import write_atomic

    blocks = [(README, coverage_markdown(), START, END)]
    blocks += [(path, trust_lines(), TRUST_START, TRUST_END) for path in TRUST_FILES]
    blocks += [
        (path, block, ROWS_START, ROWS_END) for path, block in sorted(folder_row_blocks().items())
    ]
    if not (args.write or args.check):
        for _, block, _, _ in blocks:
            print(block)
        return 0
    for path, block, start, end in blocks:
        text = path.read_text(encoding="utf-8")
        if args.write and start == ROWS_START and readme_block(text, start, end) is None:
            text = f"{text.rstrip()}\n\n{ROWS_HEADING}\n\n{start}\n{end}\n"
        if readme_block(text, start, end) is None:
            print(f"{path} has no {start} ... {end} block", file=sys.stderr)
            return 2
        if args.check and readme_block(text, start, end) != block:
            print(f"{path}: its generated block is not what the run files give; run "
                  "python benchmarks/coverage.py --write", file=sys.stderr)  # fmt: skip
            return 1
        if args.write:
            write_atomic(path, replaced_block(text, block, start, end))
    return 0


if __name__ == "__main__":
    sys.exit(main())
