"""Side-by-side comparison of several models over several seeds (``--compare``).

Every model is trained by :func:`recbole_freq.quick_start.run`, i.e. on the same prepared
split and evaluation protocol (``properties/overall.yaml``), each with its own property
file, once per seed.  The results are summarised as in the papers' main tables (BSARec
Table 2, FMLP-Rec Table 2, Rec-Denoiser Table 2): mean ± std over seeds per metric, the
relative improvement of each proposed model over the best baseline per metric (the
"Improv." row), a paired t-test across seeds against that baseline, and the training time
per epoch and parameter count (BSARec Table 4, FMLP-Rec Table 8)::

    python run_recbole_freq.py --compare BSARec,SASRec,BERT4Rec,FEARec \\
        --dataset=amazon-beauty --seeds 2024,2025,2026 --epochs=200

Each finished run is stored at once as ``<out>/runs/<model>-seed<seed>.json``; a repeated
command skips the runs already stored (so an interrupted comparison resumes), provided they
were made with the same dataset, config files and overrides.  Outputs:
``<out>/comparison.csv``, ``<out>/comparison.md``, ``<out>/comparison.png`` and
``<out>/runs.csv`` (one row per run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from recbole_freq.jobs.compare.runs import (
    RESERVED_OVERRIDES,
    ComparisonError,
    check_out_dir,
    entry_name,
    load_run,
    lock_out_dir,
    run_file,
    run_on_ray,
    run_protocol_label,
    run_sequential,
    run_settings,
    split_entry,
    stored_label_differences,
    validate,
)
from recbole_freq.jobs.compare.statistics import CORRECTIONS, add_per_user_tests, paired_p_value
from recbole_freq.jobs.compare.tables import (
    builtin_settings_note,
    choose_metrics,
    csv_text,
    improvement,
    markdown_table,
    protocol_note,
    protocol_side_by_side,
    published_figures,
    published_section,
    runs_csv_text,
    save_plot,
    summarise,
)
from recbole_freq.model import BASELINES, MODELS
from recbole_freq.protocol import comparable_label, protocol_file
from recbole_freq.quick_start.distributed import data_parallel_settings
from recbole_freq.utils.command import DEFAULT_SEEDS, invoked_command
from recbole_freq.utils.files import check_writable, write_atomic

# ---------------------------------------------------------------------------- API


def _paper_models(
    models, dataset, overrides: dict, protocols, mixed: bool = False
) -> tuple[list[str], dict]:
    """The models with paper settings for ``dataset``, and the settings of the others that
    are a denoiser's backbone (SASRec beside RecDenoiser, BERT4Rec beside BERT4RecDenoiser:
    ``config.paper_reference_settings``, so each pair differs only in the denoiser); sets
    ``overrides["protocol"]`` to the protocol the paper files name when none is given.
    Paper files that name different protocols need one given, or ``mixed`` (each model
    then runs under its own paper file's protocol, and each row names it)."""
    from recbole_freq.config.configurator import (
        get_model_class,
        paper_file,
        paper_reference_settings,
        read_config_file,
    )

    classes = {m: get_model_class(split_entry(m)[0]) for m in models}
    files = {m: paper_file(classes[m].__name__, dataset) for m in models}
    # A denoiser's backbone beside it is the denoiser's reference: it shares the
    # denoiser's paper settings even where it has a paper file of its own (SASRec's
    # BSARec Table 2 settings), so that the pair differs only in the denoiser.
    from recbole_freq.model.sequential_recommender.recdenoiser import DenoisingRecommender

    references = {}
    for model in models:
        for denoiser in models:
            denoiser_class = classes[denoiser]
            backbone = (
                denoiser_class.default_backbone
                if issubclass(denoiser_class, DenoisingRecommender)
                else None
            )
            if files[denoiser] is not None and backbone == classes[model].__name__:
                references[model] = paper_reference_settings(classes[denoiser].__name__, dataset)
                break
    paper_models = [m for m, path in files.items() if path is not None and m not in references]
    if not paper_models:
        raise ComparisonError(
            f"--paper: none of {', '.join(models)} has paper settings for {dataset!r} "
            "(properties/paper/<model>/<dataset>.yaml)"
        )
    named = {read_config_file(files[m]).get("protocol") for m in paper_models} - {None}
    if "protocol" not in overrides and protocols is None and named:
        if len(named) == 1:
            overrides["protocol"] = named.pop()
        elif not mixed:
            raise ComparisonError(
                f"--paper: the paper files name different protocols ({', '.join(sorted(named))}); "
                "choose one with --protocol, or add --mixed_protocols to run each model under "
                "its own paper file's protocol in one table"
            )
    return paper_models, references


def check_protocols(records: dict, entries, seeds, mixed: bool) -> dict:
    """Each entry's protocol label; ``ComparisonError`` when the entries of one table were
    made under different protocols, unless ``mixed`` (then each row names its own).
    Labels that differ only in model pieces (a model's own ``train_loss``) are one
    protocol."""
    labels = {}
    for entry in entries:
        found = {run_protocol_label(records[(entry, seed)]) for seed in seeds}
        labels[entry] = " / ".join(sorted(found))
    if len({comparable_label(label) for label in labels.values()}) > 1 and not mixed:
        listing = "; ".join(f"{split_entry(e)[0]}: {label}" for e, label in labels.items())
        raise ComparisonError(
            f"these runs were made under different protocols ({listing}), so their numbers "
            "are not comparable; rerun them under one protocol, use --protocols to show each "
            "model under several side by side, or pass --mixed_protocols to table them anyway"
        )
    return labels


def loss_variant_gains(records, group, baselines, seeds, metrics, correction) -> str:
    """Where one baseline model is in the table with several losses (``SASRec`` and
    ``SASRec@train_loss=model``), each proposed model's gain over each of them, labelled
    with that loss, with the same tests as the Improv. rows (paired t across seeds, paired
    t and Wilcoxon across users); empty otherwise."""
    names = [split_entry(entry)[0] for entry in group if entry in baselines]
    repeated = {name for name in names if names.count(name) > 1}
    if not repeated:
        return ""
    lines = ["| gain | over | " + " | ".join(metrics) + " |", "|" + "---|" * (len(metrics) + 2)]
    for proposed in (entry for entry in group if entry not in baselines):
        for baseline in group:
            if baseline not in baselines or split_entry(baseline)[0] not in repeated:
                continue
            rows = summarise(records, [baseline, proposed], seeds, metrics, {baseline})
            add_per_user_tests(rows, records, seeds, metrics, correction)
            row, over = rows[1], f"{split_entry(baseline)[0]}, {rows[0]['loss']}"
            for key, name in (
                ("improv_pct", f"Improv. {split_entry(proposed)[0]}"),
                ("p_value", "p (paired t)"),
                ("p_t_users", f"p (paired t, users, {correction})"),
                ("p_wilcoxon_users", f"p (Wilcoxon, users, {correction})"),
            ):
                cells = [row.get(f"{metric}_{key}") for metric in metrics]
                shown = [
                    "n/a" if v is None else (f"{v:+.2f}%" if key == "improv_pct" else f"{v:.3g}")
                    for v in cells
                ]
                lines.append(f"| {name} | {over} | " + " | ".join(shown) + " |")
    note = (
        "Gain over each loss of the same baseline (the table's Improv. rows compare with "
        "the best baseline per metric; the per-user tests here are corrected within each "
        "pair):"
    )
    return "\n" + note + "\n\n" + "\n".join(lines) + "\n"


def check_loss_variant(entry: str, protocols) -> None:
    """``Model@train_loss=<choice>``: the model once more with another loss (e.g. beside
    ``--paper``'s SASRec with BCE, ``SASRec@train_loss=model`` with its own CE), each row
    of the table naming its loss; ``ComparisonError`` for another piece, an unknown
    choice, or with ``--protocols`` (whose entries are ``Model@protocol``)."""
    from recbole_freq.protocol.pieces import MODEL_PIECES, PIECES

    variant = split_entry(entry)[1]
    if variant is None or "=" not in variant:
        return
    piece, _, value = variant.partition("=")
    if piece not in MODEL_PIECES or value not in PIECES[piece]:
        choices = ", ".join(
            f"{piece}={choice}" for piece in MODEL_PIECES for choice in PIECES[piece]
        )
        raise ComparisonError(
            f"--compare entry {entry!r}: after '@' name a protocol or one of {choices}"
        )
    if protocols is not None:
        raise ComparisonError(
            f"--compare entry {entry!r}: a loss variant and --protocols do not combine; "
            "compare the losses under one protocol"
        )


def _parse_list(value, name) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value)
    items = [str(item).strip() for item in items if str(item).strip()]
    if not items:
        raise ComparisonError(f"{name} is empty")
    if len(set(items)) != len(items):
        raise ComparisonError(f"{name} lists an entry twice: {', '.join(items)}")
    return items


