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
"""

from __future__ import annotations

import ast
import csv
import difflib
import io
import json
import math
import os
import random
import re
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from recbole_freq.config import check_name_component
from recbole_freq.files import check_writable, write_atomic
from recbole_freq.memory import check_memory, longest_history

HYPER_TYPES = ("choice", "uniform", "quniform", "loguniform")
SEARCHES = ("grid", "random", "optuna", "hyperopt")
DEFAULT_NUM_SAMPLES = 10
SPEC_FILE = "recbole_freq_search.json"

# Keys a trial must not change: identity of the job, or what the driver sets per trial.
UNTUNABLE_KEYS = {
    "model",
    "dataset",
    "data_path",
    "checkpoint_dir",
    "gpu_id",
    "use_gpu",
    "device",
    "show_progress",
}
# Keys read while RecBole loads and filters the dataset (``create_dataset``): tuning one
# of them means every trial loads its own dataset instead of the driver's shared one.
EXTRA_DATASET_KEYS = {"data_path", "benchmark_filename", "MAX_ITEM_LIST_LENGTH", "seq_len"}


class HyperFileError(ValueError):
    """A hyper file that cannot be read as a search space."""


class TuneSetupError(ValueError):
    """A search that cannot start as asked (missing package, bad option, no cluster)."""


class TrialsFailedError(RuntimeError):
    """Every trial of a search failed, so there is no best configuration."""


# --------------------------------------------------------------------------------------
# Hyper files
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HyperParam:
    """One line of a hyper file.

    ``choice`` keeps ``values``; ``uniform``, ``loguniform`` and ``quniform`` keep
    ``low``/``high`` as written (natural-log bounds for ``loguniform``, as RecBole
    passes them to ``hyperopt.hp.loguniform``) and ``q`` for ``quniform``.
    ``integer``: a ``quniform`` whose bounds and step are all written as integers draws
    ints (hyperopt would give floats such as ``64.0``, which layer sizes reject).
    """

    name: str
    kind: str
    values: tuple = ()
    low: float | None = None
    high: float | None = None
    q: float | None = None
    integer: bool = False
    line: int = 0

    def grid_values(self) -> list | None:
        """Every value of a discrete parameter, ``None`` for a continuous one."""
        if self.kind == "choice":
            return list(self.values)
        if self.kind == "quniform":
            first, last = math.ceil(self.low / self.q - 1e-9), math.floor(self.high / self.q + 1e-9)
            values = [k * self.q for k in range(first, last + 1)]
            return [int(round(v)) for v in values] if self.integer else values
        return None

    def to_tune(self):
        """The Ray Tune sampling domain with RecBole's meaning of the keyword."""
        from ray import tune

        if self.kind == "choice":
            return tune.choice(list(self.values))
        if self.kind == "uniform":
            return tune.uniform(self.low, self.high)
        if self.kind == "loguniform":
            return tune.loguniform(math.exp(self.low), math.exp(self.high))
        if self.integer:
            return tune.qrandint(int(self.low), int(self.high), int(self.q))
        return tune.quniform(self.low, self.high, self.q)

    def describe(self) -> str:
        if self.kind == "choice":
            return f"{self.name} choice {list(self.values)}"
        if self.kind == "quniform":
            return f"{self.name} quniform {self.low},{self.high},{self.q}"
        return f"{self.name} {self.kind} {self.low},{self.high}"


_INT = re.compile(r"[+-]?\d+")


def _numbers(text: str, count: int, where: str, form: str) -> tuple[list[float], bool]:
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != count or not all(parts):
        raise HyperFileError(f"{where}: expected {form}, got {text!r}")
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        raise HyperFileError(f"{where}: expected {form} (numbers), got {text!r}") from None
    if not all(math.isfinite(n) for n in numbers):
        raise HyperFileError(f"{where}: bounds must be finite numbers, got {text!r}")
    return numbers, all(_INT.fullmatch(p) for p in parts)


