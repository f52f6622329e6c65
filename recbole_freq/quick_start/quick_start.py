"""The Python API: train and evaluate one model on one dataset.

``run(model, dataset, config_files, config_dict, ...)`` is the plugin's counterpart of
RecBole's ``run_recbole``; ``run_config`` does the same for a built ``FreqConfig`` and
``resume_run`` continues an interrupted run.  Plugin models and RecBole's built-ins run
through the same path (same property files, split and evaluation), so a comparison is
one ``--model`` apart.  The command line (``recbole_freq.cli``) and the other jobs
(search, comparison) call this module; it never imports them.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from pathlib import Path

import numpy as np
import torch
from recbole.data import create_dataset, data_preparation
from recbole.data.transform import construct_transform
from recbole.data.utils import create_samplers, get_dataloader
from recbole.utils import ModelType, dict2str, get_flops, init_logger, init_seed, set_color

from recbole_freq.checkpoint.loader import weights_fingerprint
from recbole_freq.compat.logs import current_log_file
from recbole_freq.compat.trainer import saved_state
from recbole_freq.config.configurator import FreqConfig, get_model_class
from recbole_freq.data.guard import check_prepared, dataset_fingerprint, inter_columns, inter_files
from recbole_freq.data.noise import corrupt_training_data
from recbole_freq.model.layout import with_sequence_layout
from recbole_freq.protocol import (
    apply_protocol,
    protocol_record,
    protocol_trainer,
    use_protocol_negatives,
)
from recbole_freq.protocol.sampled_scoring import use_full_sort_for_sampled_scoring
from recbole_freq.quick_start.distributed import (
    DataParallelError,
    data_parallel_settings,
    is_data_parallel,
    run_data_parallel,
    shard_training_loader,
    whole_loaders,
    writing_rank,
)
from recbole_freq.quick_start.memory import TrainingOutOfMemory, check_memory, longest_history
from recbole_freq.quick_start.resume import (
    ResumeError,
    apply_resume_state,
    checkpoint_file_for,
    load_resume_state,
    resume_file_for,
    save_resume_state,
    settings_differences,
)
from recbole_freq.utils.command import DEFAULT_DATASET, DEFAULT_MODEL, invoked_command
from recbole_freq.utils.files import OutputWriteError, check_writable, plain_value, write_atomic
from recbole_freq.utils.signals import RunInterrupted  # noqa: F401  (its name here before)

REPORTED_METRICS = [f"{name}@{k}" for k in (5, 10, 20) for name in ("hit", "ndcg")]


class TrainingRecorder:
    """Per-epoch training loss, validation metrics and time of a RecBole trainer: the one
    place that hooks into the trainer's epochs (``_train_epoch`` / ``_valid_epoch`` of
    this instance).  ``before_epoch(epoch)`` runs before an epoch once all earlier ones
    are complete (the resume state is written there); ``after_valid(record)`` after each
    validation, with the epoch's record (the search reports it to Ray Tune there)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.epochs: list[dict] = []
        self.train_seconds = 0.0
        self.before_epoch = None
        self.after_valid = None
        train_epoch, valid_epoch = trainer._train_epoch, trainer._valid_epoch

        def timed_train_epoch(train_data, epoch_idx, *args, **kwargs):
            self.current_epoch = epoch_idx
            if self.before_epoch is not None and epoch_idx > trainer.start_epoch:
                self.before_epoch(epoch_idx)
            start = time.perf_counter()
            loss = train_epoch(train_data, epoch_idx, *args, **kwargs)
            seconds = time.perf_counter() - start
            self.train_seconds += seconds
            total = sum(loss) if isinstance(loss, tuple) else loss
            self.epochs.append(
                {"epoch": len(self.epochs), "train_loss": float(total), "train_seconds": seconds}
            )
            self._add_model_report(epoch_idx)
            return loss

        def recorded_valid_epoch(*args, **kwargs):
            score, result = valid_epoch(*args, **kwargs)
            self.epochs[-1].update(valid_score=float(score), valid=dict(result))
            if self.after_valid is not None:
                self.after_valid(self.epochs[-1])
            return score, result

        trainer._train_epoch = timed_train_epoch
        trainer._valid_epoch = recorded_valid_epoch

    def _add_model_report(self, epoch_idx) -> None:
        # Optional model hook, as run_summary is for the whole run (e.g. how many links
        # the denoising masks prune after this epoch).
        epoch_report = getattr(self.trainer.model, "epoch_report", None)
        report = epoch_report() if callable(epoch_report) else None
        if not report:
            return
        self.epochs[-1]["model_report"] = report
        described = ", ".join(
            f"{key} {' / '.join(f'{value:.3f}' for value in values)}"
            for key, values in report.items()
        )
        model_name = type(self.trainer.model).__name__
        logging.getLogger().info(f"epoch {epoch_idx} {model_name}: {described}")

    @property
    def best_epoch(self):
        scored = [e for e in self.epochs if "valid_score" in e]
        if not scored:
            return None
        pick = max if self.trainer.valid_metric_bigger else min
        best = pick(e["valid_score"] for e in scored)
        reached = [e["epoch"] for e in scored if e["valid_score"] == best]
        # The epoch whose checkpoint the trainer kept: RecBole's early_stopping counts a
        # tie as an improvement (the last epoch reaching the best), the strict rule does
        # not (the first).
        return (
            reached[0] if getattr(self.trainer, "stopping_rule", None) == "strict" else reached[-1]
        )


