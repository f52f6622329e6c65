"""Resume an interrupted training run from its last completed epoch.

At the start of every training epoch after the first, the run writes a *resume state*
(``<checkpoint>.resume.pth``, atomically): everything that decides what happens next,

- the model's weights and the optimizer's state,
- RecBole's early-stopping state (``cur_step``, best validation score and result) and the
  best weights so far (the ones the test evaluation will load),
- the trainer's per-epoch history,
- every random number generator: torch's (CPU and CUDA), numpy's, Python's, and the
  generators of RecBole's data loaders (which shuffle the training data),

so that a resumed run continues exactly where the interrupted one stood: it ends with the
same metrics as an uninterrupted run with the same seed.  The file is read back with the
restricted checkpoint loader (``recbole_freq.checkpoint.loader``), so a resume file runs no code
either; it is removed when the run finishes.

A run given a *deadline* (``--compare --time_limit``) stops at the first epoch boundary
from which its next epoch would end after it (``EpochDeadline``), with its resume state
written: the same command continues it later, on this machine or another.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import numpy as np
import torch

RESUME_FORMAT = 1
RESUME_SUFFIX = ".resume.pth"


class ResumeError(ValueError):
    """A resume state that does not belong to this run or cannot be used."""


def resume_file_for(checkpoint_file: str | os.PathLike) -> Path:
    """``saved/X.pth`` -> ``saved/X.resume.pth``."""
    return Path(checkpoint_file).with_suffix(RESUME_SUFFIX)


def comparison_folder_of(resume_file: str | os.PathLike) -> Path | None:
    """The ``--compare`` output folder whose run ``resume_file`` is (its unfinished runs
    keep their states as ``<out>/partial/<entry>-seed<N>.resume.pth``), or None."""
    import re

    # Also where a linked folder leads: ``ln -s <out>/partial p; --resume p/...`` is the
    # comparison's state all the same.
    for path in (Path(os.path.abspath(resume_file)), Path(os.path.realpath(resume_file))):
        if path.parent.name == "partial" and re.search(r"-seed-?\d+\.resume\.pth$", path.name):
            return path.parent.parent
    return None


def checkpoint_file_for(resume_file: str | os.PathLike) -> Path:
    """``saved/X.resume.pth`` -> ``saved/X.pth``: where ``--resume`` writes the run's
    checkpoint, whatever the file's content says."""
    path = Path(resume_file)
    return path.with_name(path.name.removesuffix(RESUME_SUFFIX) + ".pth")


def _rng_state() -> dict:
    keys, position, has_gauss, cached = np.random.get_state()[1:]
    python_state = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "numpy_position": int(position),
        "numpy_has_gauss": int(has_gauss),
        "numpy_cached_gaussian": float(cached),
        "python_version": python_state[0],
        "python_state": list(python_state[1]),
    }


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    np.random.set_state(
        (
            "MT19937",
            state["numpy_keys"].numpy().astype(np.uint32),
            state["numpy_position"],
            state["numpy_has_gauss"],
            state["numpy_cached_gaussian"],
        )
    )
    random.setstate((state["python_version"], tuple(state["python_state"]), None))


def save_resume_state(path, trainer, loaders, next_epoch: int) -> None:
    """Write the state before epoch ``next_epoch`` (all earlier epochs complete)."""
    from recbole_freq.checkpoint.schema import to_plain_checkpoint
    from recbole_freq.compat.logs import current_log_file
    from recbole_freq.utils.files import write_atomic
    from recbole_freq.utils.reproducibility import environment_record

    best = trainer.best_in_memory
    state = {
        "format": RESUME_FORMAT,
        "config": trainer.config,
        "state_dict": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "next_epoch": next_epoch,
        "cur_step": trainer.cur_step,
        "best_valid_score": trainer.best_valid_score,
        "best_valid_result": dict(trainer.best_valid_result or {}),
        "best_state": None if best is None else {"state_dict": best["state_dict"]},
        "history": trainer.history,
        "train_seconds": trainer.train_seconds,
        "elapsed_seconds": elapsed_seconds(trainer),
        "segments": trainer.segments,
        "environments": [*trainer.earlier_environments, environment_record(trainer.config)],
        # The later segments append to this run's log (compat.logs.continue_log).
        "log_file": current_log_file(),
        "rng": _rng_state(),
        "loader_generators": [loader.generator.get_state() for loader in loaders],
    }
    plain = to_plain_checkpoint(state)  # read back by torch's weights-only loader
    write_atomic(path, lambda handle: torch.save(plain, handle))