def _parse_seeds(seeds) -> list[int]:
    values = []
    for item in _parse_list(seeds, "--seeds"):
        try:
            values.append(int(item))
        except ValueError as error:
            raise ComparisonError(
                f"seed {item!r} is not an integer (--seeds 2024,2025,2026)"
            ) from error
    return values


@dataclass
class Comparison:
    """A comparison's settings, checked (``compare``'s parameters) and what follows from
    them before anything is trained: the entries (a model under each protocol), the paper
    settings, the validated configurations and expected protocol labels, the metrics."""

    models: list[str]
    dataset: str
    seeds: list[int]
    config_files: list
    overrides: dict
    out: Path
    baselines: list[str]
    protocols: list[str] | None
    mixed_protocols: bool
    paper: bool
    correction: str
    use_ray: bool  # False: trained one after the other in this process
    ray_options: dict
    log: Callable
    paper_models: list[str] = field(default_factory=list)
    references: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    configs: dict = field(default_factory=dict)
    expected_labels: dict = field(default_factory=dict)
    metrics: list[str] = field(default_factory=list)

    @property
    def entries(self) -> list[str]:
        return [entry_name(m, p) for m in self.models for p in (self.protocols or [None])]

    @property
    def ordered(self) -> list[str]:
        """Baselines first, as in the papers' tables; given order within each group."""
        models, baselines = self.models, self.baselines
        return [m for m in models if m in baselines] + [m for m in models if m not in baselines]