def run(
    model: str = DEFAULT_MODEL,
    dataset: str = DEFAULT_DATASET,
    config_files=None,
    config_dict=None,
    cmd_overrides=None,
    paper: bool = False,
    saved: bool = True,
    shared_with=(),
    resume_file=None,
) -> dict:
    """Train ``model`` on ``dataset`` and evaluate on the test split; return a summary.

    With ``nproc`` (or ``world_size``) above 1 in the settings, the run trains
    data-parallel in that many processes (``recbole_freq.quick_start.distributed``) and the summary
    is process 0's.

    ``shared_with``: other models given the same settings (``FreqConfig``).
    ``resume_file``: where the run keeps its resume state (``recbole_freq.quick_start.resume``);
    if the file exists, the run continues from it (its settings must be the same).  By
    default it is ``<checkpoint>.resume.pth``, used by ``--resume``."""
    config = FreqConfig(
        model, dataset, config_files, config_dict, cmd_overrides, paper, shared_with
    )
    parallel = data_parallel_settings(config)
    if parallel is None:
        return run_config(config, saved, resume_file)
    if resume_file is not None and Path(resume_file).exists():
        raise DataParallelError(
            f"{resume_file} holds a one-process run's resume state; a data-parallel run "
            "(nproc / world_size above 1) cannot continue it: resume it with nproc 1, or "
            "delete it to start afresh"
        )
    # What can be checked before any process starts is checked once, here.
    check_run_settings(config)
    check_prepared(config)
    check_atomic_columns(config)
    check_output_locations(config, saved)
    config_args = (
        model,
        dataset,
        config_files,
        config_dict,
        cmd_overrides,
        paper,
        tuple(shared_with),
    )
    return run_data_parallel(run_config, config_args, saved, parallel)


def resume_run(path) -> dict:
    """Continue the run whose resume state is ``path`` (``--resume``)."""
    from recbole_freq.checkpoint.loader import drop_pickled_cache_settings

    state = load_resume_state(path)
    config = state["config"]
    drop_pickled_cache_settings(config, path)
    # Outputs go beside the resume file, as the interrupted run wrote them: never where
    # the file's content (its config's checkpoint_dir) points.
    config["checkpoint_dir"] = str(Path(path).resolve().parent)
    return run_config(
        config,
        saved=True,
        resume_file=path,
        state=state,
        checkpoint_file=str(checkpoint_file_for(Path(path).resolve())),
    )


