"""The checks a run makes before it trains: each refuses, in one line, a run that would
fail later (after the data is loaded, after its first epoch) or report a success that
is not one (no validation rows, a metric never computed, timestamps RecBole would fill
in).  ``quick_start.run_config`` calls them as named steps around RecBole's own
sequence; the memory guard is ``quick_start.memory``."""

from __future__ import annotations

import logging
import math

import numpy as np
from recbole.utils import ModelType

from recbole_freq.config.configurator import get_model_class
from recbole_freq.data.guard import check_prepared, inter_columns, inter_files, inter_header
from recbole_freq.model.layout import builtin_class
from recbole_freq.utils.files import check_writable
from recbole_freq.utils.reproducibility import run_threads


class ModelBuildError(ValueError):
    """A model that cannot be built with the given settings (exit code 2)."""


def check_fearec_delays(config) -> None:
    """FEARec's autocorrelation keeps the ``k = int(topk_factor * ln L)`` strongest of the
    time delays of a sequence of ``L = MAX_ITEM_LIST_LENGTH`` positions (RecBole's
    ``HybridAttention.time_delay_agg_*``, after Autoformer).  Its correlation is the
    ``irfft`` of ``L // 2 + 1`` bins, so there are ``2 * (L // 2)`` delays (one fewer than
    L when L is odd).  With k above that, or k < 1, the model fails in its first forward
    pass, after the data is loaded; here it is one line naming the two settings and the
    values that work."""
    factor, length = config["topk_factor"], config["MAX_ITEM_LIST_LENGTH"]
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
        raise ModelBuildError(f"FEARec needs topk_factor > 0, got {factor!r}")

    def kept(n):
        return int(factor * math.log(n)) if n > 1 else 0

    delays, available = kept(length), 2 * (length // 2)
    if delays < 1:
        raise ModelBuildError(
            f"FEARec with topk_factor={factor} and MAX_ITEM_LIST_LENGTH={length} keeps "
            f"int({factor} * ln {length}) = {delays} time delays; raise either so that it "
            "is at least 1"
        )
    if delays > available:
        shortest = next((n for n in range(length + 1, 10**6) if kept(n) <= 2 * (n // 2)), None)
        longer = f"MAX_ITEM_LIST_LENGTH >= {shortest} or " if shortest else ""
        largest = math.floor((available + 1) / math.log(length))
        largest -= int(largest * math.log(length)) > available
        raise ModelBuildError(
            f"FEARec with topk_factor={factor} keeps int({factor} * ln {length}) = {delays} "
            f"time delays, more than the {available} that MAX_ITEM_LIST_LENGTH={length} "
            f"has (2 * (L // 2)); use {longer}topk_factor <= {largest}"
        )


def check_run_settings(config) -> None:
    """A run that would not train, never validate, or fail after its first epoch is an
    error before anything runs."""
    from recbole_freq.config.settings import evaluation_mode_problem, metrics_problem
    from recbole_freq.protocol.trainer import trainer_class

    problem = metrics_problem(config)
    if problem:
        raise ValueError(problem)
    _check_valid_metric(config)
    run_threads(config)  # a torch_threads that is not a thread count, in one line
    sequential = config["MODEL_TYPE"] == ModelType.SEQUENTIAL
    modes = config["eval_args"]["mode"]
    modes = modes if isinstance(modes, dict) else {"valid": modes, "test": modes}
    named = [(f"eval_args mode ({split})", mode) for split, mode in modes.items()]
    named += [("extra_test_modes entry", mode) for mode in extra_test_modes(config)]
    for where, mode in named:
        problem = evaluation_mode_problem(mode, sequential)
        if problem:
            raise ValueError(f"{where} {problem}")
    _check_learner(config["learner"])
    builtin_class(get_model_class(config["model"]), config)  # refused in one line
    trainer_class(config)  # a RecBole trainer the plugin's hooks cannot reach
    if config["log_wandb"]:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            raise ValueError(
                "log_wandb=True needs the wandb package (pip install wandb), or set log_wandb=False"
            )
    epochs, eval_step = config["epochs"], config["eval_step"]
    if epochs < 1:
        raise ValueError(
            f"epochs={epochs}: a run needs at least 1 training epoch (with 0 it would "
            "report test metrics of an untrained model)"
        )
    if eval_step > epochs:
        raise ValueError(
            f"eval_step={eval_step} with epochs={epochs} never validates, so no best epoch "
            "exists; use eval_step <= epochs (or eval_step=0 to train without validation "
            "and test the last epoch)"
        )


# The optimizers RecBole's Trainer._build_optimizer knows; any other name trained with
# Adam, and the run recorded the name it was given.
LEARNERS = ("adam", "adamw", "sgd", "adagrad", "rmsprop", "sparse_adam")


def _check_learner(learner) -> None:
    if not isinstance(learner, str) or learner.lower() not in LEARNERS:
        raise ValueError(
            f"learner={learner!r} is not an optimizer RecBole knows (it would train with "
            f"Adam and record {learner!r}); use one of {', '.join(LEARNERS)}"
        )


def _check_valid_metric(config) -> None:
    metric = str(config["valid_metric"])
    name, _, k = metric.partition("@")
    metrics = [str(m).lower() for m in config["metrics"]]
    topk = config["topk"] if isinstance(config["topk"], list) else [config["topk"]]
    if name.lower() not in metrics or (k and (not k.isdigit() or int(k) not in topk)):
        raise ValueError(
            f"valid_metric={metric} is not computed: metrics are {config['metrics']} at "
            f"topk {topk}; pick one of them (e.g. valid_metric={config['metrics'][0]}@{topk[-1]})"
        )


def check_atomic_columns(config) -> None:
    """The columns ``load_col`` asks for must be in the ``.inter`` header; otherwise
    RecBole fails inside its first batch (a sequential model needs the time order).  A
    pre-split dataset (``benchmark_filename``) of a sequential model holds rows, not
    interactions: each file needs the user, the input list and the target."""
    wanted = (
        (config["load_col"] or {}).get("inter") if isinstance(config["load_col"], dict) else None
    )
    sequential = config["MODEL_TYPE"] == ModelType.SEQUENTIAL
    if config["benchmark_filename"] and sequential:
        item = config["ITEM_ID_FIELD"]
        wanted = [config["USER_ID_FIELD"], item + config["LIST_SUFFIX"], item, *(wanted or [])]
    elif wanted is not None and sequential:
        needed = [config["USER_ID_FIELD"], config["ITEM_ID_FIELD"]]
        if not isinstance(wanted, (list, tuple)) or any(c not in wanted for c in needed):
            raise ValueError(
                f"load_col inter={wanted!r} leaves out {[c for c in needed if c not in (wanted or [])]}: "
                f"a sequential model reads whose history each item is in; give e.g. load_col: "
                f"{{inter: [{', '.join(needed)}, {config['TIME_FIELD']}]}}"
            )
    check_timestamps(config)
    if sequential and not config["benchmark_filename"]:
        _check_id_types(config)
    if not wanted:
        return
    for inter in inter_files(config):
        present = inter_columns(inter, config["field_separator"])
        missing = [column for column in dict.fromkeys(wanted) if column not in present]
        if not missing and config["benchmark_filename"] and sequential:
            _check_list_lengths(config, inter, present.index(wanted[1]))
        if missing:
            raise ValueError(
                f"{inter} has columns {present}, but the run reads {list(dict.fromkeys(wanted))}; "
                f"missing: {missing}. Prepare the dataset with dataset_prep, or set load_col"
                + (
                    " (a pre-split sequential file: user_id:token item_id_list:token_seq "
                    "item_id:token, one row per prefix)"
                    if config["benchmark_filename"]
                    else ""
                )
            )


def _check_list_lengths(config, inter, column: int) -> None:
    """The input lists of a pre-split file must fit ``MAX_ITEM_LIST_LENGTH``: RecBole
    copies each into a row of that width and failed with an ``IndexError``."""
    longest, line_number = 0, 0
    separator = config["field_separator"] or "\t"
    list_separator = config["seq_separator"] or " "
    with open(inter, encoding="utf-8", errors="replace") as handle:
        next(handle, None)
        for number, line in enumerate(handle, start=2):
            fields = line.rstrip("\r\n").split(separator)
            if column < len(fields):
                size = len([t for t in fields[column].split(list_separator) if t])
                if size > longest:
                    longest, line_number = size, number
    if longest > config["MAX_ITEM_LIST_LENGTH"]:
        raise ValueError(
            f"{inter}, line {line_number}: an input list of {longest} items, more than "
            f"MAX_ITEM_LIST_LENGTH={config['MAX_ITEM_LIST_LENGTH']}; set "
            f"MAX_ITEM_LIST_LENGTH to at least {longest}, or write the files with the "
            "lists cut to their most recent items"
        )


def check_timestamps(config) -> None:
    """Every timestamp the run orders interactions by must be a finite number: RecBole
    fills an empty or NaN timestamp with the column's mean and sorts an infinite one
    last, training on an order that exists nowhere, with exit 0."""
    import pandas as pd

    time_field = config["TIME_FIELD"]
    load_col = config["load_col"]
    wanted = load_col.get("inter") if isinstance(load_col, dict) else None
    if not time_field or config["benchmark_filename"] or (wanted and time_field not in wanted):
        return
    separator = config["field_separator"] or "\t"
    for inter in inter_files(config):
        declared = inter_header(inter, separator)
        names = [column.split(":")[0] for column in declared]
        if time_field not in names:
            continue
        _check_time_type(inter, declared[names.index(time_field)])
        column = pd.read_csv(
            inter,
            sep=separator,
            usecols=[names.index(time_field)],
            dtype=str,
            keep_default_na=False,
            engine="c",
            quoting=3,
        ).iloc[:, 0]
        values = pd.to_numeric(column.str.strip(), errors="coerce")
        bad = ~np.isfinite(values.to_numpy(dtype=float))
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"{inter}, line {first + 2}: timestamp {column.iloc[first]!r} is not a finite "
                f"number ({int(bad.sum()):,} such rows); the run orders each history by time: "
                "fix or drop those rows and prepare the dataset again"
            )


def check_item_count(config, dataset) -> None:
    """The catalogue must be larger than what the run ranks: its top-k cut-offs and the
    negatives a sampled mode draws per target (``uni5000`` on 2,070 items was accepted,
    ``uni99999999`` tried to allocate 40 GB)."""
    largest = max(config["topk"] if isinstance(config["topk"], list) else [config["topk"]])
    items = dataset.item_num - 1  # id 0 is padding
    if items < largest:
        raise ValueError(
            f"dataset {config['dataset']!r} has {items} items, fewer than topk {largest}: "
            "every metric at that cut-off would count all items; lower topk"
        )
    modes = config["eval_args"]["mode"]
    modes = list(modes.values()) if isinstance(modes, dict) else [modes]
    for mode in dict.fromkeys([*modes, *extra_test_modes(config)]):
        if isinstance(mode, str) and mode[:3] in ("uni", "pop") and mode[3:].isdigit():
            if int(mode[3:]) >= items:
                raise ValueError(
                    f"evaluation mode {mode!r} ranks each target against {int(mode[3:]):,} "
                    f"sampled items, but dataset {config['dataset']!r} has {items:,} items "
                    f"(the target among them); use {mode[:3]}{items - 1} at most, or full"
                )


def check_split_rows(config, dataset, *loaders) -> None:
    """Every split must hold rows: a run whose validation split is empty would train with
    no early stopping, pick no best epoch and still report success."""
    uid = dataset.uid_field
    users = dataset.user_num - 1  # id 0 is padding
    for name, loader in zip(("training", "validation", "test"), loaders):
        if name == "validation" and config["eval_step"] <= 0:
            continue
        split = loader._dataset
        rows = len(split)
        if rows == 0:
            raise ValueError(
                f"dataset {config['dataset']!r} has no {name} rows: no user has enough "
                f"interactions for split {dict(config['eval_args']['split'])} (a leave-one-out "
                "split needs at least 3 per user); prepare a dataset with longer histories"
            )
        if name != "training":
            covered = len(split.inter_feat[uid].unique())
            if covered < users:
                logging.getLogger().warning(
                    f"{users - covered} of {users} users have no {name} row (too few "
                    "interactions for the split); they are left out of its metrics"
                )


def check_output_locations(config, saved: bool) -> None:
    """Every folder the run will write, proved writable before any training starts."""
    if saved:
        check_writable(config["checkpoint_dir"], "checkpoint_dir")
    check_writable("log", "the log folder")
    check_writable("log_tensorboard", "the TensorBoard folder")


def extra_test_modes(config) -> list[str]:
    """The run's ``extra_test_modes`` as a list (a single mode may be given as a string)."""
    modes = config["extra_test_modes"] or []
    return [modes] if isinstance(modes, str) else list(modes)


def _check_id_types(config) -> None:
    """A sequential model reads one user and one item id per row: a header that types
    them ``token_seq`` (lists) failed deep inside RecBole with a TypeError."""
    for inter in inter_files(config):
        for declared in inter_header(inter, config["field_separator"]):
            name, _, kind = declared.partition(":")
            if name in (config["USER_ID_FIELD"], config["ITEM_ID_FIELD"]) and kind != "token":
                raise ValueError(
                    f"{inter}: the id column is declared {declared!r}; a sequential model "
                    f"reads one id per row: declare it {name}:token in the header"
                )


def _check_time_type(inter, declared: str) -> None:
    """RecBole orders by the time column as its header types it: ``:token`` values are
    text, sorted as text (``"10"`` before ``"9"``), which reorders the histories."""
    name, _, kind = declared.partition(":")
    if kind != "float":
        raise ValueError(
            f"{inter}: the time column is declared {declared!r}; RecBole would order each "
            f"history by it as {kind or 'untyped'} values, not as numbers ('10' before '9'): "
            f"declare it {name}:float in the header"
        )


def check_before_loading(config, saved: bool) -> None:
    """What a run checks before it loads any data: its settings, the prepared dataset,
    the columns the run reads, and every folder it will write."""
    check_run_settings(config)
    check_prepared(config)
    check_atomic_columns(config)
    check_output_locations(config, saved)