def parse_hyper_lines(lines, source: str = "<hyper>") -> dict[str, HyperParam]:
    """Parse RecBole hyper-file lines, ``<name> <type> <values>``, into a search space.

    Types, with RecBole's semantics (``recbole.trainer.hyper_tuning``):

    - ``choice [v1, v2, ...]``: one of the listed Python literals;
    - ``uniform low,high``: a float uniformly in ``[low, high]``;
    - ``loguniform low,high``: ``exp(u)`` with ``u`` uniform in ``[low, high]``, i.e.
      the bounds are natural logs (``-8,0`` spans ``3.4e-4 .. 1``);
    - ``quniform low,high,q``: a multiple of ``q`` in ``[low, high]``.

    Blank lines and lines starting with ``#`` are skipped.  Unlike RecBole, which skips
    any line with fewer than three fields and ``eval``-uates choices, a malformed line is
    an error naming the line, and choices are read as literals only.
    """
    space: dict[str, HyperParam] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}, line {number} ({line!r})"
        fields = line.split(None, 2)
        if len(fields) < 3:
            raise HyperFileError(
                f"{where}: expected '<name> <type> <values>', e.g. "
                "'learning_rate loguniform -8,0' or 'alpha choice [0.1,0.5]'"
            )
        name, kind, text = fields
        if kind not in HYPER_TYPES:
            raise HyperFileError(
                f"{where}: unknown type {kind!r}; use one of {', '.join(HYPER_TYPES)}"
            )
        if name in space:
            raise HyperFileError(f"{where}: {name!r} is already defined on line {space[name].line}")
        if kind == "choice":
            try:
                values = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                raise HyperFileError(
                    f"{where}: choice values must be a Python list literal such as "
                    "[0.1,0.3] or ['CE','BPR']"
                ) from None
            if not isinstance(values, (list, tuple)) or not values:
                raise HyperFileError(f"{where}: choice needs a non-empty list, e.g. [1,2,3]")
            param = HyperParam(name, kind, values=tuple(values), line=number)
        elif kind == "quniform":
            (low, high, q), integer = _numbers(text, 3, where, "'low,high,q'")
            if q <= 0:
                raise HyperFileError(f"{where}: the step q must be positive")
            if low > high:
                raise HyperFileError(f"{where}: low {low} is above high {high}")
            param = HyperParam(name, kind, low=low, high=high, q=q, integer=integer, line=number)
            if not param.grid_values():
                raise HyperFileError(f"{where}: no multiple of q={q} lies in [{low}, {high}]")
        else:
            (low, high), _ = _numbers(text, 2, where, "'low,high'")
            if low >= high:
                raise HyperFileError(f"{where}: low {low} must be below high {high}")
            param = HyperParam(name, kind, low=low, high=high, line=number)
        space[name] = param
    return space


