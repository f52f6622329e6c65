"""Every fix that RecBole 1.2.1 needs to run on our modern stack, in one place.

RecBole 1.2.1 was written for numpy 1.x, pandas 1.x/2.x, torch < 2.6 and Ray <= 2.6.3.
Each fix below names the break it repairs; none changes what RecBole computes, so
RecBole's built-in models and evaluators behave as on the stack they were written for.

1. numpy 2 removed the aliases ``np.float_``, ``np.complex_`` and ``np.unicode_``.
   ``recbole.config.Config.compatibility_settings`` reads them (and then re-creates
   ``np.float``, ``np.int``, ``np.bool`` ... for RecBole's evaluators, which use
   ``np.float`` in ``recbole/evaluator/metrics.py``).  We restore exactly the types the
   old aliases named (float64, complex128, str_), and the others too so that RecBole
   code running before any ``Config`` exists works.
2. torch >= 2.6 made ``torch.load(weights_only=True)`` the default, and RecBole's
   checkpoints hold a pickled ``Config``, so ``Trainer.evaluate(load_best_model=True)``
   fails.  We give RecBole's trainer and quick-start modules a ``torch`` whose ``load``
   uses the full (unsafe, pickle) loader **only** for checkpoint files that this process
   itself wrote through ``Trainer._save_checkpoint``; any other file is loaded with
   ``weights_only=True`` and so cannot run code from the file.
3. pandas 3 breaks RecBole silently (chained ``fillna(..., inplace=True)`` fills nothing
   under copy-on-write) and loudly (id remapping on datasets with ``.user``/``.item``
   files).  There is no safe patch for a silent change, so we require pandas < 3 and say
   so at import time.  pandas 2.x's ``FutureWarning`` about exactly these calls, printed
   several times per dataset load, is then only noise and is silenced for RecBole's
   dataset module alone.
4. Importing RecBole's sequential models runs ``sine.py``, which calls
   ``torch.autograd.set_detect_anomaly(True)`` for the whole process: every later
   backward pass of every model is checked and traced, several times slower, with
   identical results.  We import that package once here and restore the anomaly setting
   the caller had.
5. RecBole's wheel pins ``ray<=2.6.3``, which cannot import on numpy 2.  RecBole itself
   never imports Ray outside its own ``run_hyper`` path, so the plugin installs RecBole
   with ``--no-deps`` next to a current Ray (see README); nothing to patch here.

6. ``recbole.utils.ensure_dir`` checks ``os.path.exists`` and then calls ``os.makedirs``,
   so two runs starting together (parallel Ray trials, comparison workers) crash with
   ``FileExistsError`` on ``log/<model>``.  Every module that imported it gets a version
   that creates the folder with ``exist_ok=True``.

7. ``recbole.utils.init_logger`` ends with ``logging.basicConfig(handlers=[stream, file])``,
   which does nothing once the root logger has handlers.  Every later run in the same
   process (a comparison, a reused Ray worker, a test session) wrote into the first run's
   log file, with the first run's level, and left its own log file empty.  The replacement
   swaps the handlers of the previous run (closing its file) for the new run's, and keeps
   handlers that others installed (pytest, Ray).

``apply()`` is idempotent and runs when ``recbole_freq`` is imported.
"""

from __future__ import annotations

import logging
import os
import types
import warnings

import numpy as np

_NUMPY_ALIASES = {
    "float_": np.float64,
    "complex_": np.complex128,
    "unicode_": np.str_,
    "bool": np.bool_,
    "int": np.int_,
    "float": np.float64,
    "complex": np.complex128,
    "object": np.object_,
    "str": np.str_,
    "long": np.int_,
}

# Real paths of checkpoints written by this process: the only files the unsafe loader opens.
_SELF_WRITTEN_CHECKPOINTS: set[str] = set()
_applied = False


def _restore_numpy_aliases() -> None:
    for name, value in _NUMPY_ALIASES.items():
        if name not in np.__dict__:
            setattr(np, name, value)


def _require_pandas_below_3() -> None:
    import pandas as pd

    major = int(pd.__version__.split(".")[0])
    if major >= 3:
        raise ImportError(
            f"recbole-freq needs pandas < 3 (found {pd.__version__}): RecBole 1.2.1 "
            "silently fills no missing values under pandas 3's copy-on-write and fails "
            "to remap ids. Install a supported version: pip install 'pandas>=2.2,<3'"
        )


def _silence_pandas_chained_assignment_notice() -> None:
    # Only RecBole's dataset module: the same notice from user code still shows (fix 3).
    warnings.filterwarnings(
        "ignore",
        message="A value is trying to be set on a copy of a DataFrame or Series through "
        "chained assignment",
        category=FutureWarning,
        module=r"recbole\.data\.dataset\.dataset",
    )


