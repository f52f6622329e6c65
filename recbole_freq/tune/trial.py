"""One trial of a search, run in a Ray worker: train one configuration with RecBole's
trainer and report its validation metric after every evaluation epoch."""

from __future__ import annotations

import os

from recbole_freq.files import plain_value
from recbole_freq.memory import check_memory, longest_history


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


def run_trial(params: dict, job: dict, shared_dataset=None) -> None:
    """Ray Tune function trainable: train one configuration with RecBole's trainer.

    Reports after every validation epoch ``valid_score`` (the ``valid_metric``), the
    other validation metrics as ``valid_<metric>`` and ``train_loss``; then evaluates
    the test split once on the best epoch's checkpoint and reports a final result with
    ``final: True``, ``valid_score`` = best validation score and ``test_<metric>``.
    """
    import ray
    from ray import tune
    from recbole.data import create_dataset
    from recbole.utils import init_logger, init_seed

    from recbole_freq.config import FreqConfig
    from recbole_freq.data import check_prepared, dataset_fingerprint
    from recbole_freq.evaluation import use_full_sort_for_sampled_scoring
    from recbole_freq.protocol import protocol_label, protocol_trainer
    from recbole_freq.quick_start import (
        TrainingRecorder,
        evaluate_extra_test_modes,
        load_splits,
        new_model,
        unique_checkpoint_path,
    )

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
    if shared_dataset is None:
        check_prepared(config)
        dataset = create_dataset(config)
    else:
        # The driver loaded and filtered the data with settings equal to this trial's
        # in every dataset key (this is the trial's own deserialized copy); the split and
        # loaders below follow the trial's config.
        dataset = shared_dataset
        dataset.config = config
    users_longest = longest_history(dataset)
    _, (train_data, valid_data, test_data) = load_splits(config, dataset)
    check_memory(config, dataset, users_longest=users_longest)

    model = new_model(config, train_data)
    use_full_sort_for_sampled_scoring(model)
    trainer = protocol_trainer(config, model)
    trainer.saved_model_file = unique_checkpoint_path(config)
    recorder = TrainingRecorder(trainer)
    recorder.after_valid = lambda epoch: tune.report(
        {
            "valid_score": epoch["valid_score"],
            "epoch": epoch["epoch"],
            "train_loss": epoch["train_loss"],
            **{f"valid_{key}": float(value) for key, value in epoch["valid"].items()},
        }
    )
    best_valid_score, best_valid_result = trainer.fit(
        train_data, valid_data, saved=True, show_progress=False
    )
    test_result = trainer.evaluate(test_data, load_best_model=True, show_progress=False)
    extra = evaluate_extra_test_modes(
        config, dataset, (train_data, valid_data, test_data), trainer, True
    )
    final = {
        "final": True,
        "protocol": protocol_label(config),
        "valid_score": float(best_valid_score),
        "best_epoch": recorder.best_epoch,
        "epochs_run": len(recorder.epochs),
        "device": str(config["device"]),
        "checkpoint_file": trainer.saved_model_file,
        "shared_dataset": shared_dataset is not None,
        **{f"valid_{key}": float(value) for key, value in (best_valid_result or {}).items()},
        **{f"test_{key}": float(value) for key, value in test_result.items()},
    }
    for mode, result in extra.items():
        final.update({f"test_{mode}_{key}": float(value) for key, value in result.items()})
    tune.report(final)