def parse_hyper_file(path) -> dict[str, HyperParam]:
    """The search space of a hyper file; see :func:`parse_hyper_lines`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"hyper file {str(path)!r} does not exist")
    space = parse_hyper_lines(path.read_text().splitlines(), source=str(path))
    if not space:
        raise HyperFileError(
            f"{path}: the search space is empty; add lines like 'learning_rate choice "
            "[0.001,0.0005]'"
        )
    return space


def grid_size(space: dict[str, HyperParam]) -> int | None:
    """Number of combinations of a discrete space, ``None`` if a parameter is continuous."""
    grids = [param.grid_values() for param in space.values()]
    if any(grid is None for grid in grids):
        return None
    return math.prod(len(grid) for grid in grids)


def distinct_combinations(space: dict[str, HyperParam], count: int, seed: int) -> list[dict]:
    """``count`` different combinations of a discrete space, drawn uniformly."""
    names = list(space)
    grids = [space[name].grid_values() for name in names]
    total = math.prod(len(grid) for grid in grids)
    picks = random.Random(seed).sample(range(total), count)
    combinations = []
    for index in picks:
        combination = {}
        for name, grid in zip(reversed(names), reversed(grids)):
            index, position = divmod(index, len(grid))
            combination[name] = grid[position]
        combinations.append({name: combination[name] for name in names})
    return combinations


# --------------------------------------------------------------------------------------
# One trial (runs in a Ray worker)
# --------------------------------------------------------------------------------------


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


def _plain(value):
    """Python scalars and lists (Ray and NumPy types, tuples) for JSON, YAML and CSV."""
    if hasattr(value, "item") and not isinstance(value, (list, tuple, dict)):
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def run_trial(params: dict, job: dict, shared_dataset=None) -> None:
    """Ray Tune function trainable: train one configuration with RecBole's trainer.

    Reports after every validation epoch ``valid_score`` (the ``valid_metric``), the
    other validation metrics as ``valid_<metric>`` and ``train_loss``; then evaluates
    the test split once on the best epoch's checkpoint and reports a final result with
    ``final: True``, ``valid_score`` = best validation score and ``test_<metric>``.
    """
    import ray
    from ray import tune
    from recbole.data import create_dataset, data_preparation
    from recbole.utils import get_trainer, init_logger, init_seed

    from recbole_freq.config import FreqConfig
    from recbole_freq.data import check_prepared, dataset_fingerprint
    from recbole_freq.evaluation import use_full_sort_for_sampled_scoring
    from recbole_freq.noise import corrupt_training_data
    from recbole_freq.quick_start import (
        TrainingRecorder,
        build_model,
        evaluate_extra_test_modes,
        unique_checkpoint_path,
    )

    params = {name: _plain(value) for name, value in params.items()}
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
    train_data, valid_data, test_data = data_preparation(config, dataset)
    check_memory(config, dataset, users_longest=users_longest)
    corrupt_training_data(config, train_data, valid_data, test_data)

    init_seed(config["seed"] + config["local_rank"], config["reproducibility"])
    model = build_model(config, train_data._dataset)
    use_full_sort_for_sampled_scoring(model)
    trainer = get_trainer(config["MODEL_TYPE"], config["model"])(config, model)
    trainer.saved_model_file = unique_checkpoint_path(config)
    recorder = TrainingRecorder(trainer)
    recorded_valid_epoch = trainer._valid_epoch

    def reported_valid_epoch(*args, **kwargs):
        score, result = recorded_valid_epoch(*args, **kwargs)
        epoch = recorder.epochs[-1]
        tune.report(
            {
                "valid_score": float(score),
                "epoch": epoch["epoch"],
                "train_loss": epoch["train_loss"],
                **{f"valid_{key}": float(value) for key, value in result.items()},
            }
        )
        return score, result

    trainer._valid_epoch = reported_valid_epoch
    best_valid_score, best_valid_result = trainer.fit(
        train_data, valid_data, saved=True, show_progress=False
    )
    test_result = trainer.evaluate(test_data, load_best_model=True, show_progress=False)
    extra = evaluate_extra_test_modes(
        config, dataset, (train_data, valid_data, test_data), trainer, True
    )
    final = {
        "final": True,
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


# --------------------------------------------------------------------------------------
# The search (driver)
# --------------------------------------------------------------------------------------


def _import_ray():
    try:
        import ray
        from ray import tune  # noqa: F401
    except ImportError as error:
        raise TuneSetupError(
            f"hyperparameter search needs Ray Tune, which cannot be imported ({error}). "
            "Install it with: pip install 'ray[tune]'"
        ) from None
    return ray


def check_ray_address(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a cluster address nothing listens on (``ray.init`` would retry for
    minutes).  ``auto`` and ``local`` are left to ``ray.init``."""
    if address in ("auto", "local"):
        return
    host_port = address.split("://", 1)[-1].rstrip("/")
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise TuneSetupError(
            f"Ray address {address!r} is not host:port (e.g. 10.0.0.5:6379 or "
            "ray://10.0.0.5:10001), 'auto' or 'local'"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as error:
        raise TuneSetupError(
            f"cannot reach the Ray cluster at {address}: {error}. Check the address (the "
            "head node prints it after 'ray start --head'), or leave out --ray_address "
            "and RAY_ADDRESS to start a local Ray."
        ) from None


def _start_ray(ray, address, num_cpus):
    """Connect to ``address`` or start a local Ray; True if this call started it."""
    if address:
        check_ray_address(address)
    if ray.is_initialized():
        return False
    try:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, TimeoutError, RuntimeError) as error:
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        raise TuneSetupError(f"cannot start or join {where}: {error}") from None
    return True