def register_own_checkpoint(path: str) -> None:
    """Mark ``path`` as written by this process, so the full loader may open it."""
    _SELF_WRITTEN_CHECKPOINTS.add(os.path.realpath(path))


def is_own_checkpoint(path) -> bool:
    return isinstance(path, (str, os.PathLike)) and (
        os.path.realpath(path) in _SELF_WRITTEN_CHECKPOINTS
    )


class UntrustedCheckpointError(RuntimeError):
    pass


def _policy_load(f, *args, **kwargs):
    """``torch.load`` for RecBole: pickle only what this process wrote itself."""
    import torch

    if "weights_only" not in kwargs:
        kwargs["weights_only"] = not is_own_checkpoint(f)
    try:
        return torch.load(f, *args, **kwargs)
    except Exception as error:  # torch raises UnpicklingError subclasses of Exception
        if kwargs["weights_only"] and "Weights only load failed" in str(error):
            raise UntrustedCheckpointError(
                f"refusing to unpickle {f!r}: it was not written by this run, and a "
                "RecBole checkpoint holds arbitrary pickled objects that could run code. "
                "Only checkpoints that the same process saved are loaded with the full "
                "loader."
            ) from error
        raise


def _torch_with_policy_load() -> types.ModuleType:
    import torch

    shim = types.ModuleType("torch_with_checkpoint_policy")
    shim.__getattr__ = lambda name: getattr(torch, name)  # noqa: E731 (module __getattr__)
    shim.load = _policy_load
    return shim


def _patch_recbole_checkpoint_loading() -> None:
    import recbole.quick_start.quick_start as quick_start
    import recbole.trainer.trainer as trainer_module

    shim = _torch_with_policy_load()
    trainer_module.torch = shim
    quick_start.torch = shim

    original_save = trainer_module.Trainer._save_checkpoint

    def _save_checkpoint(self, epoch, verbose=True, **kwargs):
        target = kwargs.get("saved_model_file", self.saved_model_file)
        original_save(self, epoch, verbose=verbose, **kwargs)
        register_own_checkpoint(target)

    _save_checkpoint.__wrapped__ = original_save
    trainer_module.Trainer._save_checkpoint = _save_checkpoint


def _contain_sine_anomaly_detection() -> None:
    import torch

    enabled = torch.is_anomaly_enabled()
    import recbole.model.sequential_recommender  # noqa: F401  (runs sine.py once)

    torch.autograd.set_detect_anomaly(enabled)


def ensure_dir_race_free(dir_path: str) -> None:
    """RecBole's ``ensure_dir`` without the check-then-create race (fix 6)."""
    os.makedirs(dir_path, exist_ok=True)


def _make_ensure_dir_race_free() -> None:
    import importlib

    for name in (
        "recbole.utils.utils",
        "recbole.utils",
        "recbole.utils.logger",
        "recbole.trainer.trainer",
        "recbole.data.dataset.dataset",
        "recbole.data.utils",
    ):
        module = importlib.import_module(name)
        if hasattr(module, "ensure_dir"):
            module.ensure_dir = ensure_dir_race_free


# Marks the root-logger handlers that a run's ``init_logger`` installed (fix 7).
_RUN_HANDLER_FLAG = "_recbole_freq_run_handler"


def _init_logger_per_run(original):
    def init_logger(config):
        root = logging.getLogger()
        installed_by_others = [h for h in root.handlers if not hasattr(h, _RUN_HANDLER_FLAG)]
        for handler in list(root.handlers):
            root.removeHandler(handler)
            if hasattr(handler, _RUN_HANDLER_FLAG):
                handler.close()
        try:
            original(config)  # basicConfig now installs this run's stream and file handlers
        finally:
            for handler in root.handlers:
                setattr(handler, _RUN_HANDLER_FLAG, True)
            for handler in installed_by_others:
                root.addHandler(handler)

    init_logger.__wrapped__ = original
    return init_logger


def _give_each_run_its_own_log() -> None:
    import recbole.quick_start.quick_start as quick_start
    import recbole.utils
    import recbole.utils.logger

    replacement = _init_logger_per_run(recbole.utils.logger.init_logger)
    for module in (recbole.utils.logger, recbole.utils, quick_start):
        module.init_logger = replacement


def apply() -> None:
    """Install every fix once; safe to call repeatedly."""
    global _applied
    if _applied:
        return
    _restore_numpy_aliases()
    _require_pandas_below_3()
    _silence_pandas_chained_assignment_notice()
    _patch_recbole_checkpoint_loading()
    _contain_sine_anomaly_detection()
    _make_ensure_dir_race_free()
    _give_each_run_its_own_log()
    _applied = True
