"""Every fix that RecBole 1.2.1 needs to run on our modern stack, in one place.

RecBole 1.2.1 was written for numpy 1.x, pandas 1.x/2.x, torch < 2.6 and Ray <= 2.6.3.
Each fix below names the break it repairs; none changes what RecBole computes, so
RecBole's built-in models and evaluators behave as on the stack they were written for.

1. numpy 2 removed the aliases ``np.float_``, ``np.complex_`` and ``np.unicode_``.
   ``recbole.config.Config.compatibility_settings`` reads them (and then re-creates
   ``np.float``, ``np.int``, ``np.bool`` ... for RecBole's evaluators, which use
   ``np.float`` in ``recbole/evaluator/metrics.py``).  We restore exactly the types the
   old aliases named (float64, complex128, str_), and the others too so that RecBole
   code running before any ``Config`` exists works.  RecBole issues #1604, #1714, #2155,
   #2215.  Test: ``test_compat.test_numpy_aliases_name_the_old_types``,
   ``test_recbole_metrics_give_textbook_values``.
2. torch >= 2.6 made ``torch.load(weights_only=True)`` the default, and RecBole's
   checkpoints hold a pickled ``Config``, so ``Trainer.evaluate(load_best_model=True)``
   fails.  Unpickling it in full is no answer: the file at that path may have been
   swapped since it was written, and a pickle runs code.  So the trainer never reads its
   own checkpoint back: when it saves one it keeps a copy of those weights in memory,
   and ``evaluate(load_best_model=True)`` restores that copy.  Every other ``torch.load``
   of RecBole's trainer and quick-start modules (``resume_checkpoint``,
   ``load_data_and_model``, ``evaluate`` of another file) goes through the restricted
   loader of ``recbole_freq.checkpoint.loader``, whoever wrote the file, and their
   ``torch.save`` through the plugin's atomic writer (``recbole_freq.utils.files``), so a
   failed re-save (a full disk) never replaces the previous good checkpoint.
   ``recbole.quick_start.load_data_and_model`` imports torch inside the function, so it
   is replaced as a whole (``load_data_and_model`` below: the same six values, through
   the plugin's ``restore_model``); the quick-start module is patched when it is first
   imported (fix 12).  RecBole issues #2215 (evaluate after training), #2212 (the same
   break in NeuMF).  Tests: ``test_compat.test_recboles_trainer_*``,
   ``test_untrusted_files``, ``test_recbole_habits.test_recboles_load_data_and_model_*``.
3. pandas 3 breaks RecBole silently (chained ``fillna(..., inplace=True)`` fills nothing
   under copy-on-write) and loudly (id remapping on datasets with ``.user``/``.item``
   files).  There is no safe patch for a silent change, so we require pandas < 3 and say
   so at import time.  pandas 2.x's ``FutureWarning`` about exactly these calls, printed
   several times per dataset load, is then only noise and is silenced for RecBole's
   dataset module alone.  No RecBole issue found (searched 2026-11-23).  Tests:
   ``test_pandas_3_is_refused_with_the_fix``, ``test_loading_a_dataset_shows_no_pandas_*``.
4. Importing RecBole's sequential models runs ``sine.py``, which calls
   ``torch.autograd.set_detect_anomaly(True)`` for the whole process: every later
   backward pass of every model is checked and traced, several times slower, with
   identical results.  We import that package once here and restore the anomaly setting
   the caller had.  No RecBole issue found.  Test:
   ``test_recbole_builtins_leave_autograd_anomaly_detection_off``.
5. RecBole's wheel pins ``ray<=2.6.3``, which cannot import on numpy 2.  RecBole itself
   never imports Ray outside its own ``run_hyper`` path, so the plugin installs RecBole
   with ``--no-deps`` next to a current Ray (docs/stack.md); nothing to patch here.
   RecBole issue #2215 (Ray 2.6.3's ``np.bool8`` on numpy 2).

6. ``recbole.utils.ensure_dir`` checks ``os.path.exists`` and then calls ``os.makedirs``,
   so two runs starting together (parallel Ray trials, comparison workers) crash with
   ``FileExistsError`` on ``log/<model>``.  Every module that imported it gets a version
   that creates the folder with ``exist_ok=True``.  No RecBole issue found.  Test:
   ``test_recbole_ensure_dir_tolerates_a_folder_created_meanwhile``.

7. ``recbole.utils.init_logger`` ends with ``logging.basicConfig(handlers=[stream, file])``,
   which does nothing once the root logger has handlers.  Every later run in the same
   process (a comparison, a reused Ray worker, a test session) wrote into the first run's
   log file, with the first run's level, and left its own log file empty.  The replacement
   swaps the handlers of the previous run (closing its file) for the new run's, and keeps
   handlers that others installed (pytest, Ray).  The log file's name holds the time to
   the second and a hash of the config, so two identical runs started together (repeated
   trials, parallel comparison workers) shared one log file and one TensorBoard folder
   (named after it); the time in the name gets a random suffix.  No RecBole issue found.
   Tests: ``test_each_run_in_one_process_writes_its_own_log``,
   ``test_untrusted_files.test_two_identical_runs_started_together_write_separate_logs``.

8. RecBole's ``create_dataset`` and ``data_preparation`` ``pickle.load`` the files
   ``<checkpoint_dir>/<dataset>-<DatasetClass>.pth`` and
   ``<checkpoint_dir>/<dataset>-for-<model>-dataloader.pth`` whenever they exist, and
   whatever ``dataset_save_path`` / ``dataloaders_save_path`` name: any pickle dropped
   into ``saved/`` runs its code in the next run on that dataset.  The replacements build
   the dataset from its atomic files every time and never read a pickle.  A config that
   names a cache to read (``dataset_save_path``, ``dataloaders_save_path``) is refused with
   ``PickledCacheRefused``; ``save_dataset`` / ``save_dataloaders`` are ignored with a
   warning (a cache that is never read is only a trap for other tools).  No RecBole issue
   found.  Tests: ``test_untrusted_files.test_pickled_caches_*``, ``*_pickled_cache_*``.

9. RecBole's ``Dataset._download`` fetches its own version of any dataset whose folder is
   missing, and several of its names (``ml-1m``, ``yelp``, ``lastfm`` ...) denote data
   that differ from the papers' preprocessed sets: a silently different dataset would
   make every number wrong.  For a run of the plugin (its config a ``FreqConfig``) the
   replacement raises ``data.DatasetNotPreparedError``, which names the ``dataset_prep``
   command that prepares it; a program's own ``run_recbole`` in the same process keeps
   RecBole's download.  Tests: ``test_recbole_never_downloads_a_missing_dataset``,
   ``test_recbole_habits.test_a_programs_own_recbole_run_may_download_but_a_plugin_run_never``.

10. ``Collector.get_data_struct`` calls ``.cpu()`` on everything it collected, but the
    item count that ``ItemCoverage``, ``AveragePopularity``, ``GiniIndex`` and
    ``TailPercentage`` need is an ``int``: every run with one of these metrics failed at
    its first evaluation.  The replacement moves only tensors.  RecBole issue #2131.
    Test: ``test_recbole_habits.test_recboles_non_accuracy_metrics_are_evaluated``.

11. RecBole's trainer builds ``torch.cuda.amp.GradScaler`` every epoch, which torch >= 2.4
    deprecates with a ``FutureWarning`` printed into every training run.  The trainer
    module's ``amp`` becomes ``torch.amp``'s ``GradScaler`` and ``autocast`` for
    ``"cuda"``, the same objects without the notice.  No RecBole issue found.  Test:
    ``test_recbole_habits.test_training_prints_no_grad_scaler_deprecation``.

12. ``recbole.quick_start`` imports Ray at module level (for ``run_hyper``), and patching
    it (fixes 2 and 7) imported Ray into every run: seconds of start-up and Ray's own
    warnings for a job that never searches.  Its patches now run when a program first
    imports it (``when_imported``: an import hook that patches the module right after it
    executes), or at once if it already was.  Tests:
    ``test_recbole_habits.test_importing_the_plugin_imports_no_ray_*``,
    ``test_a_plain_training_run_imports_no_ray``.

13. pip cannot install RecBole 1.2.1 next to this stack (fix 5), so ``pip install
    recbole-freq`` leaves it out, and a missing or other RecBole ended in a raw
    ``ModuleNotFoundError`` traceback.  ``require_recbole`` (run first on import) raises
    ``RecBoleMissingError`` naming the one command that installs it; uncaught, it prints
    that one line (no traceback) and Python exits with 1.  Test:
    ``test_packaging.test_a_fresh_environment_*``.

14. ``Config._init_device`` opens RecBole's data-parallel process group (a config with
    ``local_rank``, as ``run_recbole(..., nproc=N)`` gives each process) with the ``nccl``
    backend and a CUDA device whatever the machine has, after asserting one ``gpu_id``
    per process: on a machine without CUDA every data-parallel run failed at that
    assertion.  Without CUDA the replacement opens a ``gloo`` group on the CPU; with
    CUDA it does what RecBole does (``nccl``, ``cuda:<local_rank>``), the assertion a
    one-line ``ValueError``.  The process that writes (global rank 0, ``local_rank +
    offset``) keeps the log; the others log errors only, as RecBole quiets them.  No
    RecBole issue found (#1684 asks for CPU DDP).  Test:
    ``test_distributed.test_recboles_device_setup_opens_a_gloo_group_without_cuda``.

15. ``AbstractTrainer.__init__`` wraps the model in ``DistributedDataParallel`` with
    ``device_ids=[local_rank]``, which torch refuses for a module on the CPU.  The
    replacement passes device ids only for a CUDA model.  Test:
    ``test_distributed.test_recboles_trainer_wraps_a_cpu_model_for_data_parallel``.

16. Every RecBole trainer opens a TensorBoard writer, named after its log file, in every
    process of a data-parallel run: the quiet processes (no log file) each left an
    empty ``log_tensorboard/model-<time>`` folder.  Only the writing process opens one
    now.  Test: ``test_distributed.test_two_processes_train_and_evaluate_as_one``.

17. No RecBole trainer closes its TensorBoard writer.  The writer appends each event on
    a thread of its own, re-opening its file by a path relative to the working directory,
    and nothing waited for that thread: events still queued when a run returned were lost
    if the process ended, or went to another folder (or failed) if the working directory
    changed meanwhile (the test suite, which changes directory per test, saw that
    ``FileNotFoundError`` on such a thread), and each run in a long-lived process
    (``--compare``, a test session) left a thread and an open writer behind.  A trainer
    that only evaluates (``--evaluate``, a Ray trial's test) opened one as well, leaving
    an empty ``log_tensorboard`` folder.  ``Trainer.fit`` now closes the writer when it
    returns or raises, and the close waits until every event is on disk (RecBole writes
    to it only during ``fit``); the writer is opened at the trainer's first event, so a
    trainer that writes none leaves no folder and no thread.  No RecBole issue found.
    Tests: ``test_compat.test_a_run_leaves_its_tensorboard_scalars_on_disk_and_no_writer_open``,
    ``test_an_evaluation_opens_no_tensorboard_writer``.

18. RecBole reads setting values with ``eval()``: ``Config._convert_config_dict`` evaluates
    every string of the command line and of ``config_dict`` (which also carries a hyper
    file's choices into a trial and a stored run's settings into a re-run),
    ``HyperTuning`` evaluates a hyper file's ``choice`` lists, and KD_DAGFM evaluates its
    ``teacher`` setting.  A value such as ``__import__('os').system(...) or 0.001`` ran
    its code.  Each now reads Python literals only (``ast.literal_eval``: numbers,
    strings, lists, tuples, dicts, booleans, ``None``), with RecBole's own fallbacks
    (``true``/``false`` in any case are booleans, anything else stays the string it
    was); KD_DAGFM's ``teacher`` must name one of that module's network classes.
    Expressions (``2**10``, ``float('inf')``) are no longer computed: they stay strings,
    which the plugin's type checks then refuse in one line.  No RecBole issue found.
    Tests: ``test_untrusted_files.test_recboles_own_config_and_hyper_tuning_run_no_code``,
    ``test_a_command_line_setting_runs_no_code``, ``test_a_config_dict_setting_runs_no_code``,
    ``test_kd_dagfm_teacher_names_only_a_network_class``.

19. ``Dataset._dataframe_to_interaction`` turns every float column into a float32 tensor,
    which holds integers exactly only up to 2**24: unix seconds (about 1.7e9) come out
    rounded to multiples of 128 s, so the real times that time-aware models read their
    intervals from lost every gap under two minutes.  The column ``REAL_TIME_FIELD`` (the
    ``real_time`` seconds of ``dataset_prep``) is kept in float64; every other column,
    the time order (``TIME_FIELD``) included, is loaded as RecBole loads it, so no split
    changes.  No RecBole issue found.  Test:
    ``test_tisasrec.test_real_times_reach_tisasrec_to_the_second``.

``apply()`` is idempotent and runs when ``recbole_freq`` is imported, after
``require_recbole()``.  It imports no RecBole module: each fix is installed by
``when_imported`` on the module it repairs, right after that module's first import (or
at once for a module a program imported before the plugin), so that importing the
plugin, and ``--help``, load neither torch nor RecBole (applying the fixes by importing
their modules took 2 s of every start-up, scikit-learn included, and ``--help`` up to
8 s).  Tests: ``test_cli.test_help_answers_without_loading_torch_or_recbole``,
``test_importing_the_plugin_is_light_and_its_names_load_on_use``,
``test_recbole_modules_imported_before_the_plugin_are_patched_at_its_import``.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib.abc
import logging
import os
import sys
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

_applied = False

RECBOLE_VERSION = "1.2.1"
RECBOLE_INSTALL = f"pip install --no-deps recbole=={RECBOLE_VERSION}"


class RecBoleMissingError(ImportError):
    """RecBole is not installed, or not the release the plugin is built on (fix 13)."""


def require_recbole() -> None:
    """``RecBoleMissingError`` unless RecBole 1.2.1 is installed (fix 13)."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("recbole") is None:
        found = "it is not installed"
    else:
        try:
            version = importlib.metadata.version("recbole")
        except importlib.metadata.PackageNotFoundError:
            return  # a source checkout of RecBole on the path: trust it
        if version == RECBOLE_VERSION:
            return
        found = f"found RecBole {version}"
    _print_uncaught_as_one_line(RecBoleMissingError)
    raise RecBoleMissingError(
        f"recbole-freq needs RecBole {RECBOLE_VERSION} ({found}); pip leaves it out because "
        "its metadata pins ray<=2.6.3, which cannot run on numpy 2. Install it with: "
        f"{RECBOLE_INSTALL}",
        name="recbole",
    )