def _check_resources(ray, cpus, gpus, started):
    available = ray.cluster_resources()
    short = [
        f"{amount:g} {kind} per trial but the cluster has {available.get(kind, 0):g}"
        for kind, amount in (("CPU", cpus), ("GPU", gpus))
        if amount > available.get(kind, 0)
    ]
    if short and started:
        # Trials would wait forever for resources a local Ray will never have.
        raise TuneSetupError(
            f"trials ask for {'; '.join(short)}: lower --cpus_per_trial/--gpus_per_trial "
            "or raise --num_cpus"
        )
    for line in short:
        print(f"warning: {line}; trials wait until the cluster scales up", file=sys.stderr)


def _validate_space(space, config, fixed):
    known = set(config.final_config_dict)
    for name, param in space.items():
        if name in UNTUNABLE_KEYS:
            raise TuneSetupError(
                f"line {param.line}: {name!r} cannot be tuned (the search sets it per trial)"
            )
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise TuneSetupError(
                f"line {param.line}: {name!r} is not a config key of {config['model']} or "
                f"the evaluation protocol (names are case-sensitive){hint}"
            )
        if name in fixed:
            raise TuneSetupError(
                f"{name!r} is both tuned (hyper file line {param.line}) and fixed to "
                f"{fixed[name]!r}; drop one of them"
            )


def _searcher(search, space, metric_mode, num_samples, max_concurrent, seed):
    """(search_alg, num_samples, param_space) for the Tuner."""
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    size = grid_size(space)
    if search == "grid":
        if size is None:
            continuous = [p.describe() for p in space.values() if p.grid_values() is None]
            raise TuneSetupError(
                "grid search needs discrete parameters (choice or quniform); continuous: "
                f"{'; '.join(continuous)}. Use --search random"
            )
        if num_samples is not None:
            raise TuneSetupError(
                f"grid search runs each of the {size} combinations once; --num_samples is "
                "for --search random/optuna/hyperopt"
            )
        param_space = {name: tune.grid_search(p.grid_values()) for name, p in space.items()}
        return BasicVariantGenerator(max_concurrent=max_concurrent or 0), 1, param_space

    num_samples = DEFAULT_NUM_SAMPLES if num_samples is None else num_samples
    if num_samples < 1:
        raise TuneSetupError("--num_samples must be at least 1")
    param_space = {name: p.to_tune() for name, p in space.items()}
    if search == "random":
        if size is not None:
            # Sampling with replacement would repeat combinations (likely already for
            # 20 of 150); draw distinct ones instead.
            if num_samples > size:
                raise TuneSetupError(
                    f"--num_samples {num_samples} exceeds the {size} combinations of the "
                    "space; use --search grid to run them all"
                )
            points = distinct_combinations(space, num_samples, seed)
            generator = BasicVariantGenerator(
                points_to_evaluate=points, max_concurrent=max_concurrent or 0, random_state=seed
            )
            return generator, num_samples, param_space
        generator = BasicVariantGenerator(max_concurrent=max_concurrent or 0, random_state=seed)
        return generator, num_samples, param_space
    metric, mode = metric_mode
    if search == "optuna":
        try:
            import optuna  # noqa: F401
            from ray.tune.search.optuna import OptunaSearch
        except ImportError:
            raise TuneSetupError(
                "--search optuna needs the optuna package: pip install optuna (or use "
                "--search random)"
            ) from None
        searcher = OptunaSearch(metric=metric, mode=mode, seed=seed)
    else:
        try:
            import hyperopt  # noqa: F401
            from ray.tune.search.hyperopt import HyperOptSearch
        except ImportError:
            raise TuneSetupError(
                "--search hyperopt needs the hyperopt package: pip install hyperopt (or use "
                "--search random)"
            ) from None
        searcher = HyperOptSearch(metric=metric, mode=mode, random_state_seed=seed)
    if max_concurrent:
        from ray.tune.search import ConcurrencyLimiter

        searcher = ConcurrencyLimiter(searcher, max_concurrent=max_concurrent)
    return searcher, num_samples, param_space


