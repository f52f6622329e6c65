"""The search driver: ``tune_model`` checks the space and the settings, starts or joins
Ray (``recbole_freq.jobs.ray_cluster``), runs the trials (``trial.run_trial``) under a
searcher and scheduler, and writes the report (``report``)."""

from __future__ import annotations

import difflib
import json
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from recbole_freq.config.configurator import check_name_component
from recbole_freq.config.settings import range_problem, type_problem
from recbole_freq.jobs.ray_cluster import check_resources, import_ray, shutdown, start_or_join
from recbole_freq.jobs.tune.hyper import distinct_combinations, grid_size, parse_hyper_file
from recbole_freq.jobs.tune.report import finished_trials, rank_trials, write_outputs
from recbole_freq.jobs.tune.trial import run_trial
from recbole_freq.jobs.tune.trusted_folder import (
    TuneSetupError,
    check_search_folder_trusted,
)
from recbole_freq.quick_start.distributed import data_parallel_settings
from recbole_freq.utils.command import SEARCHES
from recbole_freq.utils.files import check_writable, plain_value, write_atomic
from recbole_freq.utils.inputs import read_input_text

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


@dataclass(frozen=True)
class SearchOptions:
    """How a search runs (``tune_model``'s ``options``; the flags of the same names).

    ``search``: ``grid`` (the default for a discrete space without ``num_samples``),
    ``random`` (the default otherwise, distinct combinations for discrete spaces),
    ``optuna`` or ``hyperopt``; ``num_samples`` trials (10 unless grid).  ``scheduler``:
    ``asha`` (stop poor trials on the validation metric after ``grace_period``
    validation rounds) or ``none``.  Each trial takes ``cpus_per_trial`` /
    ``gpus_per_trial``, at most ``max_concurrent`` at once.  ``ray_address`` (else
    ``RAY_ADDRESS``) joins a running cluster; otherwise a local Ray with ``num_cpus``
    CPUs is started and shut down at the end.  ``fixed_first``: the first trial takes the
    tuned keys' values from the fixed settings (``--paper``'s, a config file's, the
    model's defaults), so the ranking says whether anything in the space beats them on
    validation; the other trials are drawn as usual (random and model-based searches)."""

    search: str | None = None
    num_samples: int | None = None
    scheduler: str = "asha"
    grace_period: int = 1
    max_concurrent: int | None = None
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    ray_address: str | None = None
    num_cpus: int | None = None
    fixed_first: bool = False

    def checked(self, space) -> SearchOptions:
        """The options with the search to run named; ``TuneSetupError`` for one out of
        range."""
        search = self.search
        if search is None:
            discrete = grid_size(space) is not None
            search = "grid" if self.num_samples is None and discrete else "random"
        if search not in SEARCHES:
            raise TuneSetupError(f"unknown search {search!r}; use one of {', '.join(SEARCHES)}")
        if self.scheduler not in ("asha", "none"):
            raise TuneSetupError(f"unknown scheduler {self.scheduler!r}; use asha or none")
        cpus, gpus = self.cpus_per_trial, self.gpus_per_trial
        if cpus < 0 or gpus < 0 or cpus + gpus == 0:
            raise TuneSetupError("a trial needs a positive --cpus_per_trial or --gpus_per_trial")
        if gpus > 1 and gpus != int(gpus):
            raise TuneSetupError("--gpus_per_trial above 1 must be a whole number")
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise TuneSetupError("--max_concurrent must be at least 1")
        if self.fixed_first and search == "grid":
            raise TuneSetupError(
                "--fixed_first is for a sampled search: grid search already runs every "
                "combination, the fixed settings' one among them if it is in the space"
            )
        return replace(self, search=search)

    @property
    def asha_grace_period(self) -> int | None:
        return self.grace_period if self.scheduler == "asha" else None


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
        # A wrong value would fail in its trial, after Ray started: check each one now.
        for value in param.values if param.kind == "choice" else ():
            problem = type_problem(name, value) or range_problem(name, value)
            if problem:
                raise TuneSetupError(
                    f"line {param.line}: {name} {problem}, got the choice {value!r}"
                )
        for value in param.extremes():
            _check_as_a_run_would(config, name, value, param.line)


def _check_as_a_run_would(config, name: str, value, line: int) -> None:
    """The checks a training run makes of its settings (``check_run_settings``), on the
    fixed settings with ``name`` set to ``value``: ``epochs choice [0]`` "completed" a
    search with valid -inf and a best.yaml that training refuses."""
    from recbole_freq.quick_start.preflight import check_run_settings

    before = config[name]
    config[name] = value
    try:
        check_run_settings(config)
    except ValueError as problem:
        raise TuneSetupError(f"line {line}: {name} = {value!r}: {problem}") from None
    finally:
        config[name] = before