def _print_uncaught_as_one_line(error_type: type[BaseException]) -> None:
    """An uncaught ``error_type`` prints ``error: <message>`` instead of a traceback;
    every other exception is left to the previous hook."""
    previous = sys.excepthook

    def excepthook(kind, value, traceback):
        if isinstance(value, error_type):
            print(f"error: {value}", file=sys.stderr)
        else:
            previous(kind, value, traceback)

    sys.excepthook = excepthook


def _restore_numpy_aliases() -> None:
    for name, value in _NUMPY_ALIASES.items():
        if name not in np.__dict__:
            setattr(np, name, value)


def _require_pandas_below_3() -> None:
    import importlib.metadata

    try:  # the installed version: importing pandas here would cost every start-up
        version = importlib.metadata.version("pandas")
    except importlib.metadata.PackageNotFoundError:
        return  # RecBole's own import then names what is missing
    major = int(version.split(".")[0])
    if major >= 3:
        raise ImportError(
            f"recbole-freq needs pandas < 3 (found {version}): RecBole 1.2.1 "
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


class UntrustedCheckpointError(ValueError):
    """A checkpoint whose pickle names or calls something a RecBole checkpoint never holds."""


def _restricted_load(f, map_location=None, **_ignored):
    """``torch.load`` for RecBole's modules: the restricted checkpoint loader, always."""
    from recbole_freq.checkpoint.loader import load_checkpoint

    return load_checkpoint(f, map_location=map_location or "cpu")


def _atomic_save(obj, f, *args, **kwargs):
    """``torch.save`` for RecBole's modules: whole or not at all (``recbole_freq.utils.files``),
    and a checkpoint (a dict with the run's ``Config``) in the plain form that torch's
    weights-only loader reads (``recbole_freq.checkpoint.schema``)."""
    import torch
    from recbole.config import Config

    if isinstance(obj, dict) and isinstance(obj.get("config"), Config):
        from recbole_freq.checkpoint.schema import to_plain_checkpoint

        obj, args = to_plain_checkpoint(obj), ()
        kwargs.pop("pickle_protocol", None)  # RecBole's 4; the weights-only loader reads 2
    if not isinstance(f, (str, os.PathLike)):
        return torch.save(obj, f, *args, **kwargs)
    from recbole_freq.utils.files import write_atomic

    write_atomic(f, lambda handle: torch.save(obj, handle, *args, **kwargs))


def _torch_with_safe_files() -> types.ModuleType:
    import torch

    shim = types.ModuleType("torch_with_safe_checkpoint_files")
    shim.__getattr__ = lambda name: getattr(torch, name)  # noqa: E731 (module __getattr__)
    shim.load = _restricted_load
    shim.save = _atomic_save
    return shim


# Trainer attribute holding the weights of the checkpoint it saved last (fix 2).
_BEST_IN_MEMORY = "_recbole_freq_saved_state"


def saved_state(trainer) -> dict | None:
    """``{"file", "state_dict", "other_parameter"}`` of the checkpoint ``trainer`` saved
    last (fix 2), or ``None`` if it saved none."""
    return getattr(trainer, _BEST_IN_MEMORY, None)


def _snapshot(model) -> dict:

    return {
        "state_dict": {name: value.detach().clone() for name, value in model.state_dict().items()},
        "other_parameter": copy.deepcopy(model.other_parameter()),
    }


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs the patches of ``when_imported`` right after their module executes (fix 12)."""

    def find_spec(self, name, path, target=None):
        if name not in _AFTER_IMPORT:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _LoaderThenPatch(spec.loader, name)
                return spec
        return None


class _LoaderThenPatch(importlib.abc.Loader):
    def __init__(self, loader, name: str):
        self.loader, self.name = loader, name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        for before in _BEFORE_IMPORT.get(self.name, ()):
            before(self.name)
        self.loader.exec_module(module)
        for patch in _AFTER_IMPORT.get(self.name, ()):
            patch(module)


# Module name -> patches to run once it is imported (fix 12), and what to run just before.
_AFTER_IMPORT: dict[str, list] = {}
_BEFORE_IMPORT: dict[str, list] = {}


def when_imported(name: str, patch, before=None) -> None:
    """Run ``patch(module)`` on module ``name``: now if it is imported, else right after
    its first import, so that patching a module never imports it (fix 12);
    ``before(name)`` runs just before that import executes the module."""
    if name in sys.modules:
        patch(sys.modules[name])
        return
    _AFTER_IMPORT.setdefault(name, []).append(patch)
    if before is not None:
        _BEFORE_IMPORT.setdefault(name, []).append(before)
    if not any(isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())


def load_data_and_model(model_file):
    """RecBole's ``recbole.quick_start.load_data_and_model`` on the restricted loader of
    ``recbole_freq.checkpoint.loader`` (fix 2): the same six values, for RecBole's and the
    plugin's models, on the GPU when there is one, and no code run from the file."""
    import torch

    from recbole_freq.checkpoint.loader import restore_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, config, dataset, (train_data, valid_data, test_data), _ = restore_model(
        model_file, device=device
    )
    return config, model, dataset, train_data, valid_data, test_data


def _patch_recbole_quick_start(quick_start) -> None:
    import recbole.data
    import recbole.utils

    quick_start.torch = _torch_with_safe_files()
    quick_start.load_data_and_model = load_data_and_model
    # What fixes 7 and 8 put in place, for a quick-start imported before the plugin.
    quick_start.init_logger = recbole.utils.init_logger
    quick_start.create_dataset = recbole.data.create_dataset
    package = sys.modules.get("recbole.quick_start")
    if package is not None and hasattr(package, "load_data_and_model"):
        package.load_data_and_model = load_data_and_model


def _patch_recbole_checkpoint_loading() -> None:
    when_imported("recbole.trainer.trainer", _patch_trainer_checkpoints)


def _patch_trainer_checkpoints(trainer_module) -> None:
    trainer_module.torch = _torch_with_safe_files()
    Trainer = trainer_module.Trainer

    original_save, original_evaluate = Trainer._save_checkpoint, Trainer.evaluate

    def _save_checkpoint(self, epoch, verbose=True, **kwargs):
        if not writing_rank(self.config):
            return  # RecBole's test (local_rank) would let rank 0 of every machine write
        target = kwargs.get("saved_model_file", self.saved_model_file)
        original_save(self, epoch, verbose=verbose, **kwargs)
        setattr(self, _BEST_IN_MEMORY, {"file": str(target), **_snapshot(self.model)})

    def evaluate(self, eval_data, load_best_model=True, model_file=None, show_progress=False):
        saved = getattr(self, _BEST_IN_MEMORY, None)
        wanted = str(model_file or self.saved_model_file)
        if load_best_model and eval_data and saved is not None and saved["file"] == wanted:
            self.model.load_state_dict(saved["state_dict"])
            self.model.load_other_parameter(saved["other_parameter"])
            load_best_model = False
        return original_evaluate(self, eval_data, load_best_model, model_file, show_progress)

    _save_checkpoint.__wrapped__ = original_save
    evaluate.__wrapped__ = original_evaluate
    Trainer._save_checkpoint = _save_checkpoint
    Trainer.evaluate = evaluate


def _contain_sine_anomaly_detection() -> None:
    import_state = {}

    def before(_name):
        import torch

        import_state["enabled"] = torch.is_anomaly_enabled()

    def after(_module):
        import torch

        torch.autograd.set_detect_anomaly(import_state.get("enabled", False))

    when_imported("recbole.model.sequential_recommender.sine", after, before=before)


def ensure_dir_race_free(dir_path: str) -> None:
    """RecBole's ``ensure_dir`` without the check-then-create race (fix 6)."""
    os.makedirs(dir_path, exist_ok=True)


def _make_ensure_dir_race_free() -> None:
    def patch(module):
        if hasattr(module, "ensure_dir"):
            module.ensure_dir = ensure_dir_race_free

    for name in (
        "recbole.utils.utils",
        "recbole.utils",
        "recbole.utils.logger",
        "recbole.trainer.trainer",
        "recbole.data.dataset.dataset",
        "recbole.data.utils",
    ):
        when_imported(name, patch)


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
            if writing_rank(config):
                original(config)  # basicConfig installs this run's stream and file handlers
            else:
                # A quiet process of a data-parallel run (fix 14): errors only, no file.
                quiet = logging.StreamHandler()
                quiet.setLevel(logging.ERROR)
                root.addHandler(quiet)
        finally:
            for handler in root.handlers:
                setattr(handler, _RUN_HANDLER_FLAG, True)
            for handler in installed_by_others:
                root.addHandler(handler)

    init_logger.__wrapped__ = original
    return init_logger


def current_log_file() -> str | None:
    """The log file of the latest run's ``init_logger`` (fix 7), if it has one."""
    for handler in logging.getLogger().handlers:
        if hasattr(handler, _RUN_HANDLER_FLAG) and hasattr(handler, "baseFilename"):
            return handler.baseFilename
    return None


def _give_each_run_its_own_log() -> None:
    when_imported("recbole.utils.logger", _patch_logger)
    when_imported("recbole.utils", _patch_logger_export)


def _patch_logger_export(utils) -> None:
    # The package's name for it, bound when recbole.utils imported its logger module
    # (whose own hook has replaced it by then).
    utils.init_logger = sys.modules["recbole.utils.logger"].init_logger


def _patch_logger(logger_module) -> None:
    import secrets

    logger_module.init_logger = _init_logger_per_run(logger_module.init_logger)
    local_time = logger_module.get_local_time
    # Only the logger's copy: the log (and TensorBoard) names, nothing else.
    logger_module.get_local_time = lambda: f"{local_time()}-{secrets.token_hex(3)}"


class PickledCacheRefused(ValueError):
    """A config names a pickled dataset or dataloader cache to read (fix 8)."""


PICKLED_CACHE_PATH_KEYS = ("dataset_save_path", "dataloaders_save_path")
PICKLED_CACHE_SAVE_KEYS = ("save_dataset", "save_dataloaders")


def refuse_pickled_cache_paths(config) -> None:
    """``PickledCacheRefused`` if ``config`` names a pickled cache to read (fix 8)."""
    named = [key for key in PICKLED_CACHE_PATH_KEYS if config[key]]
    if named:
        raise PickledCacheRefused(
            f"{' and '.join(f'{key}={config[key]!r}' for key in named)}: recbole-freq never "
            "reads pickled dataset or dataloader caches (unpickling a file can run any code "
            "in it); remove the setting, the dataset is rebuilt from its atomic files"
        )


def _recbole_dataset_class(config):
    """The dataset class RecBole's ``create_dataset`` picks for ``config``."""
    import importlib

    from recbole.utils import ModelType

    dataset_module = importlib.import_module("recbole.data.dataset")
    if hasattr(dataset_module, config["model"] + "Dataset"):
        return getattr(dataset_module, config["model"] + "Dataset")
    by_type = {
        ModelType.GENERAL: "Dataset",
        ModelType.SEQUENTIAL: "SequentialDataset",
        ModelType.CONTEXT: "Dataset",
        ModelType.KNOWLEDGE: "KnowledgeBasedDataset",
        ModelType.TRADITIONAL: "Dataset",
        ModelType.DECISIONTREE: "Dataset",
    }
    return getattr(dataset_module, by_type[config["MODEL_TYPE"]])


def _warn_cache_not_saved(config, key: str) -> None:
    if config[key]:
        logging.getLogger().warning(
            f"{key}=True is ignored: recbole-freq never reads pickled caches (they can run "
            "code), so it does not write them either"
        )


def create_dataset_from_atomic_files(config):
    """RecBole's ``create_dataset`` without its pickled cache (fix 8)."""
    refuse_pickled_cache_paths(config)
    _warn_cache_not_saved(config, "save_dataset")
    return _recbole_dataset_class(config)(config)


def _no_pickled_dataloaders(config):
    refuse_pickled_cache_paths(config)
    return None  # data_preparation then splits the dataset itself


def _warn_dataloaders_not_saved(config, dataloaders=None):
    _warn_cache_not_saved(config, "save_dataloaders")


def _never_read_pickled_caches() -> None:
    when_imported("recbole.data.utils", _patch_data_utils)


def _patch_data_utils(data_utils) -> None:
    replacements = {
        "create_dataset": create_dataset_from_atomic_files,
        "load_split_dataloaders": _no_pickled_dataloaders,
        "save_split_dataloaders": _warn_dataloaders_not_saved,
    }
    # Every module that imported one of them by name (recbole.data, its quick-start ...).
    originals = {name: getattr(data_utils, name) for name in replacements}
    for module in list(sys.modules.values()):
        for name, replacement in replacements.items():
            if getattr(module, name, None) is originals[name]:
                setattr(module, name, replacement)


def _keep_real_times_in_float64() -> None:
    when_imported("recbole.data.dataset.dataset", _patch_dataframe_to_interaction)


def _patch_dataframe_to_interaction(dataset_module) -> None:
    import torch

    Dataset = dataset_module.Dataset
    original = Dataset._dataframe_to_interaction

    @functools.wraps(original)
    def _dataframe_to_interaction(self, data):
        interaction = original(self, data)
        field = self.config["REAL_TIME_FIELD"]
        if field and field in data and field in interaction.interaction:
            exact = data[field].to_numpy(dtype=np.float64)
            interaction.interaction[field] = torch.from_numpy(exact.copy())
        return interaction

    Dataset._dataframe_to_interaction = _dataframe_to_interaction


def _never_download_datasets() -> None:
    when_imported("recbole.data.dataset.dataset", _patch_download)


def _patch_download(dataset_module) -> None:
    Dataset = dataset_module.Dataset
    recboles_download = Dataset._download

    def _download(dataset):
        from recbole_freq.config.configurator import FreqConfig
        from recbole_freq.data.guard import not_prepared_error

        if not isinstance(dataset.config, FreqConfig):
            return recboles_download(dataset)  # a program's own RecBole run: its choice
        raise not_prepared_error(dataset.dataset_name, dataset.dataset_path)

    _download.__wrapped__ = recboles_download
    Dataset._download = _download


def _collector_moves_only_tensors() -> None:
    when_imported("recbole.evaluator.collector", _patch_collector)


def _patch_collector(collector_module) -> None:
    Collector = collector_module.Collector

    def get_data_struct(self):
        # RecBole's, but its counts (ints, e.g. the item count for ItemCoverage) stay as
        # they are instead of failing on ``.cpu()``.
        data = self.data_struct._data_dict
        for key, value in data.items():
            if hasattr(value, "cpu"):
                data[key] = value.cpu()
        returned_struct = copy.deepcopy(self.data_struct)
        for key in ["rec.topk", "rec.meanrank", "rec.score", "rec.items", "data.label"]:
            if key in self.data_struct:
                del self.data_struct[key]
        return returned_struct

    Collector.get_data_struct = get_data_struct


def _grad_scaler_of_torch_amp() -> None:
    when_imported("recbole.trainer.trainer", _patch_grad_scaler)


def _patch_grad_scaler(trainer_module) -> None:
    import torch

    trainer_module.amp = types.SimpleNamespace(
        GradScaler=functools.partial(torch.amp.GradScaler, "cuda"),
        autocast=functools.partial(torch.amp.autocast, "cuda"),
    )


def writing_rank(config) -> bool:
    """Whether this process writes the run's files: the only process of a plain run, or
    global rank 0 (``local_rank + offset``) of a data-parallel one (fixes 14-16)."""

    def value(key):
        try:
            return config[key]
        except KeyError:
            return None

    if value("single_spec") is not False:
        return True
    return int(value("local_rank") or 0) + int(value("offset") or 0) == 0


def _init_device_without_cuda(original):
    def _init_device(self):
        values = self.final_config_dict
        if "local_rank" not in values:
            return original(self)
        import torch

        from recbole_freq.quick_start.distributed import init_method

        gpu_id = values["gpu_id"]
        gpu_id = ",".join(map(str, gpu_id)) if isinstance(gpu_id, tuple) else str(gpu_id)
        values["gpu_id"] = gpu_id
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu_id
        local_rank, nproc = int(values["local_rank"]), int(values["nproc"])
        cuda = bool(gpu_id) and torch.cuda.is_available()
        if cuda and len(gpu_id.split(",")) < nproc:
            raise ValueError(
                f"nproc={nproc} processes need as many GPUs, but gpu_id={gpu_id!r} names "
                f"{len(gpu_id.split(','))}; list one per process (e.g. gpu_id: '0,1')"
            )
        torch.distributed.init_process_group(
            backend="nccl" if cuda else "gloo",
            rank=local_rank + int(values["offset"]),
            world_size=int(values["world_size"]),
            init_method=init_method(values),
        )
        values["single_spec"] = False
        if cuda:
            values["device"] = torch.device("cuda", local_rank)
            torch.cuda.set_device(local_rank)
        else:
            values["device"] = torch.device("cpu")
        if not writing_rank(values):
            values["state"] = "error"
            values["show_progress"] = False
            values["verbose"] = False

    _init_device.__wrapped__ = original
    return _init_device


def _data_parallel_without_cuda() -> None:
    when_imported("recbole.config.configurator", _patch_init_device)
    when_imported("recbole.trainer.trainer", _patch_trainer_data_parallel)


def _patch_init_device(configurator) -> None:
    Config = configurator.Config
    Config._init_device = _init_device_without_cuda(Config._init_device)


def _patch_trainer_data_parallel(trainer_module) -> None:
    original_init = trainer_module.AbstractTrainer.__init__

    def __init__(self, config, model):
        self.config = config
        self.model = model
        if not config["single_spec"]:
            import torch

            self.model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
            on_cuda = torch.device(config["device"]).type == "cuda"
            self.distributed_model = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[config["local_rank"]] if on_cuda else None
            )

    __init__.__wrapped__ = original_init
    trainer_module.AbstractTrainer.__init__ = __init__
    original_tensorboard = trainer_module.get_tensorboard

    def get_tensorboard(logger):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return _NoTensorBoard()
        return original_tensorboard(logger)

    trainer_module.get_tensorboard = get_tensorboard