def compare(
    models,
    dataset: str,
    seeds=DEFAULT_SEEDS,
    config_files=None,
    overrides: dict | None = None,
    out=None,
    baselines=None,
    metrics=None,
    use_ray: bool = False,
    protocols=None,
    mixed_protocols: bool = False,
    paper: bool = False,
    correction: str = "holm",
    cpus_per_run: float = 1.0,
    gpus_per_run: float = 0.0,
    ray_address: str | None = None,
    log=print,
) -> dict:
    """Train ``models`` x ``seeds`` on ``dataset`` (skipping runs already stored in ``out``)
    and write the comparison tables and plot.

    ``baselines``: the models the "Improv." row compares against; by default the RecBole
    built-ins among ``models`` (the others, i.e. plugin models, are "proposed").
    ``protocols``: train and test every model under each of these protocols (one table
    per protocol, and a side-by-side table of each model under all of them).  Without it
    every run uses the configured protocol.  Runs of different protocols are never put
    into one table (``ComparisonError``) unless ``mixed_protocols``.
    ``paper``: each model that has paper settings for ``dataset`` (``properties/paper/``)
    gets them, as ``--paper`` does for one run; a denoiser's backbone beside it (SASRec
    beside RecDenoiser) gets the same settings but the denoiser's own; the others keep
    their defaults.  Unless a protocol is given, every model runs under the protocol those
    paper files name.
    ``correction``: ``holm`` or ``bh``, for the per-user significance tests (paired
    Wilcoxon and t across users against the best baseline, ``statistics.add_per_user_tests``)
    beside the across-seed paired t-test.
    Returns ``rows`` (one dict per model, as in ``comparison.csv``), ``markdown``,
    ``files``, and the ``trained`` and ``skipped`` (model, seed) pairs.

    The steps: check the request (``checked_request``), validate every configuration
    (``plan``), train what is not stored (``train_missing``), table the runs
    (``tabulate``) and write the files (``write_comparison``).
    """
    ray_options = dict(address=ray_address, cpus_per_run=cpus_per_run, gpus_per_run=gpus_per_run)
    comparison = checked_request(
        Comparison(
            models, dataset, seeds, config_files, overrides, out, baselines, protocols,
            mixed_protocols, paper, correction, use_ray, ray_options, log,
        ),
        metrics,
    )  # fmt: skip
    plan(comparison, metrics)
    out = comparison.out
    check_writable(out, "--out")
    lock = lock_out_dir(out)  # two comparisons into one folder would mix their runs
    try:
        check_out_dir(out, comparison.settings)
        trained, skipped = train_missing(comparison)
        records = {
            (e, s): load_run(run_file(out, e, s))
            for e in comparison.entries
            for s in comparison.seeds
        }
        rows, plot_rows, markdown = tabulate(comparison, records)
        files = write_comparison(comparison, records, rows, plot_rows, markdown)
        return {
            "rows": rows,
            "markdown": markdown,
            "files": files,
            "trained": trained,
            "skipped": skipped,
            "metrics": comparison.metrics,
            "baselines": [m for m in comparison.ordered if m in comparison.baselines],
        }
    finally:
        lock.release()