def _job_spec(model, dataset, config_files, config_dict, overrides, paper, space, search):
    return {
        "model": model,
        "dataset": dataset,
        "config_files": config_files,
        "config_dict": _plain(config_dict),
        "overrides": _plain(overrides),
        "paper": paper,
        "space": [p.describe() for p in space.values()],
        "search": search,
    }


def tune_model(
    model: str,
    dataset: str,
    hyper_file,
    config_files=None,
    config_dict=None,
    cmd_overrides=None,
    paper: bool = False,
    search: str | None = None,
    num_samples: int | None = None,
    scheduler: str = "asha",
    grace_period: int = 1,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
    max_concurrent: int | None = None,
    storage_path="ray_results",
    name: str | None = None,
    resume: bool = False,
    ray_address: str | None = None,
    num_cpus: int | None = None,
    verbose: int = 1,
) -> dict:
    """Search ``hyper_file``'s space for ``model`` on ``dataset`` with Ray Tune.

    ``config_files``/``config_dict``/``cmd_overrides`` set the fixed settings of every
    trial, as for :func:`recbole_freq.quick_start.run`.  ``search``: ``grid`` (default
    for a discrete space without ``num_samples``), ``random`` (default otherwise, distinct
    combinations for discrete spaces), ``optuna`` or ``hyperopt``.  ``scheduler``:
    ``asha`` (stop poor trials on the validation metric after ``grace_period``
    validation rounds) or ``none``.  ``ray_address`` (else ``RAY_ADDRESS``) joins a
    running cluster; otherwise a local Ray with ``num_cpus`` CPUs is started and shut
    down at the end.  ``resume`` continues the interrupted search ``name``.

    Returns a dict: ``experiment_dir``, ``metric``, ``mode``, ``trials`` (ranked rows),
    ``best`` (the best row), ``best_params``, ``table`` (markdown) and the written files
    ``trials_csv``, ``trials_md``, ``best_yaml``.
    """
    from recbole_freq.config import FreqConfig
    from recbole_freq.data import check_prepared

    ray = _import_ray()
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    space = parse_hyper_file(hyper_file)
    if search is None:
        search = "grid" if num_samples is None and grid_size(space) is not None else "random"
    if search not in SEARCHES:
        raise TuneSetupError(f"unknown search {search!r}; use one of {', '.join(SEARCHES)}")
    if scheduler not in ("asha", "none"):
        raise TuneSetupError(f"unknown scheduler {scheduler!r}; use asha or none")
    if cpus_per_trial < 0 or gpus_per_trial < 0 or cpus_per_trial + gpus_per_trial == 0:
        raise TuneSetupError("a trial needs a positive --cpus_per_trial or --gpus_per_trial")
    if gpus_per_trial > 1 and gpus_per_trial != int(gpus_per_trial):
        raise TuneSetupError("--gpus_per_trial above 1 must be a whole number")
    if max_concurrent is not None and max_concurrent < 1:
        raise TuneSetupError("--max_concurrent must be at least 1")

    overrides = dict(cmd_overrides or {})
    config_dict = dict(config_dict or {})
    config_files = [os.path.abspath(path) for path in config_files or []]
    config = FreqConfig(model, dataset, config_files, config_dict, overrides, paper)
    check_prepared(config)
    _validate_space(space, config, {**config_dict, **overrides})
    if not config["eval_step"] or config["eval_step"] < 1 or config["eval_step"] > config["epochs"]:
        raise TuneSetupError(
            f"tuning ranks trials on validation, but eval_step={config['eval_step']} with "
            f"epochs={config['epochs']} never validates; use 1 <= eval_step <= epochs"
        )
    rounds = config["epochs"] // config["eval_step"]
    if scheduler == "asha" and not 1 <= grace_period <= rounds:
        raise TuneSetupError(
            f"--grace_period {grace_period} must be between 1 and the {rounds} validation "
            "rounds of a trial"
        )

    # Trials run in Ray's per-trial working directories: every path must be absolute.
    overrides["data_path"] = os.path.abspath(os.path.dirname(os.path.normpath(config["data_path"])))
    overrides["checkpoint_dir"] = os.path.abspath(config["checkpoint_dir"])
    model_name, metric_name = config["model"], config["valid_metric"]
    mode = "max" if config["valid_metric_bigger"] else "min"
    job = {
        "model": model,
        "dataset": dataset,
        "config_files": config_files,
        "config_dict": config_dict,
        "overrides": overrides,
        "paper": paper,
    }

    storage = check_writable(Path(storage_path).expanduser().resolve(), "--storage_path")
    name = name or default_search_name(model_name, dataset)
    check_name_component(name, "--name")
    experiment_dir = storage / name
    spec = _job_spec(model, dataset, config_files, config_dict, overrides, paper, space, search)
    if resume:
        saved = experiment_dir / SPEC_FILE
        if not saved.is_file():
            raise TuneSetupError(
                f"nothing to resume in {experiment_dir}: give the --name and --storage_path "
                "of the interrupted search"
            )
        previous = json.loads(saved.read_text())
        changed = sorted(key for key in spec if previous.get(key) != _plain(spec[key]))
        if changed:
            raise TuneSetupError(
                f"--resume needs the settings of the interrupted search; changed: "
                f"{', '.join(changed)} (saved in {saved})"
            )
    elif experiment_dir.exists() and any(experiment_dir.iterdir()):
        raise TuneSetupError(
            f"{experiment_dir} already holds a search: add --resume to continue it or pick "
            "another --name"
        )

    # Bad search options fail here, before the dataset is loaded and Ray is started.
    searcher = _searcher(
        search, space, ("valid_score", mode), num_samples, max_concurrent, config["seed"]
    )
    shared = None
    if not set(space) & _dataset_keys():
        from recbole.data import create_dataset
        from recbole.utils import init_seed

        init_seed(config["seed"], config["reproducibility"])
        shared = create_dataset(config)

    address = ray_address or os.environ.get("RAY_ADDRESS") or None
    started = _start_ray(ray, address, num_cpus)
    try:
        _check_resources(ray, cpus_per_trial, gpus_per_trial, started)
        trainable = tune.with_resources(
            tune.with_parameters(run_trial, job=job, shared_dataset=shared),
            {"cpu": cpus_per_trial, "gpu": gpus_per_trial},
        )
        results, interrupted = _fit(
            trainable,
            searcher,
            ("valid_score", mode),
            ASHAScheduler(
                # One report per validation round plus the final one: max_t lets the
                # last epoch pass, so that the test evaluation still runs.
                time_attr="training_iteration",
                max_t=rounds + 1,
                grace_period=grace_period,
            )
            if scheduler == "asha"
            else None,
            (storage, name, experiment_dir, spec, resume),
            verbose,
        )
    finally:
        if started:
            ray.shutdown()

    if interrupted:
        from recbole_freq.quick_start import RunInterrupted

        finished, started = finished_trials(results)
        raise RunInterrupted(
            f"the search stopped: {finished} of the {started} trials started had finished; "
            f"the search's state is kept in {experiment_dir}"
        )
    rows = rank_trials(results, list(space), mode)
    summary = {
        "model": model_name,
        "dataset": dataset,
        "experiment_dir": str(experiment_dir),
        "metric": metric_name,
        "mode": mode,
        "shared_dataset": shared is not None,
        "trials": rows,
    }
    return _write_outputs(summary, experiment_dir, list(space), job, config_dict, cmd_overrides)