class _NoTensorBoard:
    """The TensorBoard writer of a process that writes nothing (fix 16)."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _open_tensorboard_late_and_close_it_after_fit() -> None:
    when_imported("recbole.trainer.trainer", _patch_tensorboard)


def _patch_tensorboard(trainer_module) -> None:
    original_fit = trainer_module.Trainer.fit
    if hasattr(original_fit, "__wrapped__"):
        return
    open_writer = trainer_module.get_tensorboard
    trainer_module.get_tensorboard = lambda logger: _TensorBoardOnFirstEvent(
        functools.partial(open_writer, logger)
    )

    @functools.wraps(original_fit)
    def fit(self, *args, **kwargs):
        try:
            return original_fit(self, *args, **kwargs)
        finally:
            self.tensorboard.close()

    trainer_module.Trainer.fit = fit


class _TensorBoardOnFirstEvent:
    """A trainer's TensorBoard writer, opened when the trainer first writes (fix 17)."""

    def __init__(self, open_writer):
        self._open_writer = open_writer
        self._writer = None

    def close(self):
        if self._writer is not None:
            self._writer.close()

    def __getattr__(self, name):
        # Private and special names (copy's __deepcopy__, pickle's __setstate__ on a
        # half-built object) are not events: looking them up must not open the writer.
        if name.startswith("_"):
            raise AttributeError(name)
        if self._writer is None:
            self._writer = self._open_writer()
        return getattr(self._writer, name)