def fixed_point(space, config) -> dict:
    """The fixed settings' value of every tuned key, checked to lie in the space
    (``--fixed_first``'s first trial); ``TuneSetupError`` names a value outside it."""
    point = {}
    for name, param in space.items():
        value = config[name]
        grid = param.grid_values()
        if grid is not None:
            # True == 1 in Python: a flag's value is not a count's
            inside = any(
                value == choice and isinstance(value, bool) == isinstance(choice, bool)
                for choice in grid
            )
            where = f"one of {grid}"
        else:
            low, high = param.extremes()
            inside = isinstance(value, (int, float)) and low <= value <= high
            where = f"between {low} and {high}"
        if not inside:
            raise TuneSetupError(
                f"--fixed_first: {name}'s fixed value {value!r} is not in the space (hyper "
                f"file line {param.line}: {where}); add it there or drop --fixed_first"
            )
        point[name] = value
    return point


def _searcher(search, space, metric_mode, num_samples, max_concurrent, seed, first=None):
    """(search_alg, num_samples, param_space) for the Tuner; ``first``: a point the
    search evaluates before any other (``fixed_point``), counted in ``num_samples``."""
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
            if first is not None:
                points = [first, *[point for point in points if point != first]][:num_samples]
            generator = BasicVariantGenerator(
                points_to_evaluate=points, max_concurrent=max_concurrent or 0, random_state=seed
            )
            return generator, num_samples, param_space
        generator = BasicVariantGenerator(
            points_to_evaluate=[first] if first is not None else None,
            max_concurrent=max_concurrent or 0,
            random_state=seed,
        )
        return generator, num_samples, param_space
    metric, mode = metric_mode
    starts = {"points_to_evaluate": [first]} if first is not None else {}
    if search == "optuna":
        try:
            import optuna  # noqa: F401
            from ray.tune.search.optuna import OptunaSearch
        except ImportError:
            raise TuneSetupError(
                "--search optuna needs the optuna package: pip install optuna (or use "
                "--search random)"
            ) from None
        searcher = OptunaSearch(metric=metric, mode=mode, seed=seed, **starts)
    else:
        try:
            import hyperopt  # noqa: F401
            from ray.tune.search.hyperopt import HyperOptSearch
        except ImportError:
            raise TuneSetupError(
                "--search hyperopt needs the hyperopt package: pip install hyperopt (or use "
                "--search random)"
            ) from None
        searcher = HyperOptSearch(metric=metric, mode=mode, random_state_seed=seed, **starts)
    if max_concurrent:
        from ray.tune.search import ConcurrencyLimiter

        searcher = ConcurrencyLimiter(searcher, max_concurrent=max_concurrent)
    return searcher, num_samples, param_space


