"""Hyperparameter search with Ray Tune for plugin models and RecBole built-ins.

RecBole 1.2.1's own tuning path (``run_hyper.py``, ``HyperTuning``,
``objective_function``) only finds models inside ``recbole.model``, reads ``sys.argv``
in every trial and is written for Ray <= 2.6.  This module drives the same RecBole
training loop as :func:`recbole_freq.quick_start.run` through the current Ray Tune API
(``Tuner``, ``TuneConfig``, ``RunConfig``):

- search spaces are read from RecBole's hyper files (``choice``, ``uniform``,
  ``quniform``, ``loguniform`` with RecBole's meaning, see :func:`parse_hyper_lines`);
- grid search (every combination) and random search need nothing beyond Ray; Optuna and
  HyperOpt are used when installed;
- every trial reports its *validation* metric after each evaluation epoch (ASHA stops
  trials on it) and evaluates the test split once, at the end, on its best epoch; trials
  are ranked on validation only;
- the dataset is loaded and filtered once by the driver and shared with the trials
  through Ray's object store, unless a tuned key changes the dataset itself;
- a trial sees exactly the CPU/GPU Ray assigned to it (RecBole's ``gpu_id`` would
  otherwise point every trial at GPU 0, and CPU trials on a GPU node at the GPU).

Outputs, in ``<storage_path>/<name>/``: ``trials.csv``, ``trials.md`` (ranked table) and
``best.yaml`` (the best trial's settings, accepted by ``--config_files``).

Modules: ``hyper`` (hyper files), ``trial`` (one trial), ``search`` (the driver,
``tune_model``), ``report`` (ranking and output files), ``store`` (``--trial_store``:
trial records as plain files that a later search replays, on any machine).
"""

from recbole_freq.jobs.tune.hyper import (
    HyperFileError,
    HyperParam,
    distinct_combinations,
    grid_size,
    parse_hyper_file,
    parse_hyper_lines,
)
from recbole_freq.jobs.tune.report import TrialsFailedError, rank_trials
from recbole_freq.jobs.tune.search import (
    SEARCHES,
    SearchNotStarted,
    SearchOptions,
    default_search_name,
    tune_model,
)
from recbole_freq.jobs.tune.trial import run_trial, trial_device_overrides
from recbole_freq.jobs.tune.trusted_folder import TuneSetupError

__all__ = [
    "SEARCHES",
    "HyperFileError",
    "HyperParam",
    "SearchNotStarted",
    "SearchOptions",
    "TrialsFailedError",
    "TuneSetupError",
    "default_search_name",
    "distinct_combinations",
    "grid_size",
    "parse_hyper_file",
    "parse_hyper_lines",
    "rank_trials",
    "run_trial",
    "trial_device_overrides",
    "tune_model",
]