def _guard_recboles_quick_start() -> None:
    when_imported("recbole.quick_start.quick_start", _patch_recbole_quick_start)


def literal_setting(text: str):
    """A setting's value from its text as ``Config._convert_config_dict`` reads it, but
    for literals only (fix 18): ``"1e-3"`` -> 0.001, ``"[64, 64]"`` -> a list,
    ``"True"``/``"true"`` -> True, ``"None"`` -> None; any other text stays a string."""
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        lowered = text.lower()
        return True if lowered == "true" else False if lowered == "false" else text
    if value is not None and not isinstance(value, (str, int, float, list, tuple, dict, bool)):
        return text  # a set, complex number or bytes: RecBole keeps those as the text too
    return value


def _convert_config_dict(self, config_dict):
    """``Config._convert_config_dict`` without ``eval()`` (fix 18)."""
    for key, value in config_dict.items():
        if isinstance(value, str):
            config_dict[key] = literal_setting(value)
    return config_dict


def _module_class_by_name(module):
    """A stand-in for ``eval`` in ``module`` that only looks up one of its network classes."""
    import torch

    def lookup(text):
        found = module.__dict__.get(str(text).strip()) if str(text).strip().isidentifier() else None
        if not (isinstance(found, type) and issubclass(found, torch.nn.Module)):
            raise ValueError(f"{text!r} does not name a network class of {module.__name__}")
        return found

    return lookup