class TimeLimitReached(Exception):
    """A run stopped at an epoch boundary because its next epoch would end after its
    deadline; ``progress``: epochs done, best validation score so far and its epoch."""

    def __init__(self, message: str, progress: dict):
        super().__init__(message, progress)
        self.progress = progress

    def __str__(self) -> str:
        return self.args[0]


class EpochDeadline:
    """Called at each epoch boundary after the resume state is written: raises
    ``TimeLimitReached`` when the next epoch, estimated by the last one (training and
    validation; the first of a segment also counts the data loading), would end after
    ``deadline`` (seconds since the epoch, ``time.time()``: one clock for every process
    of the machine)."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.last_boundary = time.time()

    def __call__(self, trainer, next_epoch: int) -> None:
        now = time.time()
        last_epoch_seconds = now - self.last_boundary
        self.last_boundary = now
        if now + last_epoch_seconds <= self.deadline:
            return
        progress = {
            "epochs_done": next_epoch,
            "best_valid_score": float(trainer.best_valid_score),
            "best_epoch": trainer.best_epoch,
            "valid_metric": trainer.config["valid_metric"],
        }
        raise TimeLimitReached(
            f"stopped at the time limit before epoch {next_epoch} (its last epoch took "
            f"{last_epoch_seconds:.0f} s)",
            progress,
        )


def elapsed_seconds(trainer) -> float | None:
    """Wall seconds of the run so far, earlier segments included (``None`` when a
    segment's state predates the count)."""
    import time

    if trainer.earlier_seconds is None:
        return None
    return trainer.earlier_seconds + time.perf_counter() - trainer.run_start


def load_resume_state(path) -> dict:
    """The resume state at ``path``, loaded with the restricted loader."""
    from recbole_freq.checkpoint.loader import load_checkpoint

    state = load_checkpoint(path)
    if state.get("format") != RESUME_FORMAT or "next_epoch" not in state:
        raise ResumeError(
            f"{path} is not a recbole-freq resume state (those end in {RESUME_SUFFIX} and "
            "are written next to the checkpoint of a run in progress)"
        )
    # Kept apart: the run recomputes its config's fingerprint from the data it finds.
    state["dataset_sha256"] = state["config"]["dataset_sha256"]
    return state


def progress_problem(state: dict, epochs=None, model=None, dataset=None, seed=None) -> str | None:
    """Why ``state`` cannot be where this run stands, or None: its progress must be
    possible (``next_epoch`` epochs done, each in its history, fewer than ``epochs``) and,
    where given, it must be the state of this ``model``, ``dataset`` and ``seed``."""
    next_epoch, history = state.get("next_epoch"), state.get("history")
    if (
        not isinstance(next_epoch, int)
        or isinstance(next_epoch, bool)
        or not isinstance(history, list)
        or next_epoch < 1
        or len(history) != next_epoch
    ):
        count = len(history) if isinstance(history, list) else "no"
        return f"it records next epoch {next_epoch!r} with {count} epoch(s) of history"
    import math

    for entry in history:
        score = entry.get("valid_score") if isinstance(entry, dict) else None
        if score is not None and (
            isinstance(score, bool)
            or not isinstance(score, (int, float))
            or not math.isfinite(score)
        ):
            return f"its history holds the validation score {score!r}, not a finite number"
    if epochs is not None and next_epoch > int(epochs):
        return f"it records {next_epoch} epochs done of a run of {epochs}"
    config = state.get("config")
    for key, wanted in (("model", model), ("dataset", dataset), ("seed", seed)):
        if wanted is None or config is None:
            continue
        try:
            recorded = config[key]
        except KeyError:
            recorded = None
        if str(recorded) != str(wanted):
            return f"it is the state of a run with {key} {recorded}, not {wanted}"
    return None


def best_epoch(state: dict) -> dict | None:
    """The ``history`` entry of the resume state's best epoch so far (the first epoch
    that scored ``best_valid_score``, as the trainer kept it), or ``None``."""
    best = state.get("best_valid_score")
    return next((e for e in state.get("history") or [] if e.get("valid_score") == best), None)


def check_resume_data(
    state: dict, config, resume_file, trust_data=False, trust_option: bool = True
) -> None:
    """The data must be what the interrupted run trained on (``dataset_sha256``);
    ``trust_option``: whether the command has ``--trust_data`` (``--resume``) to advise."""
    from recbole_freq.data.guard import check_recorded_dataset

    check_recorded_dataset(
        config, state["dataset_sha256"], f"resume state {str(resume_file)!r}",
        f"Prepare the data it was trained on again, or delete {resume_file} to start afresh.",
        trust_data, ResumeError, trust_option,
    )  # fmt: skip


def apply_resume_state(state: dict, trainer, loaders) -> None:
    """Put ``trainer`` and the loaders where the saved run stood; the random
    generators last, right before ``fit`` continues.

    The trainer keeps the checkpoint file its caller chose (``trainer.saved_model_file``,
    from the run's configuration or the resume file's location): a resume state names
    no file to write, so a forged one cannot direct the run's output anywhere.  The best
    weights so far are written there at once, so that the checkpoint the run's summary
    names exists even if no later epoch improves on them."""
    problem = progress_problem(state, epochs=trainer.epochs)
    if problem is not None:
        raise ResumeError(
            f"the resume state cannot continue this run: {problem}; delete it to start afresh"
        )
    trainer.model.load_state_dict(state["state_dict"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.start_epoch = state["next_epoch"]
    trainer.cur_step = state["cur_step"]
    trainer.best_valid_score = state["best_valid_score"]
    trainer.best_valid_result = state["best_valid_result"] or None
    if state["best_state"] is not None:
        _save_best_so_far(trainer, state["best_state"]["state_dict"], state)
    trainer.history[:] = state["history"]
    trainer.train_seconds = state["train_seconds"]
    trainer.earlier_seconds = state.get("elapsed_seconds")
    trainer.segments = int(state.get("segments", 1)) + 1
    trainer.earlier_environments = list(state.get("environments") or [_settings_only(state)])
    if len(loaders) != len(state["loader_generators"]):
        raise ResumeError("the resume state was written for other data loaders")
    for loader, generator_state in zip(loaders, state["loader_generators"]):
        loader.generator.set_state(generator_state)
    _set_rng_state(state["rng"])


def _settings_only(state: dict) -> dict:
    """The earlier segments' environment as far as a state written before environment
    records can tell: the device and thread count of its settings."""
    config = state["config"]

    def setting(key):
        try:
            return config[key]
        except KeyError:
            return None

    return {
        "device": str(setting("device")),
        "torch_threads": setting("torch_threads"),
        "recorded": "from the resume state's settings; it predates environment records",
    }


def _save_best_so_far(trainer, best_weights: dict, state: dict) -> None:
    """The trainer's checkpoint of the best epoch so far (RecBole's ``_save_checkpoint``,
    which also keeps those weights in memory for the test evaluation), written with the
    best weights in the model for the moment it takes."""
    model = trainer.model
    current = {name: value.detach().clone() for name, value in model.state_dict().items()}
    model.load_state_dict(best_weights)
    try:
        # cur_step counts the epochs since the best one (RecBole's early stopping).
        trainer._save_checkpoint(state["next_epoch"] - 1 - state["cur_step"], verbose=False)
    finally:
        model.load_state_dict(current)


def settings_differences(saved_config, config) -> list[str]:
    """Settings that differ between the interrupted run and this one (the machine's own
    (device, use_gpu, gpu_id), places and progress display may change: a run continues
    on another machine)."""
    ignored = {"device", "use_gpu", "show_progress", "gpu_id", "checkpoint_dir", "data_path"}
    ignored.add("overlap_loader")  # the same numbers with or without it
    old, new = saved_config.final_config_dict, config.final_config_dict
    return [
        f"{key}: {old.get(key)!r} then, {new.get(key)!r} now"
        for key in sorted(set(old) | set(new))
        if key not in ignored
        and str(old.get(key)) != str(new.get(key))
        and not _added_since(key, old, new)
    ]


def _added_since(key, old: dict, new: dict) -> bool:
    """A setting of the shared core or of every run that the interrupted run's
    configuration predates, now at the default it ran with then
    (``TransformerRecommender.yaml``, ``overall.yaml``: ``adam_beta2`` 0.999 is the Adam
    every earlier run trained with)."""
    from recbole_freq.model.abstract_recommender import core_defaults
    from recbole_freq.utils.property_files import properties_dir, read_config_file

    defaults = {**read_config_file(properties_dir() / "overall.yaml"), **core_defaults()}
    return key not in old and key in defaults and str(new.get(key)) == str(defaults[key])