def checked_request(comparison: Comparison, metrics) -> Comparison:
    """``comparison`` with its lists parsed and each part checked, in the order a user
    would fix them; ``ComparisonError`` (or the model and protocol errors) names the
    first problem."""
    from recbole_freq.config.configurator import get_model_class

    if comparison.correction not in CORRECTIONS:
        raise ComparisonError(f"--correction {comparison.correction!r}: choose holm or bh")
    models = comparison.models = _parse_list(comparison.models, "--compare")
    comparison.seeds = _parse_seeds(comparison.seeds)
    overrides = comparison.overrides = dict(comparison.overrides or {})
    if comparison.protocols is not None:
        comparison.protocols = _parse_list(comparison.protocols, "--protocols")
        if "protocol" in overrides:
            raise ComparisonError(
                "give the protocol once: --protocols for several, or --protocol for one"
            )
        for protocol in comparison.protocols:
            protocol_file(protocol)  # ProtocolError names the protocols
    reserved = [key for key in RESERVED_OVERRIDES if key in overrides]
    if reserved:
        raise ComparisonError(
            f"--{reserved[0]} cannot be an override of a comparison: give models with "
            "--compare, the dataset with --dataset and seeds with --seeds"
        )
    for model in models:
        get_model_class(split_entry(model)[0])  # UnknownModelError names the known models
        check_loss_variant(model, comparison.protocols)
    if comparison.baselines is None:
        names = {model: split_entry(model)[0] for model in models}
        comparison.baselines = [
            m for m in models if names[m] not in MODELS or names[m] in BASELINES
        ]
    else:
        comparison.baselines = _parse_list(comparison.baselines, "--baselines")
        unknown = [model for model in comparison.baselines if model not in models]
        if unknown:
            raise ComparisonError(
                f"baseline(s) {', '.join(unknown)} are not among the compared models "
                f"({', '.join(models)})"
            )
    ray = comparison.ray_options
    if not comparison.use_ray and (
        ray["cpus_per_run"] != 1.0 or ray["gpus_per_run"] != 0.0 or ray["address"]
    ):
        raise ComparisonError("--cpus_per_run, --gpus_per_run and --ray_address need --ray")
    if ray["cpus_per_run"] <= 0 or ray["gpus_per_run"] < 0:
        raise ComparisonError("--cpus_per_run must be > 0 and --gpus_per_run >= 0")
    if comparison.out is None:
        comparison.out = Path("comparisons") / comparison.dataset
    comparison.out = Path(comparison.out)
    comparison.config_files = list(comparison.config_files or [])
    return comparison


def plan(comparison: Comparison, metrics) -> None:
    """The paper settings, the run settings stored with the runs, every configuration
    validated (``runs.validate``) and the metrics of the tables."""
    c = comparison
    if c.paper:
        c.paper_models, c.references = _paper_models(
            c.models, c.dataset, c.overrides, c.protocols, c.mixed_protocols
        )
    c.settings = run_settings(c.dataset, c.config_files, c.overrides)
    if c.protocols is not None:
        c.settings["protocols"] = c.protocols
    if c.paper:
        c.settings["paper"] = True
    if c.references:
        c.settings["paper_references"] = c.references
        for model in c.references:
            c.log(f"--paper: {model} gets the backbone settings of its denoiser's paper file")
    c.configs, c.expected_labels = validate(
        c.models, c.dataset, c.config_files, c.overrides, c.seeds, c.protocols or [None],
        c.paper_models, c.references,
    )  # fmt: skip
    config = next(iter(c.configs.values()))
    parallel = data_parallel_settings(config)
    if c.use_ray and parallel is not None:
        raise ComparisonError(
            "--ray runs the comparison's trainings side by side, one process each; nproc "
            "and world_size (data-parallel training) work without --ray"
        )
    if parallel is not None and parallel["world_size"] > parallel["nproc"]:
        raise ComparisonError(
            f"world_size={parallel['world_size']} spans machines; a comparison trains on "
            "this machine's processes (nproc alone): train each model with "
            f"{invoked_command()} on every machine instead"
        )
    c.metrics = choose_metrics(
        None if metrics is None else _parse_list(metrics, "--metrics"), config
    )