def _read_settings_as_literals() -> None:
    when_imported("recbole.config.configurator", _patch_convert_config_dict)
    _read_settings_of_hyper_tuning_and_kd_dagfm()


def _patch_convert_config_dict(configurator) -> None:
    Config = configurator.Config
    if getattr(Config._convert_config_dict, "__wrapped__", None) is None:
        _convert_config_dict.__wrapped__ = Config._convert_config_dict
        Config._convert_config_dict = _convert_config_dict


def _read_settings_of_hyper_tuning_and_kd_dagfm() -> None:
    # Module globals shadow the builtin: each module's eval reads literals or class names.
    when_imported(
        "recbole.trainer.hyper_tuning", lambda module: setattr(module, "eval", literal_setting)
    )
    when_imported(
        "recbole.model.context_aware_recommender.kd_dagfm",
        lambda module: setattr(module, "eval", _module_class_by_name(module)),
    )


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
    _never_read_pickled_caches()
    _never_download_datasets()
    _collector_moves_only_tensors()
    _grad_scaler_of_torch_amp()
    _data_parallel_without_cuda()
    _open_tensorboard_late_and_close_it_after_fit()
    _guard_recboles_quick_start()
    _read_settings_as_literals()
    _keep_real_times_in_float64()
    _applied = True