def _job_spec(model, dataset, config_files, config_dict, overrides, paper, space, search):
    return {
        "model": model,
        "dataset": dataset,
        "config_files": config_files,
        "config_dict": plain_value(config_dict),
        "overrides": plain_value(overrides),
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
    options: SearchOptions | None = None,
    storage_path="ray_results",
    name: str | None = None,
    resume: bool = False,
    verbose: int = 1,
    trial_store=None,
) -> dict:
    """Search ``hyper_file``'s space for ``model`` on ``dataset`` with Ray Tune.

    ``config_files``/``config_dict``/``cmd_overrides`` set the fixed settings of every
    trial, as for :func:`recbole_freq.quick_start.run`.  ``options``
    (``SearchOptions``): the searcher, scheduler, trial resources and Ray cluster.
    ``resume`` continues the interrupted search ``name``.  ``trial_store``: a folder
    that keeps every trial's reports and resume state as plain files (``store``); a new
    search with the same settings and store replays what it holds, on any machine.

    Returns a dict: ``experiment_dir``, ``metric``, ``mode``, ``trials`` (ranked rows),
    ``best`` (the best row), ``best_params``, ``table`` (markdown) and the written files
    ``trials_csv``, ``trials_md``, ``best_yaml``.
    """
    ray = import_ray("hyperparameter search", "ray[tune]", TuneSetupError)
    space = parse_hyper_file(hyper_file)
    options = (options or SearchOptions()).checked(space)
    config_files = [os.path.abspath(path) for path in config_files or []]
    config_dict = dict(config_dict or {})
    config, job = _trial_job(
        model, dataset, config_files, config_dict, cmd_overrides, paper, space,
        options.asha_grace_period,
    )  # fmt: skip
    mode = "max" if config["valid_metric_bigger"] else "min"
    storage, name = _search_location(storage_path, name, config["model"], dataset)
    experiment_dir = storage / name
    spec = _job_spec(
        model, dataset, config_files, config_dict, job["overrides"], paper, space, options.search
    )
    first = fixed_point(space, config) if options.fixed_first else None
    if first is not None:  # only then, so that searches saved before keep their spec
        spec["fixed_first"] = plain_value(first)
    if trial_store is not None:
        job["trial_store"] = str(check_writable(Path(trial_store).resolve(), "--trial_store"))
        spec["trial_store"] = job["trial_store"]
    _check_experiment_folder(experiment_dir, spec, resume)
    # Bad search options fail here, before the dataset is loaded and Ray is started.
    searcher = _searcher(
        options.search, space, ("valid_score", mode), options.num_samples,
        options.max_concurrent, config["seed"], first,
    )  # fmt: skip
    shared = _shared_dataset(config, space)
    rounds = config["epochs"] // config["eval_step"]
    asha = None if options.asha_grace_period is None else (rounds, options.grace_period)
    existed = experiment_dir.exists()
    try:
        results, interrupted = _run_on_ray(
            ray, job, shared, searcher, mode, asha, (storage, name, experiment_dir, spec, resume),
            options, verbose,
        )  # fmt: skip
    except KeyboardInterrupt:
        if resume or _holds_ray_state(experiment_dir):
            raise
        raise _nothing_started(experiment_dir, existed) from None
    if interrupted:
        raise _interrupted(results, experiment_dir)
    summary = dict(
        model=config["model"], dataset=dataset, experiment_dir=str(experiment_dir),
        metric=config["valid_metric"], mode=mode, shared_dataset=shared is not None,
        trials=rank_trials(
            results, list(space), mode, _test_stopped_trials(results), config["epochs"]
        ),
    )  # fmt: skip
    return write_outputs(summary, experiment_dir, list(space), job, config_dict, cmd_overrides)


class SearchNotStarted(KeyboardInterrupt):
    """Interrupted before Ray saved the search's first state: there is nothing to resume.
    ``restartable``: nothing was kept, so the same command starts it again."""

    def __init__(self, message: str, restartable: bool):
        super().__init__(message)
        self.restartable = restartable


def _holds_ray_state(experiment_dir: Path) -> bool:
    from ray.tune.execution.tune_controller import TuneController

    return next(experiment_dir.glob(TuneController.CKPT_FILE_TMPL.format("*")), None) is not None


def _nothing_started(experiment_dir: Path, existed: bool) -> SearchNotStarted:
    """The interrupt of a new search stopped before Ray saved any state (while Ray
    started, most often): ``--resume`` would answer "nothing to resume", so what this
    call wrote is removed (a trial's result excepted: then another --name is needed) and
    the same command is what continues."""
    import shutil

    results = [p for p in experiment_dir.glob("**/result.json") if p.stat().st_size]
    if results:
        return SearchNotStarted(
            f"the search stopped before Ray saved its state, so it cannot be resumed; "
            f"{experiment_dir} keeps what its trials wrote. Start it again under another "
            "--name",
            restartable=False,
        )
    if not existed:
        shutil.rmtree(experiment_dir, ignore_errors=True)
    else:
        for written in (SPEC_FILE, RAY_LOG_FILE):
            (experiment_dir / written).unlink(missing_ok=True)
    return SearchNotStarted(
        "the search stopped before Ray saved its state: nothing of it was kept and there is "
        "nothing to resume",
        restartable=True,
    )


def _interrupted(results, experiment_dir):
    from recbole_freq.utils.signals import RunInterrupted

    finished, started = finished_trials(results)
    return RunInterrupted(
        f"the search stopped: {finished} of the {started} trials started had finished "
        f"(tested or failed); the search's state is kept in {experiment_dir}"
    )