def run_config(
    config, saved: bool = True, resume_file=None, state=None, checkpoint_file=None
) -> dict:
    """``run`` on a built configuration; ``checkpoint_file``: where its checkpoint goes
    (a new name in ``checkpoint_dir`` by default)."""
    start = time.perf_counter()
    check_run_settings(config)
    check_prepared(config)
    check_atomic_columns(config)
    config["dataset_sha256"] = dataset_fingerprint(config)
    check_output_locations(config, saved)
    init_seed(config["seed"], config["reproducibility"])
    init_logger(config)
    logger = logging.getLogger()
    logger.info(config)

    recbole_dataset = create_dataset(config)
    logger.info(recbole_dataset)
    check_item_count(config, recbole_dataset)
    users_longest = longest_history(recbole_dataset)
    _, (train_data, valid_data, test_data) = load_splits(config, recbole_dataset)
    check_split_rows(config, recbole_dataset, train_data, valid_data, test_data)
    check_memory(config, recbole_dataset, logger, users_longest)
    noise = train_data.noise_report

    model_instance = new_model(config, train_data)
    use_full_sort_for_sampled_scoring(model_instance)
    logger.info(model_instance)
    log_flops(config, model_instance, recbole_dataset, logger)
    trainer = protocol_trainer(config, model_instance)
    trainer.saved_model_file = checkpoint_file or unique_checkpoint_path(config)
    recorder = TrainingRecorder(trainer)
    loaders = (train_data, valid_data, test_data)
    parallel = is_data_parallel(config)
    writes = saved and writing_rank(config)
    if saved and not parallel:
        resume_file = Path(resume_file or resume_file_for(trainer.saved_model_file))
        if state is None and resume_file.is_file():
            state = load_resume_state(resume_file)
        recorder.before_epoch = lambda epoch: save_resume_state(
            resume_file, trainer, recorder, loaders, epoch
        )
    if state is not None:
        differences = settings_differences(state["config"], config)
        if differences:
            raise ResumeError(
                f"{resume_file} was written by a run with other settings ("
                + "; ".join(differences[:3])
                + "); delete it to start this run afresh"
            )
        apply_resume_state(state, trainer, recorder, loaders)
        logger.info(f"resumed from {resume_file} at epoch {trainer.start_epoch}")

    try:
        try:
            best_valid_score, best_valid_result = trainer.fit(
                train_data, valid_data, saved=saved, show_progress=config["show_progress"]
            )
        except KeyboardInterrupt as interrupt:
            raise RunInterrupted(
                _interrupted_training(recorder, resume_file if saved and not parallel else None)
            ) from interrupt
        test_result = trainer.evaluate(
            test_data, load_best_model=saved, show_progress=config["show_progress"]
        )
        test_per_user = trainer.per_user_ranks()
        extra_test_results = evaluate_extra_test_modes(
            config, recbole_dataset, (train_data, valid_data, test_data), trainer, saved
        )
    except torch.OutOfMemoryError as error:
        raise TrainingOutOfMemory(config) from error
    log_results(logger, best_valid_result, test_result, extra_test_results)
    n_epochs = len(recorder.epochs)
    best_state = saved_state(trainer) if saved else None
    summary = {
        "model": config["model"],
        "dataset": config["dataset"],
        "protocol": protocol_record(config),
        "seed": config["seed"],
        "device": str(config["device"]),
        "valid_metric": config["valid_metric"],
        "best_valid_score": float(best_valid_score),
        "best_valid_result": dict(best_valid_result or {}),
        "test_result": dict(test_result),
        "epochs_run": n_epochs,
        "best_epoch": recorder.best_epoch,
        "stopped_early": n_epochs < config["epochs"],
        "train_seconds_per_epoch": recorder.train_seconds / max(n_epochs, 1),
        "total_seconds": time.perf_counter() - start,
        "parameters": sum(p.numel() for p in model_instance.parameters()),
        "processes": int(config["world_size"]) if parallel else 1,
        "checkpoint": trainer.saved_model_file if saved else None,
        "weights_sha256": weights_fingerprint(best_state["state_dict"]) if best_state else None,
        "log_file": current_log_file(),
        "dataset_sha256": config["dataset_sha256"],
        "history": recorder.epochs,
        "config": {key: plain_value(config[key]) for key in config.final_config_dict},
    }
    if test_per_user is not None:
        # Per-user ranks let --compare test significance across users (compare.tables).
        summary["test_per_user"] = test_per_user
    if extra_test_results:
        summary["extra_test_results"] = extra_test_results
    if noise:
        summary["noise"] = noise
    # Optional model hook: what a model wants kept with the run (e.g. learned masks).
    if callable(getattr(model_instance, "run_summary", None)):
        summary["model_report"] = model_instance.run_summary()
    if writes:
        summary_file = Path(trainer.saved_model_file).with_suffix(".json")
        summary["summary_file"] = str(summary_file)
        try:
            write_atomic(summary_file, json.dumps(summary, indent=2, default=str))
        except OutputWriteError as error:
            summary["summary_file"] = None
            kept = SummaryNotWrittenError(
                error.errno,
                f"{error}; the run itself finished: its results are printed above and "
                f"its checkpoint {trainer.saved_model_file} was kept",
            )
            kept.summary = summary
            raise kept from error
    if saved and not parallel and resume_file.exists():
        resume_file.unlink()
    return summary