def _dataset_keys() -> set:
    from recbole.utils.argument_list import dataset_arguments

    return set(dataset_arguments) | EXTRA_DATASET_KEYS


def _fit(trainable, searcher, metric_mode, scheduler, where, verbose):
    from ray import tune

    search_alg, num_samples, param_space = searcher
    storage, name, experiment_dir, spec, resume = where
    if resume:
        tuner = tune.Tuner.restore(
            str(experiment_dir),
            trainable,
            resume_unfinished=True,
            restart_errored=True,
            param_space=param_space,
        )
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=param_space,
            tune_config=tune.TuneConfig(
                metric=metric_mode[0],
                mode=metric_mode[1],
                search_alg=search_alg,
                scheduler=scheduler,
                num_samples=num_samples,
            ),
            run_config=tune.RunConfig(
                name=name,
                storage_path=str(storage),
                verbose=verbose,
                failure_config=tune.FailureConfig(max_failures=0),
                # RecBole's log/ and log_tensorboard/ go to the trial's working dir.
                sync_config=tune.SyncConfig(sync_artifacts=True),
            ),
        )
        experiment_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(experiment_dir / SPEC_FILE, json.dumps(_plain(spec), indent=2))
    import logging

    import ray.tune.tune as ray_tune_run

    # On Ctrl-C Ray stops the search, saves its state and returns normally, printing a
    # hint that names its Tuner.restore API.  Its notices are muted (ours names
    # --resume --name) and the event its signal handler sets is kept to tell an
    # interrupted search from a finished one.
    ray_tune_logger = logging.getLogger("ray.tune.tune")
    level = ray_tune_logger.level
    ray_tune_logger.setLevel(logging.ERROR)
    setup = getattr(ray_tune_run, "_setup_signal_catching", None)
    events = []

    def keep_event():
        event = setup()
        events.append(event)
        return event

    if setup is not None:
        ray_tune_run._setup_signal_catching = keep_event
    try:
        results = tuner.fit()
    finally:
        ray_tune_logger.setLevel(level)
        if setup is not None:
            ray_tune_run._setup_signal_catching = setup
    return results, any(event.is_set() for event in events)