def _trial_job(
    model, dataset, config_files, config_dict, cmd_overrides, paper, space, grace_period
):
    """``(config, job)``: the fixed settings of every trial, checked against the space
    and the validation rounds (``grace_period`` under ASHA), and the job each trial
    builds its configuration from (every path absolute: trials run in Ray's per-trial
    working directories)."""
    from recbole_freq.config.configurator import FreqConfig
    from recbole_freq.data.guard import check_prepared

    overrides = dict(cmd_overrides or {})
    config = FreqConfig(model, dataset, config_files, config_dict, overrides, paper)
    if data_parallel_settings(config) is not None:
        raise TuneSetupError(
            "a search trains its trials side by side, one process each; nproc and "
            "world_size (data-parallel training) are for a single training run or --compare"
        )
    check_prepared(config)
    _validate_space(space, config, {**config_dict, **overrides})
    if not config["eval_step"] or config["eval_step"] < 1 or config["eval_step"] > config["epochs"]:
        raise TuneSetupError(
            f"tuning ranks trials on validation, but eval_step={config['eval_step']} with "
            f"epochs={config['epochs']} never validates; use 1 <= eval_step <= epochs"
        )
    rounds = config["epochs"] // config["eval_step"]
    if grace_period is not None and not 1 <= grace_period <= rounds:
        raise TuneSetupError(
            f"--grace_period {grace_period} must be between 1 and the {rounds} validation "
            "rounds of a trial"
        )
    overrides["data_path"] = os.path.abspath(os.path.dirname(os.path.normpath(config["data_path"])))
    overrides["checkpoint_dir"] = os.path.abspath(config["checkpoint_dir"])
    job = {
        "model": model,
        "dataset": dataset,
        "config_files": config_files,
        "config_dict": config_dict,
        "overrides": overrides,
        "paper": paper,
    }
    return config, job


def _search_location(storage_path, name, model, dataset) -> tuple[Path, str]:
    """``(storage folder, search name)``: the folder writable, the name one path part."""
    storage = check_writable(Path(storage_path).expanduser().resolve(), "--storage_path")
    name = name or default_search_name(model, dataset)
    check_name_component(name, "--name")
    return storage, name


def _check_experiment_folder(experiment_dir: Path, spec: dict, resume: bool) -> None:
    """A new search needs an empty folder; ``--resume`` one of a search with the same
    settings, trusted (``trusted_folder``)."""
    if resume:
        check_search_folder_trusted(experiment_dir)
        saved = experiment_dir / SPEC_FILE
        if not saved.is_file():
            raise TuneSetupError(
                f"nothing to resume in {experiment_dir}: give the --name and --storage_path "
                "of the interrupted search"
            )
        try:
            previous = json.loads(read_input_text(saved, "search settings"))
        except (OSError, ValueError, RecursionError) as error:
            previous = error
        if not isinstance(previous, dict):
            raise TuneSetupError(
                f"{saved} is not the settings file a search writes (it was edited or damaged): "
                "the search cannot be resumed; start it again under another --name"
            )
        changed = sorted(key for key in spec if previous.get(key) != plain_value(spec[key]))
        if changed:
            raise TuneSetupError(
                f"--resume needs the settings of the interrupted search; changed: "
                f"{', '.join(changed)} (saved in {saved})"
            )
        _check_ray_state(experiment_dir)
    elif experiment_dir.exists() and any(experiment_dir.iterdir()):
        raise TuneSetupError(
            f"{experiment_dir} already holds a search: add --resume to continue it or pick "
            "another --name"
        )


def _check_ray_state(experiment_dir: Path) -> None:
    """Ray resumes from its experiment state; without it ``Tuner.restore`` ran every
    trial again from the start, as a new search would."""
    from ray import tune
    from ray.tune.execution.tune_controller import TuneController

    state = experiment_dir.glob(TuneController.CKPT_FILE_TMPL.format("*"))
    if not tune.Tuner.can_restore(str(experiment_dir)) or next(state, None) is None:
        raise TuneSetupError(
            f"{experiment_dir} holds no Ray experiment state (experiment_state-*.json), so "
            "the search cannot continue where it stopped; its finished trials stay there. "
            "Start a new search under another --name"
        )


def _shared_dataset(config, space):
    """The dataset loaded once for every trial, when the space changes no dataset
    setting; else ``None`` (each trial loads its own)."""
    if set(space) & _dataset_keys():
        return None
    from recbole.data import create_dataset
    from recbole.utils import init_seed

    init_seed(config["seed"], config["reproducibility"])
    return create_dataset(config)