def train_missing(comparison: Comparison) -> tuple[list, list]:
    """Train the (entry, seed) runs not yet stored in the output folder; returns the
    ``trained`` and the ``skipped`` ones.  An interrupt says what is kept."""
    c, out = comparison, comparison.out
    entries, seeds = c.entries, c.seeds
    for line in stored_label_differences(out, entries, seeds, c.expected_labels):
        c.log(f"note: {line}")
    jobs = [(e, s) for e in entries for s in seeds if not run_file(out, e, s).is_file()]
    skipped = [(e, s) for e in entries for s in seeds if (e, s) not in jobs]
    if skipped:
        c.log(f"{len(skipped)} run(s) already stored in {out / 'runs'}: skipped")
    try:
        if jobs and c.use_ray:
            trained = run_on_ray(
                jobs, c.dataset, c.config_files, c.overrides, out, c.settings, c.log,
                c.ray_options, c.models, c.paper_models, c.references,
            )  # fmt: skip
        elif jobs:
            trained = run_sequential(
                jobs, c.dataset, c.config_files, c.overrides, out, c.settings, c.log,
                tuple(c.models), c.paper_models, c.references,
            )  # fmt: skip
        else:
            trained = []
    except KeyboardInterrupt as interrupt:
        from recbole_freq.utils.signals import RunInterrupted

        stored = sum(run_file(out, e, s).is_file() for e in entries for s in seeds)
        partial = sorted((out / "partial").glob("*.resume.pth"))
        kept = f"{stored} of {len(entries) * len(seeds)} runs are stored in {out / 'runs'}"
        if partial:
            kept += f"; the unfinished run keeps its completed epochs in {partial[0]}"
        raise RunInterrupted(kept) from interrupt
    return trained, skipped


def tabulate(comparison: Comparison, records: dict) -> tuple[list, list, str]:
    """``(rows, plot_rows, markdown)``: one table per protocol (with the loss variants'
    gains and the published figures beside it), and with several protocols a
    side-by-side table first."""
    c = comparison
    rows, plot_rows, sections = [], [], []
    for protocol in c.protocols or [None]:
        group = [entry_name(m, protocol) for m in c.ordered]
        baselines = {entry_name(m, protocol) for m in c.baselines}
        labels = check_protocols(records, group, c.seeds, c.mixed_protocols)
        group_rows = summarise(records, group, c.seeds, c.metrics, baselines)
        add_per_user_tests(group_rows, records, c.seeds, c.metrics, c.correction)
        per_loss = loss_variant_gains(records, group, baselines, c.seeds, c.metrics, c.correction)
        for row in group_rows:
            plot_rows.append(dict(row))  # named by entry: a model under each protocol
            row["protocol"] = labels[row["model"]]
            row["model"] = split_entry(row["model"])[0]
        rows += group_rows
        note = protocol_note(c.configs[protocol], sorted(set(labels.values())))
        note += builtin_settings_note(records, group, c.seeds)
        figures = published_figures(c.dataset, labels.values())
        sections.append(
            markdown_table(group_rows, c.metrics, c.dataset, c.seeds, note, c.correction)
            + per_loss
            + published_section(group_rows, c.metrics, figures, c.seeds)
        )
    if c.protocols:
        sections = [
            f"## Protocol {protocol}\n\n{section}"
            for protocol, section in zip(c.protocols, sections)
        ]
        sections.insert(0, protocol_side_by_side(rows, c.metrics, c.seeds, c.protocols))
    return rows, plot_rows, "\n".join(sections)


def write_comparison(comparison: Comparison, records, rows, plot_rows, markdown) -> dict:
    """The comparison's files, each whole or not at all."""
    out, c = comparison.out, comparison
    files = {
        "csv": out / "comparison.csv",
        "markdown": out / "comparison.md",
        "plot": out / "comparison.png",
        "runs_csv": out / "runs.csv",
    }
    write_atomic(files["csv"], csv_text(rows))
    write_atomic(files["markdown"], markdown)
    entries_in_order = [row["model"] for row in plot_rows]
    write_atomic(files["runs_csv"], runs_csv_text(records, entries_in_order, c.seeds, c.metrics))
    save_plot(files["plot"], plot_rows, c.metrics, c.dataset, c.seeds)
    return files


__all__ = [
    "DEFAULT_SEEDS",
    "RESERVED_OVERRIDES",
    "ComparisonError",
    "compare",
    "csv_text",
    "improvement",
    "markdown_table",
    "paired_p_value",
    "run_settings",
    "runs_csv_text",
    "save_plot",
    "summarise",
]