def finished_trials(results) -> tuple[int, int]:
    """``(finished, started)`` trials of a search."""
    trials = getattr(getattr(results, "_experiment_analysis", None), "trials", None) or []
    finished = sum(trial.status in ("TERMINATED", "ERROR") for trial in trials)
    return finished, len(trials)


def rank_trials(results, names: list[str], mode: str) -> list[dict]:
    """One row per trial, best validation score first; failed trials last."""
    rows = []
    for result in results:
        metrics = result.metrics or {}
        history = result.metrics_dataframe
        epochs = []
        if history is not None and "epoch" in history:
            is_final = history["final"].eq(True) if "final" in history else False
            epochs = history[history["epoch"].notna() & ~is_final]
        final = metrics if metrics.get("final") else {}
        row = {"trial_id": metrics.get("trial_id") or Path(str(result.path)).name}
        row.update({name: _plain((result.config or {}).get(name)) for name in names})
        if final:
            row["status"] = "completed"
            row["best_valid"] = final["valid_score"]
            row["best_epoch"] = final["best_epoch"]
            row["epochs_run"] = final["epochs_run"]
        elif len(epochs):
            scores = epochs["valid_score"]
            best = scores.idxmax() if mode == "max" else scores.idxmin()
            row["status"] = "stopped early (ASHA)" if result.error is None else "error"
            row["best_valid"] = float(scores[best])
            row["best_epoch"] = int(epochs["epoch"][best])
            row["epochs_run"] = int(epochs["epoch"].max()) + 1
        else:
            row["status"] = "error" if result.error is not None else "no result"
            row["best_valid"] = None
        if result.error is not None:
            row["error"] = str(result.error).strip().splitlines()[-1][:300]
        for key, value in final.items():
            if key.startswith(("test_", "valid_")) and key != "valid_score":
                row[key] = value
        if final:
            row["checkpoint"] = final.get("checkpoint_file")
            row["device"] = final.get("device")
        row["trial_dir"] = str(result.path)
        rows.append(row)
    sign = -1 if mode == "max" else 1
    rows.sort(key=lambda r: (r["best_valid"] is None, sign * (r["best_valid"] or 0.0)))
    for rank, row in enumerate(rows, start=1):
        row["rank"] = rank
    return rows