def _run_on_ray(ray, job, shared, searcher, mode, asha, experiment, options, verbose):
    """Start or join Ray, check its resources, run the trials; ``(results,
    interrupted)``.  ``asha``: ``(validation rounds, grace period)`` or ``None``."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    address = options.ray_address or os.environ.get("RAY_ADDRESS") or None
    started = start_or_join(ray, address, options.num_cpus, error=TuneSetupError)
    cpus, gpus = options.cpus_per_trial, options.gpus_per_trial
    try:
        check_resources(
            ray.cluster_resources(),
            {"CPU": (cpus, "cpus_per_trial"), "GPU": (gpus, "gpus_per_trial")},
            started,
            local=address is None,
            warn=lambda message: print(message, file=sys.stderr),
            tasks="the trials",
            error=TuneSetupError,
        )
        trainable = tune.with_resources(
            tune.with_parameters(run_trial, job=job, shared_dataset=shared),
            {"cpu": cpus, "gpu": gpus},
        )
        scheduler = None
        if asha is not None:
            # One report per validation round plus the final one: max_t lets the last
            # epoch pass, so that the test evaluation still runs.
            rounds, grace_period = asha
            scheduler = ASHAScheduler(
                time_attr="training_iteration", max_t=rounds + 1, grace_period=grace_period
            )
        return _fit(trainable, searcher, ("valid_score", mode), scheduler, experiment, verbose)
    finally:
        if started:
            shutdown(ray)


def _test_stopped_trials(results) -> dict[str, dict]:
    """Trial folder -> test results of each trial that ASHA stopped before its own test
    evaluation, from the best weights in its last checkpoint (``trial.test_stopped_trial``)."""
    from recbole_freq.jobs.tune.trial import test_stopped_trial

    tested = {}
    for result in results:
        metrics = result.metrics or {}
        if metrics.get("final") or result.error is not None or result.checkpoint is None:
            continue
        tested[str(result.path)] = test_stopped_trial(result.checkpoint)
    return tested


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
                # Each checkpoint holds the trial's best weights so far: the last suffices.
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                # RecBole's log/ and log_tensorboard/ go to the trial's working dir.
                sync_config=tune.SyncConfig(sync_artifacts=True),
            ),
        )
        experiment_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(experiment_dir / SPEC_FILE, json.dumps(plain_value(spec), indent=2))
    import logging

    import ray.tune.tune as ray_tune_run

    # On Ctrl-C Ray stops the search, saves its state and returns normally, printing a
    # hint that names its Tuner.restore API.  Its notices are muted (ours names
    # --resume --name) and the event its signal handler sets is kept to tell an
    # interrupted search from a finished one.
    # Keeping one checkpoint per trial makes Ray snapshot the experiment after each
    # report and warn about it every time; the snapshot is what --resume needs.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    ray_tune_logger = logging.getLogger("ray.tune.tune")
    level = ray_tune_logger.level
    ray_tune_logger.setLevel(logging.ERROR)
    setup = getattr(ray_tune_run, "_setup_signal_catching", None)
    events = []
    kept_log = _ray_log_to_file(experiment_dir / RAY_LOG_FILE)

    def keep_event():
        event = setup()
        events.append(event)
        _stop_gracefully_on_sigterm(event)
        return event

    if setup is not None:
        ray_tune_run._setup_signal_catching = keep_event
    try:
        results = tuner.fit()
    finally:
        kept_log()
        ray_tune_logger.setLevel(level)
        if setup is not None:
            ray_tune_run._setup_signal_catching = setup
    return results, any(event.is_set() for event in events)


# Ray's own account of the search (trial tracebacks included), kept beside its results:
# on the terminal the plugin's one line names it instead.
RAY_LOG_FILE = "ray.log"
RAY_LOGGERS = ("ray.tune", "ray.train")


def _ray_log_to_file(path: Path):
    """Send Ray Tune's log records to ``path`` instead of the terminal, until the
    returned function is called."""
    import logging

    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    loggers = [logging.getLogger(name) for name in RAY_LOGGERS]
    before = [logger.propagate for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False

    def restore():
        for logger, propagate in zip(loggers, before):
            logger.removeHandler(handler)
            logger.propagate = propagate
        handler.close()

    return restore


def _stop_gracefully_on_sigterm(event) -> None:
    """SIGTERM stops a search as Ctrl-C does (Ray saves its state and returns), instead
    of Ray's own handler, which aborted the driver with a C stack dump (exit -6)."""
    import signal
    import threading

    from recbole_freq.utils.signals import mark_terminated

    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum, frame):
        mark_terminated()
        event.set()

    signal.signal(signal.SIGTERM, stop)


def default_search_name(model: str, dataset: str) -> str:
    """``<model>-<dataset>-<time>``: the experiment folder of a search given no --name."""
    # A researcher's own package.module:Class is named by its class, as its runs are.
    return f"{str(model).rpartition(':')[2]}-{dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
