"""One trial of a search, run in a Ray worker: train one configuration with RecBole's
trainer and report its validation metric after every evaluation epoch, with a Ray
checkpoint that lets the trial continue (``--resume``) and be tested after ASHA stops it."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from recbole_freq.jobs.tune.store import TrialStore, replay_reports
from recbole_freq.utils.files import plain_value


def trial_device_overrides(gpu_ids) -> dict:
    """RecBole settings that keep a trial on the devices Ray gave it.

    RecBole's ``Config`` writes ``gpu_id`` (default ``0``) into ``CUDA_VISIBLE_DEVICES``.
    With no GPU assigned the trial must stay on the CPU even on a GPU node; with GPUs
    assigned it must use exactly those, which Ray has put in ``CUDA_VISIBLE_DEVICES``.
    """
    if not gpu_ids:
        return {"gpu_id": "", "use_gpu": False}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(str(g) for g in gpu_ids)
    return {"gpu_id": visible, "use_gpu": True}


# The file in each Ray checkpoint of a trial: the run's resume state after an epoch.
TRIAL_STATE = "trial_state.pth"


def run_trial(params: dict, job: dict, shared_dataset=None) -> None:
    """Ray Tune function trainable: train one configuration with RecBole's trainer.

    Reports after every validation epoch ``valid_score`` (the ``valid_metric``), the
    other validation metrics as ``valid_<metric>`` and ``train_loss``, with a Ray
    checkpoint holding the run's resume state (``recbole_freq.quick_start.resume``: weights,
    optimizer, early stopping, best weights so far, history, random generators); then
    evaluates the test split once on the best epoch's weights and reports a final result
    with ``final: True``, ``valid_score`` = best validation score and ``test_<metric>``.
    A trial that Ray restores (a resumed search) continues from its checkpoint's epoch
    with the state it had there; one that ASHA stops is tested from its checkpoint
    afterwards (``test_stopped_trial``).  With a trial store (``job["trial_store"]``,
    ``store``) every report and state is also kept there, and a trial the store already
    holds replays it instead of training those epochs again.
    """
    from ray import tune

    config = _trial_config(params, job)
    store = TrialStore(job["trial_store"]) if job.get("trial_store") else None
    record, state = None, None
    restored = tune.get_checkpoint()
    if store is not None:
        record = store.read(params, config)
        if record is not None and restored is None:
            state = store.load_state(params)
            if _replay(record, state, store.state_path(params), tune):
                return
    if restored is not None:
        from recbole_freq.quick_start.resume import load_resume_state

        with restored.as_directory() as folder:
            state = load_resume_state(Path(folder) / TRIAL_STATE)
    _train_trial(config, shared_dataset, state, (store, params, record))


def _replay(record: dict, state, state_file: Path, tune) -> bool:
    """Send a stored trial's reports to Ray again (``store.replay_reports``), the last
    one of an unfinished trial with its resume state as the checkpoint; True when the
    trial had finished (nothing is left to train)."""
    reports, finished = replay_reports(record, state)
    for number, report in enumerate(reports, 1):
        report = {**report, "replayed": True}
        if finished or number < len(reports):
            tune.report(report)
            continue
        with tempfile.TemporaryDirectory() as folder:
            shutil.copyfile(state_file, Path(folder) / TRIAL_STATE)
            tune.report(report, checkpoint=tune.Checkpoint.from_directory(folder))
    return finished


def _train_trial(config, shared_dataset, state, stored) -> None:
    """Train (or go on training from ``state``), report each validation epoch with its
    checkpoint, test the best epoch and send the final report."""
    from ray import tune

    from recbole_freq.protocol import protocol_label
    from recbole_freq.quick_start.quick_start import evaluate_extra_test_modes
    from recbole_freq.quick_start.resume import save_resume_state

    store, params, record = stored
    dataset, loaders, trainer = _trial_trainer(config, shared_dataset, state)
    train_data, valid_data, test_data = loaders
    kept = {"record": record, "first": True}

    def report_epoch(epoch_idx, valid_score):
        # After RecBole's early-stopping bookkeeping of the epoch: the state saved is the
        # one the next epoch starts from, best weights included.
        epoch = trainer.history[-1]
        metrics = {
            "valid_score": epoch["valid_score"],
            "epoch": epoch["epoch"],
            "train_loss": epoch["train_loss"],
            **{f"valid_{key}": float(value) for key, value in epoch["valid"].items()},
        }
        with tempfile.TemporaryDirectory() as folder:
            state_file = Path(folder) / TRIAL_STATE
            save_resume_state(state_file, trainer, loaders, epoch_idx + 1)
            if store is not None:
                kept["record"] = store.add_report(
                    params, config, kept["record"], metrics, state_file, kept["first"]
                )
                kept["first"] = False
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))

    best_valid_score, best_valid_result = trainer.fit(
        train_data, valid_data, saved=True, show_progress=False, callback_fn=report_epoch
    )
    test_result = trainer.evaluate(test_data, load_best_model=True, show_progress=False)
    extra = evaluate_extra_test_modes(config, dataset, loaders, trainer, True)
    final = {
        "final": True,
        "protocol": protocol_label(config),
        "valid_score": float(best_valid_score),
        "best_epoch": trainer.best_epoch,
        "epochs_run": len(trainer.history),
        "device": str(config["device"]),
        "checkpoint_file": trainer.saved_model_file,
        "shared_dataset": shared_dataset is not None,
        **{f"valid_{key}": float(value) for key, value in (best_valid_result or {}).items()},
        **{f"test_{key}": float(value) for key, value in test_result.items()},
    }
    for mode, result in extra.items():
        final.update({f"test_{mode}_{key}": float(value) for key, value in result.items()})
    if store is not None:
        store.finish(params, config, kept["record"], final)
    tune.report(final)


def _trial_config(params: dict, job: dict):
    """The trial's configuration: the job's fixed settings, the trial's parameters, the
    devices Ray gave it, and the fingerprint of the data it finds."""
    import ray
    from recbole.utils import init_logger, init_seed

    from recbole_freq.config.configurator import FreqConfig
    from recbole_freq.data.guard import dataset_fingerprint

    params = {name: plain_value(value) for name, value in params.items()}
    overrides = {**job["overrides"], **trial_device_overrides(ray.get_gpu_ids())}
    config = FreqConfig(
        job["model"],
        job["dataset"],
        job["config_files"],
        config_dict={**job["config_dict"], "show_progress": False, **params},
        cmd_overrides=overrides,
        paper=job["paper"],
    )
    init_seed(config["seed"], config["reproducibility"])
    init_logger(config)
    if os.path.isdir(config["data_path"]):  # not on a node that got only the shared copy
        config["dataset_sha256"] = dataset_fingerprint(config)
    return config


def _trial_trainer(config, shared_dataset, state):
    """``(dataset, loaders, trainer)`` of one trial: its data (the driver's shared copy,
    or loaded here) and a trainer that continues from ``state`` (its Ray checkpoint's or
    its store's resume state) when there is one."""
    from recbole_freq.data.guard import check_prepared
    from recbole_freq.protocol import trainer_for
    from recbole_freq.quick_start.quick_start import (
        checked_data,
        log_flops,
        new_model,
        unique_checkpoint_path,
    )
    from recbole_freq.quick_start.resume import (
        ResumeError,
        apply_resume_state,
        settings_differences,
    )

    if shared_dataset is None:
        check_prepared(config)
    else:
        # The driver loaded and filtered the data with settings equal to this trial's
        # in every dataset key (this is the trial's own deserialized copy); the split and
        # loaders below follow the trial's config.
        shared_dataset.config = config
    dataset, loaders = checked_data(config, logging.getLogger(), shared_dataset)

    model = new_model(config, loaders[0])
    # As `run` does: the count draws random numbers (dropout, BERT4Rec's masking), so a
    # trial trains exactly as a run of its configuration (best.yaml) does.
    log_flops(config, model, dataset, logging.getLogger())
    trainer = trainer_for(config, model)
    trainer.saved_model_file = unique_checkpoint_path(config)
    if state is not None:
        differences = settings_differences(state["config"], config)
        if differences:
            raise ResumeError(
                "the trial's checkpoint was written with other settings ("
                + "; ".join(differences[:3])
                + ")"
            )
        apply_resume_state(state, trainer, loaders)
    return dataset, loaders, trainer


def test_stopped_trial(checkpoint) -> dict:
    """``test_<metric>`` (and ``test_<mode>_<metric>`` of ``extra_test_modes``) of a trial
    that ASHA stopped, from the best weights in its last Ray checkpoint, evaluated here as
    the trial would have at its end; ``best_epoch``: the epoch those weights are from."""
    from recbole_freq.checkpoint.loader import in_one_process
    from recbole_freq.protocol import protocol_label, trainer_for
    from recbole_freq.quick_start.quick_start import (
        evaluate_extra_test_modes,
        load_splits,
        new_model,
    )
    from recbole_freq.quick_start.restore import fill_core_defaults
    from recbole_freq.quick_start.resume import load_resume_state

    with checkpoint.as_directory() as folder:
        state = load_resume_state(Path(folder) / TRIAL_STATE)
    if state["best_state"] is None:
        return {}
    config = state["config"]
    in_one_process(config)
    fill_core_defaults(config)
    config["show_progress"] = False
    # The trial's device may be a GPU Ray gave it; the driver tests where it can.
    import torch

    if config["device"].type == "cuda" and not torch.cuda.is_available():
        config["device"] = torch.device("cpu")
    dataset, loaders = load_splits(config)
    model = new_model(config, loaders[0])
    model.load_state_dict(state["best_state"]["state_dict"])
    trainer = trainer_for(config, model)
    test_result = trainer.evaluate(loaders[2], load_best_model=False, show_progress=False)
    extra = evaluate_extra_test_modes(config, dataset, loaders, trainer, False)
    tested = {"protocol": protocol_label(config)}
    tested.update({f"test_{key}": float(value) for key, value in test_result.items()})
    for mode, result in extra.items():
        tested.update({f"test_{mode}_{key}": float(value) for key, value in result.items()})
    return tested
