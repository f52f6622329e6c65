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

from recbole_freq.jobs.compare.execution import (
    Execution,
    Outcome,
    RunJob,
    run_on_ray,
    run_packed,
    run_sequential,
)
from recbole_freq.jobs.compare.grid import grid_csv_text, grid_markdown
from recbole_freq.jobs.compare.runs import (
    RESERVED_OVERRIDES,
    ComparisonError,
    check_code,
    check_out_dir,
    check_output_entries,
    check_stored_settings,
    code_note,
    code_of,
    entry_label,
    entry_name,
    load_run,
    lock_out_dir,
    run_file,
    run_protocol_label,
    run_settings,
    split_entry,
    stored_label_differences,
    validate,
)
from recbole_freq.jobs.compare.statistics import CORRECTIONS, add_per_user_tests, paired_p_value
from recbole_freq.jobs.compare.tables import (
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
from recbole_freq.jobs.compare.unfinished import (
    unfinished_csv,
    unfinished_markdown,
    unfinished_rows,
)
from recbole_freq.model import BASELINES, MODELS
from recbole_freq.protocol import comparable_label, protocol_file
from recbole_freq.quick_start.distributed import data_parallel_settings
from recbole_freq.utils.command import DEFAULT_SEEDS, invoked_command
from recbole_freq.utils.files import check_writable, write_atomic
from recbole_freq.utils.reproducibility import code_identity

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
    # A named variant is another row, not another loss of the same model.
    names = [entry_label(entry) for entry in group if entry in baselines]
    repeated = {name for name in names if names.count(name) > 1}
    if not repeated or all(entry in baselines for entry in group):
        return ""
    lines = ["| gain | over | " + " | ".join(metrics) + " |", "|" + "---|" * (len(metrics) + 2)]
    for proposed in (entry for entry in group if entry not in baselines):
        for baseline in group:
            if baseline not in baselines or entry_label(baseline) not in repeated:
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
    of the table naming its loss; ``Model@variant=<name>``: a named row of a paper's
    table (``properties/variant/<Model>/``), the table naming it ``Model [name]``.
    ``ComparisonError`` for another piece, an unknown choice or variant, or a loss
    variant with ``--protocols`` (whose entries are ``Model@protocol``)."""
    from recbole_freq.config.configurator import variant_file
    from recbole_freq.protocol.pieces import MODEL_PIECES, PIECES

    model, variant = split_entry(entry)
    if variant is None or "=" not in variant:
        return
    piece, _, value = variant.partition("=")
    if piece == "config":
        from recbole_freq.config.configurator import check_name_component
        from recbole_freq.utils.property_files import find_config_file

        try:
            check_name_component(value, "a --compare entry's config file")
            find_config_file(value)
        except (ValueError, FileNotFoundError) as error:
            raise ComparisonError(
                f"--compare entry {entry!r}: {error} (name a yaml file of the current folder)"
            ) from None
        return
    if piece == "variant":
        try:
            variant_file(model, value)
        except ValueError as error:
            raise ComparisonError(f"--compare entry {entry!r}: {error}") from None
        return
    if piece not in MODEL_PIECES or value not in PIECES[piece]:
        choices = ", ".join(
            f"{piece}={choice}" for piece in MODEL_PIECES for choice in PIECES[piece]
        )
        raise ComparisonError(
            f"--compare entry {entry!r}: after '@' name a protocol, variant=<name>, "
            f"config=<file.yaml> or one of {choices}"
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
    execution: Execution
    log: Callable
    mixed_code: bool = False
    paper_models: list[str] = field(default_factory=list)
    references: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    configs: dict = field(default_factory=dict)
    expected_labels: dict = field(default_factory=dict)
    effective_settings: dict = field(default_factory=dict)
    metrics: list[str] = field(default_factory=list)
    dataset_sha256: str | None = None  # the prepared data's fingerprint

    @property
    def jobs(self) -> list[RunJob]:
        """Every run of this comparison, stored or not."""
        return [
            RunJob(
                self.dataset,
                entry,
                seed,
                self.out,
                self.settings,
                tuple(self.config_files),
                self.overrides,
                tuple(self.models),
                tuple(self.paper_models),
                self.references,
            )  # fmt: skip
            for entry in self.entries
            for seed in self.seeds
        ]

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
    dataset,
    seeds=DEFAULT_SEEDS,
    config_files=None,
    overrides: dict | None = None,
    out=None,
    baselines=None,
    metrics=None,
    protocols=None,
    mixed_protocols: bool = False,
    paper: bool = False,
    correction: str = "holm",
    execution: Execution | None = None,
    log=print,
    status: bool = False,
    mixed_code: bool = False,
) -> dict:
    """Train ``models`` x ``seeds`` on ``dataset`` (skipping runs already stored in ``out``)
    and write the comparison tables and plot.  ``dataset``: one, or several (a grid: each
    in ``<out>/<dataset>/`` with its own tables, the models x datasets table ``grid.md``
    in ``out``).  ``baselines``: the models of the "Improv." row (default: the RecBole
    built-ins).  ``protocols``: every model under each (a table each, and one side by
    side); runs of different protocols share no table unless ``mixed_protocols``, and
    runs of different code (their recorded commits) none unless ``mixed_code``.
    ``paper``: paper settings (``properties/paper/``) for the models that have them for
    the dataset, the denoisers' backbones sharing their denoiser's, under the protocol
    they name.  ``correction``: ``holm`` or ``bh`` for the per-user tests.
    ``status``: train nothing; the tables of what is stored, and ``unfinished.md``.
    ``execution`` (``Execution``): one run after another here by default, packed onto
    this machine or as Ray tasks, with or without a time limit.
    Returns ``rows`` (as in ``comparison.csv``), ``markdown``, ``files``, the
    ``trained``, ``skipped``, ``stopped`` and ``not_started`` runs (``(entry, seed)``;
    with several datasets ``(dataset, entry, seed)``), and ``complete``.  Steps:
    ``checked_request``, ``plan``, ``train_missing``, ``_results``.
    """
    datasets = _parse_list(dataset, "--dataset")
    execution = execution or Execution()
    execution.check()
    execution.start_clock()
    base = Path(out) if out is not None else Path("comparisons") / "+".join(datasets)
    comparisons = [
        checked_request(
            Comparison(
                models, name, seeds, config_files, overrides,
                base if len(datasets) == 1 else base / name, baselines, protocols,
                mixed_protocols, paper, correction, execution, log, mixed_code,
            ),
            metrics,
        )
        for name in datasets
    ]  # fmt: skip
    folders = [base] + [c.out for c in comparisons if c.out != base]
    # A folder that exists may be another comparison's right now: say so before the
    # minute of planning (the data checks), not after it.
    locks, read_only = {}, False
    try:
        for folder in [f for f in folders if f.is_dir()]:
            try:
                locks[folder] = lock_out_dir(folder)
            except ComparisonError:
                if not status:
                    raise
                read_only = True  # --status of a running comparison: it reads, writes nothing
        return _planned_and_run(
            comparisons, base, folders, locks, metrics, execution, status, read_only
        )
    finally:
        for lock in locks.values():
            lock.release()


def _planned_and_run(
    comparisons, base, folders, locks, metrics, execution, status, read_only=False
) -> dict:
    """``compare`` once the folders that exist are locked: plan every comparison, lock
    and check the output folders, train what is missing (or only read, under
    ``status``), write the tables.  ``read_only``: ``--status`` of a folder another
    comparison is writing: its progress is read and shown, nothing is written."""
    for comparison in comparisons:
        plan(comparison, metrics)
    config = next(iter(comparisons[0].configs.values()))
    pinned = config["torch_threads"]
    if execution.mode == "packed" and pinned is not None:
        # A run's torch_threads is what it trains with: the packing must count those.
        if execution.threads_per_run is not None and int(pinned) != execution.threads_per_run:
            raise ComparisonError(
                f"--torch_threads={pinned} and --threads_per_run {execution.threads_per_run} "
                "both set the threads of each packed run: give one of them"
            )
        execution.threads_per_run = int(pinned)
    execution.pack(gpu=config["device"].type == "cuda")
    if len(comparisons) == 1:
        nested = base / comparisons[0].dataset
        if (nested / "runs").is_dir() and not (base / "runs").is_dir():
            # A grid keeps each dataset's runs in <out>/<dataset>/: read from <out>, its
            # stored runs would look missing and be trained again.
            raise ComparisonError(
                f"{base} is a grid's output folder: its runs on {comparisons[0].dataset} are in "
                f"{nested}; give --out {nested}, or the grid's --dataset list with --out {base}"
            )
    for folder in folders:
        if read_only:
            break
        check_writable(folder, "--out")
        if folder not in locks:  # two comparisons into one folder mix runs
            locks[folder] = lock_out_dir(folder)
    for c in comparisons:
        check_output_entries(c.out)
        for name in ("partial", "runs"):
            if (c.out / name).is_dir() and not read_only:
                # Proves it writable before hours of training, and removes what killed
                # runs left half-written there (14 MB a state on Beauty).
                check_writable(c.out / name, f"the {name}/ folder of --out")
        check_out_dir(c.out, c.settings, c.dataset_sha256)
        check_stored_settings(
            c.out,
            [(j.entry, j.seed) for j in c.jobs],
            c.effective_settings,
            c.dataset,
            c.expected_labels,
        )
        stored = {
            (j.entry, j.seed): load_run(run_file(j.out, j.entry, j.seed))
            for j in c.jobs
            if run_file(j.out, j.entry, j.seed).is_file()
        }
        missing = len(stored) < len(c.jobs)
        current = code_of({"code": code_identity()}) if missing and not status else None
        check_code(stored, current, c.mixed_code)
    if status:
        outcome, skipped = stored_outcome(comparisons)
    else:
        outcome, skipped = train_missing(comparisons, execution)
    return _results(comparisons, base, outcome, skipped, read_only)


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
        # RecBole's built-ins and the plugin's baselines; a researcher's own model
        # (package.module:Class) is compared against them, as the plugin's are.
        comparison.baselines = [
            m for m in models
            if (names[m] not in MODELS and ":" not in names[m]) or names[m] in BASELINES
        ]  # fmt: skip
    else:
        comparison.baselines = _parse_list(comparison.baselines, "--baselines")
        unknown = [model for model in comparison.baselines if model not in models]
        if unknown:
            raise ComparisonError(
                f"baseline(s) {', '.join(unknown)} are not among the compared models "
                f"({', '.join(models)})"
            )
    if comparison.out is None:
        comparison.out = Path("comparisons") / comparison.dataset
    comparison.out = Path(comparison.out)
    comparison.config_files = list(comparison.config_files or [])
    return comparison


def plan(comparison: Comparison, metrics) -> None:
    """The paper settings, the run settings stored with the runs, every configuration
    validated (``runs.validate``), the data's fingerprint and the metrics of the tables
    (a time limit, which data-parallel runs cannot keep, refused beside them)."""
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
    c.configs, c.expected_labels, c.effective_settings = validate(
        c.models, c.dataset, c.config_files, c.overrides, c.seeds, c.protocols or [None],
        c.paper_models, c.references,
    )  # fmt: skip
    config = next(iter(c.configs.values()))
    parallel = data_parallel_settings(config)
    if c.execution.ray and parallel is not None:
        raise ComparisonError(
            "--ray runs the comparison's trainings side by side, one process each; nproc "
            "and world_size (data-parallel training) work without --ray"
        )
    if parallel is not None and c.execution.time_limit is not None:
        raise ComparisonError(
            "--time_limit stops each run with its resume state, which data-parallel "
            "training (nproc, world_size) does not keep: give one or the other"
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
    from recbole_freq.data.guard import dataset_fingerprint

    c.dataset_sha256 = dataset_fingerprint(config)


def train_missing(comparisons: list[Comparison], execution: Execution) -> tuple[Outcome, list]:
    """Train the runs of every comparison not yet stored in its output folder, as
    ``execution`` says; returns the ``Outcome`` and the skipped runs ``(dataset, entry,
    seed)``.  An interrupt says what is kept."""
    log = comparisons[0].log
    jobs, skipped = [], []
    for c in comparisons:
        for line in stored_label_differences(c.out, c.entries, c.seeds, c.expected_labels):
            log(f"note: {line}")
        for job in c.jobs:
            if run_file(job.out, job.entry, job.seed).is_file():
                skipped.append((job.dataset, job.entry, job.seed))
            else:
                jobs.append(job)
    if skipped:
        log(f"{len(skipped)} run(s) already stored: skipped")
    deadline = execution.deadline
    try:
        if not jobs:
            outcome = Outcome()
        elif execution.mode == "ray":
            outcome = run_on_ray(jobs, log, execution)
        elif execution.mode == "packed":
            log(f"{len(jobs)} run(s), {execution.runs} at once, "
                f"{execution.threads} thread(s) each")  # fmt: skip
            outcome = run_packed(jobs, log, execution.runs, execution.threads, deadline)
        else:
            outcome = run_sequential(jobs, log, deadline)
    except KeyboardInterrupt as interrupt:
        from recbole_freq.utils.signals import RunInterrupted

        total = sum(len(c.jobs) for c in comparisons)
        stored = sum(
            run_file(j.out, j.entry, j.seed).is_file() for c in comparisons for j in c.jobs
        )
        folders = ", ".join(str(c.out / "runs") for c in comparisons)
        partial = [str(j.resume_file) for j in jobs if j.resume_file.is_file()]
        kept = f"{stored} of {total} runs are stored in {folders}"
        if partial:
            kept += "; unfinished runs keep their completed epochs in " + ", ".join(partial)
        raise RunInterrupted(kept) from interrupt
    return outcome, skipped


def stored_outcome(comparisons: list[Comparison]) -> tuple[Outcome, list]:
    """``train_missing``'s answer without training: the stored runs as skipped, those
    with a resume state as stopped, the others as not started."""
    outcome, skipped = Outcome(), []
    for c in comparisons:
        for job in c.jobs:
            run = (job.dataset, job.entry, job.seed)
            if run_file(job.out, job.entry, job.seed).is_file():
                skipped.append(run)
            else:
                (outcome.stopped if job.resume_file.is_file() else outcome.not_started).append(run)
    return outcome, skipped


def _results(
    comparisons: list[Comparison], base: Path, outcome: Outcome, skipped, read_only=False
) -> dict:
    """Each dataset's tables once all its runs are stored, the grid's with several
    datasets (from the runs stored so far), and what became of the runs; ``read_only``:
    the same markdown, no file written (another comparison is writing the folder)."""
    single = len(comparisons) == 1
    stored = {
        c.dataset: {
            (j.entry, j.seed): load_run(
                run_file(j.out, j.entry, j.seed), j.entry, j.seed, j.dataset
            )
            for j in c.jobs
            if run_file(j.out, j.entry, j.seed).is_file()
        }
        for c in comparisons
    }
    rows, sections, files = [], [], {}
    for c in comparisons:
        if len(stored[c.dataset]) < len(c.jobs):
            if read_only:
                written, markdown = {}, unfinished_markdown(*unfinished_rows(c.jobs, c.metrics),
                                                            c.metrics)  # fmt: skip
            else:
                written, markdown = write_unfinished(c)
        else:
            c_rows, plot_rows, markdown = tabulate(c, stored[c.dataset])
            written = {}
            if not read_only:
                remove_unfinished(c.out)
                written = write_comparison(c, stored[c.dataset], c_rows, plot_rows, markdown)
            rows += [{**row, "dataset": c.dataset} if not single else row for row in c_rows]
        sections.append(markdown if single else f"## {c.dataset}\n\n{markdown}")
        files.update(written if single else {f"{c.dataset} {k}": v for k, v in written.items()})
    if not single:
        first = comparisons[0]
        entries = [entry_name(m, p) for m in first.ordered for p in (first.protocols or [None])]
        grid = grid_markdown(
            stored,
            entries,
            first.seeds,
            first.metrics,
            {c.dataset: str(c.out) for c in comparisons},
        )
        if not read_only:
            files["grid"], files["grid_csv"] = base / "grid.md", base / "grid.csv"
            write_atomic(files["grid"], grid)
            grid_csv = grid_csv_text(stored, entries, first.seeds, first.metrics)
            write_atomic(files["grid_csv"], grid_csv)
        sections.insert(0, grid)
    shown = (lambda runs: [(e, s) for _, e, s in runs]) if single else list
    return {
        "rows": rows,
        "markdown": "\n".join(sections),
        "files": files,
        "trained": shown(outcome.trained),
        "skipped": shown(skipped),
        "stopped": shown(outcome.stopped),
        "not_started": shown(outcome.not_started),
        "failed": list(outcome.failed),
        "read_only": read_only,
        "complete": not (outcome.stopped or outcome.not_started or outcome.failed),
        "metrics": comparisons[0].metrics,
        "baselines": [m for m in comparisons[0].ordered if m in comparisons[0].baselines],
    }


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
            row["model"] = entry_label(row["model"])
        rows += group_rows
        note = protocol_note(c.configs[protocol], sorted(set(labels.values())))
        figures = published_figures(c.dataset, labels.values())
        sections.append(
            markdown_table(group_rows, c.metrics, c.dataset, c.seeds, note, c.correction)
            + per_loss
            + published_section(group_rows, c.metrics, figures, c.seeds)
            + code_note({key: records[key] for key in records if key[0] in group})
        )
    if c.protocols:
        sections = [
            f"## Protocol {protocol}\n\n{section}"
            for protocol, section in zip(c.protocols, sections)
        ]
        sections.insert(0, protocol_side_by_side(rows, c.metrics, c.seeds, c.protocols))
    return rows, plot_rows, "\n".join(sections)


UNFINISHED_FILES = {"unfinished": "unfinished.md", "unfinished_csv": "unfinished.csv"}


def write_unfinished(comparison: Comparison) -> tuple[dict, str]:
    """``unfinished.md`` / ``.csv`` of a comparison whose runs are not all stored (see
    ``unfinished``): ``(files, markdown)``."""
    c = comparison
    rows, not_started = unfinished_rows(c.jobs, c.metrics)
    markdown = unfinished_markdown(rows, not_started, c.metrics)
    files = {key: c.out / name for key, name in UNFINISHED_FILES.items()}
    write_atomic(files["unfinished"], markdown)
    write_atomic(files["unfinished_csv"], unfinished_csv(rows, c.metrics))
    return files, markdown


def remove_unfinished(out: Path) -> None:
    """Every run is stored: what ``write_unfinished`` said no longer holds."""
    for name in UNFINISHED_FILES.values():
        (out / name).unlink(missing_ok=True)


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
    "Execution",
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