def _markdown(rows, names, metric) -> str:
    key = metric.lower()
    header = ["rank", "trial", *names, f"valid {metric} (best)", "best epoch", f"test {metric}"]
    header.append("status")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def fmt(value, spec=".4f"):
        if value is None:
            return "-"
        return format(value, spec) if isinstance(value, float) else str(value)

    for row in rows:
        # Tuned values keep 4 significant digits (learning rates of 1e-5 stay visible).
        cells = [fmt(row["rank"]), row["trial_id"], *(fmt(row.get(n), ".4g") for n in names)]
        cells += [fmt(row.get(k)) for k in ("best_valid", "best_epoch", f"test_{key}")]
        cells.append(row["status"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write_outputs(summary, experiment_dir: Path, names, job, config_dict, cmd_overrides):
    from recbole_freq.config import FreqConfig

    rows, metric = summary["trials"], summary["metric"]
    experiment_dir.mkdir(parents=True, exist_ok=True)
    table = _markdown(rows, names, metric)
    summary["table"] = table
    trials_md = experiment_dir / "trials.md"
    write_atomic(
        trials_md,
        f"# {summary['model']} on {summary['dataset']}: trials ranked by validation "
        f"{metric} ({summary['mode']})\n\n{table}\n",
    )
    columns = ["rank", "trial_id", "status", *names, "best_valid", "best_epoch", "epochs_run"]
    for row in rows:
        columns += [key for key in row if key not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()})
    trials_csv = experiment_dir / "trials.csv"
    write_atomic(trials_csv, buffer.getvalue())
    summary.update(trials_csv=str(trials_csv), trials_md=str(trials_md))

    scored = [row for row in rows if row.get("best_valid") is not None]
    if not scored:
        errors = [row.get("error") for row in rows if row.get("error")]
        raise TrialsFailedError(
            f"all {len(rows)} trials failed, see {experiment_dir}"
            + (f"; first error: {errors[0]}" if errors else "")
        )
    best = scored[0]
    best_params = {name: best[name] for name in names}
    # The fixed settings of the search, as RecBole reads them, so the file alone
    # reproduces the best trial (command-line flags still win over it).
    # Paths as the trials used them (absolute), but only the keys the user set.
    given = {**config_dict, **(cmd_overrides or {})}
    fixed = FreqConfig._convert_config_dict(
        None, {k: job["overrides"].get(k, v) for k, v in given.items()}
    )
    fixed = {k: _plain(v) for k, v in fixed.items() if k not in best_params}
    test_key = f"test_{metric.lower()}"
    test_text = f"{best[test_key]:.4f}" if best.get(test_key) is not None else "- (stopped early)"
    files = " ".join([*job["config_files"], str(experiment_dir / "best.yaml")])
    header = [
        f"# Best of {len(rows)} trials: {summary['model']} on {summary['dataset']}",
        f"# experiment: {experiment_dir}",
        f"# trial {best['trial_id']}: best validation {metric} = {best['best_valid']:.4f} "
        f"(epoch {best.get('best_epoch')}), test {metric} = {test_text}",
        f"# ranked by validation {metric}; the test split did not influence the choice",
        f"# train it: python run_recbole_freq.py --model={summary['model']} "
        f"--dataset={summary['dataset']} --config_files {files}",
    ]
    if job["paper"]:
        header.append("# (the search also used --paper)")
    body = yaml.safe_dump(best_params, sort_keys=False, default_flow_style=False)
    if fixed:
        body += "# fixed for every trial of the search:\n"
        body += yaml.safe_dump(fixed, sort_keys=False, default_flow_style=False)
    best_yaml = experiment_dir / "best.yaml"
    write_atomic(best_yaml, "\n".join(header) + "\n" + body)
    summary.update(best=best, best_params=best_params, best_yaml=str(best_yaml))
    return summary


def default_search_name(model: str, dataset: str) -> str:
    """``<model>-<dataset>-<time>``: the experiment folder of a search given no --name."""
    return f"{model}-{dataset}-{time.strftime('%Y%m%d-%H%M%S')}"


__all__ = [
    "HyperFileError",
    "HyperParam",
    "TrialsFailedError",
    "TuneSetupError",
    "parse_hyper_file",
    "parse_hyper_lines",
    "rank_trials",
    "run_trial",
    "trial_device_overrides",
    "tune_model",
]