def _interrupted_training(recorder, resume_file) -> str:
    epoch = getattr(recorder, "current_epoch", 0)
    if resume_file is not None and Path(resume_file).is_file():
        done = "epoch 0 is" if epoch == 1 else f"epochs 0-{epoch - 1} are"
        return (
            f"training stopped in epoch {epoch}; {done} kept in {resume_file}. "
            f"Resume with: {invoked_command()} --resume {resume_file}"
        )
    return f"training stopped in epoch {epoch}, before any epoch completed; nothing to resume"


class SummaryNotWrittenError(OutputWriteError):
    """The run finished but its summary file could not be written; ``summary`` holds it."""

    summary: dict


class ModelBuildError(ValueError):
    """A model that cannot be built with the given settings (exit code 2)."""


def load_splits(config, dataset=None):
    """The data half of config -> dataset -> splits -> model, the sequence every job and
    benchmark runs: seed, ``create_dataset`` (unless ``dataset`` is given), then
    ``data_preparation``, the synthetic noise of ``noise_ratio`` (``noise``; its report is
    ``train_data.noise_report``, None without noise) and the run's protocol
    (``protocol.apply_protocol``).  In a data-parallel process only the training loader
    is sharded (``distributed``).  Returns ``(dataset, (train_data, valid_data, test_data))``."""
    if dataset is None:
        init_seed(config["seed"], config["reproducibility"])
        dataset = create_dataset(config)
    with whole_loaders(config):
        splits = data_preparation(config, dataset)
        # noise_ratio acts on RecBole's prefix rows, before a protocol rebuilds the
        # training rows (and the evaluation histories) from them, so every protocol sees
        # one corruption.
        noise = corrupt_training_data(config, *splits)
        train_data, valid_data, test_data = apply_protocol(config, dataset, splits)
    if is_data_parallel(config):
        train_data = shard_training_loader(config, train_data)
    train_data.noise_report = noise  # for the run summary
    return dataset, (train_data, valid_data, test_data)


def new_model(config, train_data):
    """The model half: seeded as RecBole seeds it (plus the process's global rank in a
    data-parallel run, so that no two processes draw the same dropout), built on the
    training split."""
    rank = (config["local_rank"] or 0) + (config["offset"] or 0)
    init_seed(config["seed"] + rank, config["reproducibility"])
    return build_model(config, train_data._dataset)


def prepare_run(model, dataset, config_files=None, config_dict=None, cmd_overrides=None):
    """``(config, dataset, (train, valid, test), model)`` for ``model`` on a prepared
    ``dataset``, with the settings ``run`` would use; nothing is trained or written.  For
    benchmarks, tests and notebooks that need the real pipeline's pieces."""
    config = FreqConfig(model, dataset, config_files, config_dict, cmd_overrides)
    check_prepared(config)
    recbole_dataset, splits = load_splits(config)
    return config, recbole_dataset, splits, new_model(config, splits[0])


def build_model(config, dataset):
    """The model of ``config`` on ``dataset``.  RecBole's built-ins check few settings
    and fail deep inside their constructors (FEARec with ``n_layers=1``, heads that do
    not divide the hidden size ...): any failure while building is one line naming the
    model and the failure, not a traceback."""
    model_class = with_sequence_layout(get_model_class(config["model"]), config)
    if config["model"] == "FEARec":
        _check_fearec_delays(config)
    try:
        model = model_class(config, dataset)
    except ValueError:
        raise  # the plugin's models already say what is wrong
    except (ArithmeticError, AssertionError, LookupError, RuntimeError, TypeError) as error:
        raise ModelBuildError(
            f"{config['model']} cannot be built with these settings: "
            f"{type(error).__name__}: {error or 'assertion failed'}"
        ) from error
    return model.to(config["device"])


