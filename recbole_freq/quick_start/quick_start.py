"""The Python API: train and evaluate one model on one dataset.

``run(model, dataset, config_files, config_dict, ...)`` is the plugin's counterpart of
RecBole's ``run_recbole``; ``run_config`` does the same for a built ``FreqConfig`` and
``resume_run`` continues an interrupted run.  Plugin models and RecBole's built-ins run
through the same path (same property files, split and evaluation), so a comparison is
one ``--model`` apart.  The command line (``recbole_freq.cli``) and the other jobs
(search, comparison) call this module; it never imports them.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
import time
import uuid
from pathlib import Path

import torch
from recbole.data import create_dataset, data_preparation
from recbole.data.transform import construct_transform
from recbole.data.utils import create_samplers, get_dataloader
from recbole.utils import ModelType, dict2str, get_flops, init_logger, init_seed, set_color

from recbole_freq.checkpoint.loader import weights_fingerprint
from recbole_freq.compat.logs import continue_log, current_log_file
from recbole_freq.config.configurator import FreqConfig, get_model_class
from recbole_freq.data.guard import check_prepared, dataset_fingerprint
from recbole_freq.data.noise import corrupt_training_data
from recbole_freq.model.abstract_recommender import TransformerRecommender
from recbole_freq.model.layout import builtin_class
from recbole_freq.protocol import (
    apply_protocol,
    protocol_record,
    trainer_for,
    use_protocol_negatives,
)
from recbole_freq.protocol.losses import training_loss_label
from recbole_freq.quick_start.distributed import (
    DataParallelError,
    data_parallel_settings,
    is_data_parallel,
    run_data_parallel,
    shard_training_loader,
    whole_loaders,
)
from recbole_freq.quick_start.memory import (
    TrainingOutOfMemory,
    check_memory,
    longest_history,
    warn_about_padding,
)
from recbole_freq.quick_start.preflight import (
    ModelBuildError,
    check_before_loading,
    check_fearec_delays,
    check_item_count,
    check_split_rows,
    extra_test_modes,
)
from recbole_freq.quick_start.resume import (
    EpochDeadline,
    ResumeError,
    TimeLimitReached,
    apply_resume_state,
    check_resume_data,
    checkpoint_file_for,
    comparison_folder_of,
    load_resume_state,
    resume_file_for,
    save_resume_state,
    settings_differences,
)
from recbole_freq.utils.command import DEFAULT_DATASET, DEFAULT_MODEL, invoked_command
from recbole_freq.utils.files import OutputWriteError, plain_value, write_atomic
from recbole_freq.utils.process_group import writing_rank
from recbole_freq.utils.reproducibility import apply_determinism, environment_record
from recbole_freq.utils.signals import RunInterrupted

REPORTED_METRICS = [f"{name}@{k}" for k in (5, 10, 20) for name in ("hit", "ndcg")]


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
    deadline: float | None = None,
    leave_resume_state: bool = False,
) -> dict:
    """Train ``model`` on ``dataset`` and evaluate on the test split; return a summary.

    With ``nproc`` (or ``world_size``) above 1 in the settings, the run trains
    data-parallel in that many processes (``recbole_freq.quick_start.distributed``) and the summary
    is process 0's.

    ``shared_with``: other models given the same settings (``FreqConfig``).
    ``resume_file``: where the run keeps its resume state (``recbole_freq.quick_start.resume``);
    if the file exists, the run continues from it (its settings must be the same).  By
    default it is ``<checkpoint>.resume.pth``, used by ``--resume``.
    ``deadline`` (``time.time()`` seconds): the run stops at an epoch boundary, its resume
    state written, raising ``TimeLimitReached`` (``resume.EpochDeadline``).
    ``leave_resume_state``: the finished run leaves its resume state for the caller to
    remove once the run's result is stored (``--compare``'s run file)."""
    config = FreqConfig(
        model, dataset, config_files, config_dict, cmd_overrides, paper, shared_with
    )
    parallel = data_parallel_settings(config)
    if parallel is None:
        return run_config(
            config, saved, resume_file, deadline=deadline, leave_resume_state=leave_resume_state
        )
    if deadline is not None:
        raise DataParallelError(
            "a time limit stops a run at an epoch boundary with its resume state, which a "
            "data-parallel run (nproc / world_size above 1) does not keep"
        )
    if resume_file is not None and Path(resume_file).exists():
        raise DataParallelError(
            f"{resume_file} holds a one-process run's resume state; a data-parallel run "
            "(nproc / world_size above 1) cannot continue it: resume it with nproc 1, or "
            "delete it to start afresh"
        )
    # What can be checked before any process starts is checked once, here.
    check_before_loading(config, saved)
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


def resume_run(path, trust_data=False) -> dict:
    """Continue the run whose resume state is ``path`` (``--resume``) on the data it
    trained on; a state that records no dataset fingerprint only if ``trust_data``."""
    from recbole_freq.checkpoint.loader import drop_pickled_cache_settings

    refuse_linked_resume_file(path)
    comparison = comparison_folder_of(path)
    if comparison is not None:
        # Finished here, the run would land beside the state, not in the comparison's
        # runs/, and the comparison would train it again from scratch.
        raise ResumeError(
            f"{path} is an unfinished run of the comparison in {comparison}: continue it with "
            "that comparison's command (its unfinished.md shows it; stored runs are skipped), "
            "not with --resume"
        )
    state = load_resume_state(path)
    config = state["config"]
    drop_pickled_cache_settings(config, path)
    continue_on_this_machine(config)
    check_resume_data(state, config, path, trust_data)
    # Outputs go beside the resume file, as the interrupted run wrote them: never where
    # the file's content (its config's checkpoint_dir) points.
    resume_file = Path(os.path.abspath(path))
    config["checkpoint_dir"] = str(resume_file.parent)
    return run_config(
        config,
        saved=True,
        resume_file=resume_file,
        state=state,
        checkpoint_file=str(checkpoint_file_for(resume_file)),
    )


def refuse_linked_resume_file(path) -> None:
    """``ResumeError`` unless ``path`` is a regular file: through a symbolic link the run
    would write its checkpoint beside the link's target and remove that target when it
    finishes (the original state of another folder, a comparison's ``partial/`` ...)."""
    import stat

    from recbole_freq.utils.inputs import file_kind

    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return  # a missing file is the loader's one line
    if not stat.S_ISREG(mode):
        raise ResumeError(
            f"{path} is {file_kind(mode)}, not a regular file: --resume writes beside the "
            "state and removes it when the run ends, so it takes the state itself; copy the "
            "state (cp, not ln -s) into the folder where the run should continue"
        )


def continue_on_this_machine(config) -> None:
    """A run recorded on a CUDA device continues on the CPU of a machine without one (a
    state made on a lent GPU is carried back): the device is the machine's, not a setting
    of the run (``settings_differences`` ignores it; the run file records each segment's
    device)."""
    device = config["device"]
    if str(getattr(device, "type", device)).startswith("cuda") and not torch.cuda.is_available():
        logging.getLogger().warning(
            f"the run was recorded on {device}; this machine has no CUDA device: it continues "
            "on the CPU"
        )
        config["device"] = torch.device("cpu")
        config["use_gpu"] = False


def run_config(
    config,
    saved: bool = True,
    resume_file=None,
    state=None,
    checkpoint_file=None,
    deadline=None,
    leave_resume_state: bool = False,
) -> dict:
    """``run`` on a built configuration; ``checkpoint_file``: where its checkpoint goes
    (a new name in ``checkpoint_dir`` by default).

    RecBole's ``run_recbole`` sequence (seed, logger, dataset, splits, model, FLOPs,
    trainer, fit, test), with the plugin's steps named between them: the preflight
    checks (``preflight``, the memory guard), the resume state, the extra test modes and
    the run summary."""
    start = time.perf_counter()
    # Stored absolute in the checkpoint, as searches store it: a relative path made
    # load_data_and_model from another folder fail.
    config["data_path"] = os.path.abspath(config["data_path"])
    check_before_loading(config, saved)
    config["dataset_sha256"] = dataset_fingerprint(config)
    init_seed(config["seed"], config["reproducibility"])
    init_logger(config)
    logger = logging.getLogger()
    logger.info(config)
    log_unused_settings(config, logger)

    recbole_dataset, loaders = checked_data(config, logger)
    train_data, _, test_data = loaders

    model = new_model(config, train_data)
    logger.info(model)
    log_flops(config, model, recbole_dataset, logger)
    trainer = trainer_for(config, model)
    trainer.saved_model_file = checkpoint_file or unique_checkpoint_path(config)
    trainer.run_start = start
    resume_file = keep_resume_state(config, saved, trainer, loaders, resume_file, state, deadline)

    try:
        best_valid_score, best_valid_result = _fit(trainer, loaders, config, saved, resume_file)
        test_result = trainer.evaluate(
            test_data, load_best_model=saved, show_progress=config["show_progress"]
        )
        test_per_user = trainer.per_user_ranks()  # before other evaluations replace them
        extra_test_results = evaluate_extra_test_modes(
            config, recbole_dataset, loaders, trainer, saved
        )
    except torch.OutOfMemoryError as error:
        raise TrainingOutOfMemory(config) from error
    log_results(
        logger, best_valid_result, test_result, extra_test_results, config["metric_decimal_place"]
    )

    results = {
        "best_valid_score": float(best_valid_score),
        "best_valid_result": dict(best_valid_result or {}),
        "test_result": dict(test_result),
    }
    summary = run_summary(config, model, trainer, start, saved, results)
    if test_per_user is not None:
        # Per-user ranks let --compare test significance across users (compare.statistics).
        summary["test_per_user"] = test_per_user
    if extra_test_results:
        summary["extra_test_results"] = extra_test_results
    if train_data.noise_report:
        summary["noise"] = train_data.noise_report
    # What a plugin model keeps with the run (e.g. its learned masks).
    if isinstance(model, TransformerRecommender):
        summary["model_report"] = model.run_summary()
    if saved and writing_rank(config):
        write_summary(summary, trainer.saved_model_file)
    if resume_file is not None and resume_file.exists() and not leave_resume_state:
        resume_file.unlink()
    return summary


def _fit(trainer, loaders, config, saved: bool, resume_file):
    """``trainer.fit``; a stop (Ctrl-C, the time limit) leaves the resume state and no
    checkpoint of this segment (``drop_segment_checkpoint``)."""
    try:
        return trainer.fit(
            loaders[0], loaders[1], saved=saved, show_progress=config["show_progress"]
        )
    except KeyboardInterrupt as interrupt:
        drop_segment_checkpoint(trainer, resume_file)
        raise RunInterrupted(_interrupted_training(trainer, resume_file)) from interrupt
    except TimeLimitReached:
        drop_segment_checkpoint(trainer, resume_file)
        raise


def drop_segment_checkpoint(trainer, resume_file) -> None:
    """A run that stops with its resume state (interrupted, or at its time limit) leaves
    no checkpoint of its own: the state holds the best weights so far, and the segment
    that finishes the run writes the checkpoint with its summary.  Each stopped segment
    left one in checkpoint_dir without a summary (14 MB on Beauty)."""
    checkpoint = Path(trainer.saved_model_file)
    if resume_file is not None and Path(resume_file).is_file() and checkpoint.is_file():
        checkpoint.unlink()


def checked_data(config, logger, recbole_dataset=None):
    """``(dataset, loaders)`` of a run or search trial (``recbole_dataset``: one already
    loaded), with the checks around them: the item count and the memory guard before the
    loaders (RecBole's data preparation allocates rows x ``MAX_ITEM_LIST_LENGTH``: a
    length of 1e14 failed inside it), the split rows after."""
    if recbole_dataset is None:
        recbole_dataset = create_dataset(config)
    logger.info(recbole_dataset)
    check_item_count(config, recbole_dataset)
    users_longest = longest_history(recbole_dataset)
    check_memory(config, recbole_dataset, logger, users_longest)
    _, loaders = load_splits(config, recbole_dataset)
    check_split_rows(config, recbole_dataset, *loaders)
    warn_about_padding(config, users_longest, logger)
    return recbole_dataset, loaders


def log_unused_settings(config, logger) -> None:
    """Name the settings only other models read (``FreqConfig.unused_settings``), once."""
    unused = getattr(config, "unused_settings", None)
    if unused:
        logger.warning(
            f"settings that {config['model']} does not read (other models do; RecBole "
            f"ignores them too): {', '.join(unused)}"
        )


def keep_resume_state(config, saved, trainer, loaders, resume_file, state, deadline=None):
    """The run's resume file (``resume``), written before each epoch, and the state it
    continues from, if any: the file it names, or the one beside its checkpoint.  A
    run that saves nothing, or a data-parallel one, keeps none (``None``).  With a
    ``deadline``, each epoch boundary then checks it (``resume.EpochDeadline``)."""
    if saved and not is_data_parallel(config):
        resume_file = Path(resume_file or resume_file_for(trainer.saved_model_file))
        if state is None and resume_file.is_file():
            state = load_resume_state(resume_file)
            # The run's own resume state (a grid's partial/, a time-limited run): its
            # command has no --trust_data to advise.
            check_resume_data(state, config, resume_file, trust_option=False)
        check_deadline = EpochDeadline(deadline) if deadline is not None else None

        def before_epoch(epoch: int) -> None:
            save_resume_state(resume_file, trainer, loaders, epoch)
            if check_deadline is not None:
                check_deadline(trainer, epoch)

        trainer.before_epoch = before_epoch
    elif deadline is not None:
        raise ValueError("a time limit needs a saved, one-process run (it keeps a resume state)")
    else:
        resume_file = None
    if state is not None:
        differences = settings_differences(state["config"], config)
        if differences:
            raise ResumeError(
                f"{resume_file} was written by a run with other settings ("
                + "; ".join(differences[:3])
                + "); delete it to start this run afresh"
            )
        apply_resume_state(state, trainer, loaders)
        continue_log(state.get("log_file"), trainer.segments)
        logging.getLogger().info(f"resumed from {resume_file} at epoch {trainer.start_epoch}")
    return resume_file


def run_summary(config, model, trainer, start: float, saved: bool, results) -> dict:
    """What a run keeps of itself (``<checkpoint>.json``): its settings, ``results``
    (best validation and test), epochs, time, size and files."""
    n_epochs = len(trainer.history)
    best_state = trainer.best_in_memory if saved else None
    parallel = is_data_parallel(config)
    summary = {
        "model": config["model"],
        "dataset": config["dataset"],
        "protocol": protocol_record(config),
        "training_loss": training_loss_label(model, config),
        "seed": config["seed"],
        "device": str(config["device"]),
        "environment": environment_record(config),
        # A resumed run's earlier segments, each as its resume state recorded it.
        "earlier_segments_environment": trainer.earlier_environments,
        "valid_metric": config["valid_metric"],
        **results,
        "epochs_run": n_epochs,
        "best_epoch": trainer.best_epoch,
        "stopped_early": n_epochs < trainer.epochs,
        # False for a count model (TransitionCount): one epoch that only validates.
        "learns_by_gradient": trainer.learns,
        "train_seconds_per_epoch": trainer.train_seconds / max(n_epochs, 1),
        # A resumed run's total counts its earlier segments up to their last resume state.
        "total_seconds": (trainer.earlier_seconds or 0.0) + time.perf_counter() - start,
        "segments": trainer.segments,
        "total_seconds_covers": "every segment"
        if trainer.earlier_seconds is not None
        else "the last segment only (resumed from a state that did not count earlier ones)",
        "parameters": sum(p.numel() for p in model.parameters()),
        "processes": int(config["world_size"]) if parallel else 1,
        "checkpoint": trainer.saved_model_file if saved else None,
        "weights_sha256": weights_fingerprint(best_state["state_dict"]) if best_state else None,
        "log_file": current_log_file(),
        "dataset_sha256": config["dataset_sha256"],
        "history": trainer.history,
        "config": {key: plain_value(config[key]) for key in config.final_config_dict},
    }
    return summary


def write_summary(summary: dict, checkpoint_file) -> None:
    """``summary`` as ``<checkpoint>.json``, whole or not at all; a failure keeps the
    summary on the error (``SummaryNotWrittenError``)."""
    summary_file = Path(checkpoint_file).with_suffix(".json")
    summary["summary_file"] = str(summary_file)
    try:
        write_atomic(summary_file, json.dumps(summary, indent=2, default=str))
    except OutputWriteError as error:
        summary["summary_file"] = None
        kept = SummaryNotWrittenError(
            error.errno,
            f"{error}; the run itself finished: its results are printed above and "
            f"its checkpoint {checkpoint_file} was kept",
        )
        kept.summary = summary
        raise kept from error


def _interrupted_training(trainer, resume_file) -> str:
    epoch = trainer.current_epoch
    if resume_file is not None and Path(resume_file).is_file():
        done = "epoch 0 is" if epoch == 1 else f"epochs 0-{epoch - 1} are"
        if comparison_folder_of(resume_file) is not None:
            advice = f"Continue with the same command: {invoked_command()}"
        else:
            advice = f"Resume with: {invoked_command()} --resume {resume_file}"
        return f"training stopped in epoch {epoch}; {done} kept in {resume_file}. {advice}"
    return f"training stopped in epoch {epoch}, before any epoch completed; nothing to resume"


class SummaryNotWrittenError(OutputWriteError):
    """The run finished but its summary file could not be written; ``summary`` holds it."""

    summary: dict


def load_splits(config, dataset=None):
    """The data half of config -> dataset -> splits -> model, the sequence every job and
    benchmark runs: seed, ``create_dataset`` (unless ``dataset`` is given), then
    ``data_preparation``, the synthetic noise of ``noise_ratio`` (``data.noise``; its report is
    ``train_data.noise_report``, None without noise) and the run's protocol
    (``protocol.apply_protocol``).  In a data-parallel process only the training loader
    is sharded (``quick_start.distributed``).  Returns ``(dataset, (train_data, valid_data, test_data))``."""
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
    training split, with the threads and deterministic algorithms the config asks for
    (``utils.reproducibility``)."""
    apply_determinism(config)
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
    model_class = builtin_class(get_model_class(config["model"]), config)
    if config["model"] == "FEARec":
        check_fearec_delays(config)
    try:
        model = model_class(config, dataset)
    except ValueError:
        raise  # the plugin's models already say what is wrong
    except (ArithmeticError, AssertionError, LookupError, RuntimeError, TypeError) as error:
        unset = _unset_settings_read_by(model_class, config)
        if unset:
            raise ModelBuildError(
                f"{config['model']} cannot be built: settings its code reads are not set: "
                f"{', '.join(unset)} (give them in {config['model']}.yaml beside its module, "
                f"--config_files or the command line; {type(error).__name__}: {error})"
            ) from error
        raise ModelBuildError(
            f"{config['model']} cannot be built with these settings: "
            f"{type(error).__name__}: {error or 'assertion failed'}"
        ) from error
    return model.to(config["device"])


def _unset_settings_read_by(model_class, config) -> list[str]:
    """The settings a researcher's own model class's module reads (``config["key"]``)
    that no file or flag set: the likely cause of a ``None`` deep in its constructor."""
    from recbole_freq.config.settings import _keys_read_in
    from recbole_freq.config.user_models import is_user_model

    unset = []
    for klass in model_class.__mro__:
        if not is_user_model(klass):
            continue
        try:
            source = inspect.getsource(sys.modules[klass.__module__])
        except (KeyError, OSError, TypeError):
            continue
        unset += [key for key in sorted(_keys_read_in(source)) if config[key] is None]
    return list(dict.fromkeys(unset))


def log_flops(config, model, dataset, logger) -> None:
    """Count and log the model's FLOPs where RecBole's ``run_recbole`` does.  The count
    applies the model's transform to one row (BERT4Rec's masking draws from Python's
    ``random``) before one ``predict``, so counting at the same point keeps every later
    draw, and with it a RecBole model's numbers, equal to ``run_recbole``'s."""
    transform = construct_transform(config)
    flops = get_flops(model, dataset, config["device"], logger, transform)
    logger.info(set_color("FLOPs", "blue") + f": {flops}")


def log_results(logger, best_valid_result, test_result, extra_test_results, places=4) -> None:
    """The closing lines of RecBole's ``run_recbole`` log, which users grep for.  The
    validation result is kept unrounded (the strict stopping rule compares it so); it is
    shown to ``metric_decimal_place`` places, as RecBole rounds the test result."""
    shown = {key: round(float(value), places) for key, value in (best_valid_result or {}).items()}
    logger.info(set_color("best valid ", "yellow") + f": {dict2str(shown)}")
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