def _check_fearec_delays(config) -> None:
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

    problem = metrics_problem(config)
    if problem:
        raise ValueError(problem)
    _check_valid_metric(config)
    sequential = config["MODEL_TYPE"] == ModelType.SEQUENTIAL
    modes = config["eval_args"]["mode"]
    modes = modes if isinstance(modes, dict) else {"valid": modes, "test": modes}
    named = [(f"eval_args mode ({split})", mode) for split, mode in modes.items()]
    named += [("extra_test_modes entry", mode) for mode in extra_test_modes(config)]
    for where, mode in named:
        problem = evaluation_mode_problem(mode, sequential)
        if problem:
            raise ValueError(f"{where} {problem}")
    with_sequence_layout(get_model_class(config["model"]), config)  # refused in one line
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
        names = inter_columns(inter, separator)
        if time_field not in names:
            continue
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
    largest = max(config["topk"] if isinstance(config["topk"], list) else [config["topk"]])
    items = dataset.item_num - 1  # id 0 is padding
    if items < largest:
        raise ValueError(
            f"dataset {config['dataset']!r} has {items} items, fewer than topk {largest}: "
            "every metric at that cut-off would count all items; lower topk"
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


def log_flops(config, model, dataset, logger) -> None:
    """Count and log the model's FLOPs where RecBole's ``run_recbole`` does.  The count
    applies the model's transform to one row (BERT4Rec's masking draws from Python's
    ``random``) before one ``predict``, so counting at the same point keeps every later
    draw, and with it a RecBole model's numbers, equal to ``run_recbole``'s."""
    transform = construct_transform(config)
    flops = get_flops(model, dataset, config["device"], logger, transform)
    logger.info(set_color("FLOPs", "blue") + f": {flops}")


def log_results(logger, best_valid_result, test_result, extra_test_results) -> None:
    """The closing lines of RecBole's ``run_recbole`` log, which users grep for."""
    logger.info(set_color("best valid ", "yellow") + f": {dict2str(best_valid_result or {})}")
    logger.info(set_color("test result", "yellow") + f": {dict2str(test_result)}")
    for mode, result in extra_test_results.items():
        logger.info(set_color(f"test result ({mode})", "yellow") + f": {dict2str(result)}")


def unique_checkpoint_path(config) -> str:
    """The run's log file name with ``.pth``, so that log, checkpoint and summary of one
    run share a name.  RecBole names checkpoints ``<model>-<time to the second>.pth``, so
    two runs started in the same second (parallel trials, comparison workers) overwrite
    each other; the log name is unique (compat fix 7), and a random suffix is added should
    the name be taken anyway or the run have no log file."""
    log_file = current_log_file()
    if log_file:
        stem = Path(log_file).stem
    else:
        stamp = time.strftime("%b-%d-%Y_%H-%M-%S")
        stem = f"{config['model']}-{config['dataset']}-{stamp}-{uuid.uuid4().hex[:8]}"
    path = Path(config["checkpoint_dir"]) / f"{stem}.pth"
    if path.exists() or path.with_suffix(".json").exists():
        path = path.with_name(f"{stem}-{uuid.uuid4().hex[:8]}.pth")
    return str(path)


def extra_test_modes(config) -> list[str]:
    """The run's ``extra_test_modes`` as a list (a single mode may be given as a string)."""
    modes = config["extra_test_modes"] or []
    return [modes] if isinstance(modes, str) else list(modes)


def evaluate_extra_test_modes(config, recbole_dataset, loaders, trainer, saved) -> dict:
    """Test the trained model under more RecBole evaluation modes than the one it was
    validated with, on the same split: ``extra_test_modes: [uni100]`` adds the sampled
    protocol (100 uniform negatives per user, as in the Rec-Denoiser and SASRec papers) to
    a full-sort run without training again.  Negatives are drawn after re-seeding, so
    the result is reproducible.  The split datasets are the run's own (noise included)."""
    from recbole_freq.config.settings import evaluation_mode_problem

    modes = extra_test_modes(config)
    results = {}
    original_mode = dict(config["eval_args"]["mode"])
    original_neg_args = config["test_neg_sample_args"]
    try:
        for mode in modes:
            problem = evaluation_mode_problem(mode, config["MODEL_TYPE"] == ModelType.SEQUENTIAL)
            if problem:
                raise ValueError(f"extra_test_modes entry {problem}")
            config["eval_args"]["mode"] = {**original_mode, "test": mode}
            config._set_eval_neg_sample_args("test")
            init_seed(config["seed"], config["reproducibility"])
            built = [loader._dataset for loader in loaders]
            test_sampler = create_samplers(config, recbole_dataset, built)[2]
            with whole_loaders(config):
                test_data = get_dataloader(config, "test")(
                    config, built[2], test_sampler, shuffle=False
                )
            use_protocol_negatives(config, test_data)
            results[mode] = dict(
                trainer.evaluate(
                    test_data, load_best_model=saved, show_progress=config["show_progress"]
                )
            )
    finally:
        config["eval_args"]["mode"] = original_mode
        config["test_neg_sample_args"] = original_neg_args
    return results
