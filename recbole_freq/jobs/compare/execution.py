"""Training a comparison's runs: one after another in this process, packed onto this
machine (``--parallel``: several processes, each with its own threads, sharing the CPU
cores or one GPU), or as Ray tasks (``--ray``, on a local instance or an existing
cluster).  Every path trains the same ``RunJob``s with ``train_job``, stores each run as
it finishes, stops every run at an epoch boundary once a time limit comes near
(``resume.EpochDeadline``), and says one line per run as it starts, finishes, stops or
fails."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from recbole_freq.compat.logs import console_warnings_only
from recbole_freq.jobs.compare.runs import (
    ComparisonError,
    entry_config_files,
    entry_model_name,
    entry_models,
    entry_overrides,
    partial_file,
    split_entry,
    store_run,
)
from recbole_freq.jobs.ray_cluster import check_resources, import_ray, shutdown, start_or_join
from recbole_freq.utils.files import OutputWriteError


@dataclass
class Execution:
    """How a comparison's runs go (``compare``'s ``execution``): one after another in
    this process (the default); ``parallel`` at once on this machine (a number, or
    ``auto``) with ``threads_per_run`` threads each; or, with ``ray``, as Ray tasks of
    ``cpus_per_run`` / ``gpus_per_run`` on the cluster at ``ray_address`` (else
    ``RAY_ADDRESS`` or a local instance).  ``time_limit`` (seconds) stops each run at an
    epoch boundary with its resume state; the same call continues it."""

    parallel: int | str | None = None
    threads_per_run: int | None = None
    time_limit: float | None = None
    ray: bool = False
    ray_address: str | None = None
    cpus_per_run: float = 1.0
    gpus_per_run: float = 0.0
    deadline: float | None = field(default=None, init=False)
    runs: int = field(default=1, init=False)  # at once, once ``pack`` knows the device
    threads: int | None = field(default=None, init=False)

    @property
    def mode(self) -> str:
        return "ray" if self.ray else "sequential" if self.parallel is None else "packed"

    def check(self) -> None:
        """``ComparisonError`` naming the first option that does not fit the others."""
        if self.ray and (self.parallel is not None or self.threads_per_run is not None):
            raise ComparisonError(
                "--parallel and --threads_per_run pack runs onto this machine; with --ray "
                "the cluster packs them (--cpus_per_run, --gpus_per_run)"
            )
        if self.threads_per_run is not None and self.parallel is None:
            raise ComparisonError("--threads_per_run sets the threads of --parallel runs")
        if self.time_limit is not None and not self.time_limit > 0:
            raise ComparisonError(f"--time_limit {self.time_limit}: give a positive duration")
        ray_given = self.cpus_per_run != 1.0 or self.gpus_per_run != 0.0 or self.ray_address
        if not self.ray and ray_given:
            raise ComparisonError("--cpus_per_run, --gpus_per_run and --ray_address need --ray")
        if self.cpus_per_run <= 0 or self.gpus_per_run < 0:
            raise ComparisonError("--cpus_per_run must be > 0 and --gpus_per_run >= 0")

    def start_clock(self) -> None:
        if self.time_limit is not None:
            self.deadline = time.time() + self.time_limit

    def pack(self, gpu: bool) -> None:
        """Packed runs' count and threads, once the device is known (``packing``)."""
        if self.mode == "packed":
            self.runs, self.threads = packing(self.parallel, self.threads_per_run, gpu)


@dataclass(frozen=True)
class RunJob:
    """One run of a comparison grid: an entry (a model, or a model under a protocol or
    with another loss) on a dataset with a seed, and everything its training and its
    stored file need."""

    dataset: str
    entry: str
    seed: int
    out: Path
    settings: dict = field(hash=False)
    config_files: tuple = ()
    overrides: dict = field(default_factory=dict, hash=False)
    models: tuple = ()  # every entry of its comparison: they share the overrides
    paper_models: tuple = ()
    references: dict = field(default_factory=dict, hash=False)

    @property
    def name(self) -> str:
        return f"{split_entry(self.entry)[0]} on {self.dataset}, seed {self.seed}" + (
            f" ({split_entry(self.entry)[1]})" if split_entry(self.entry)[1] else ""
        )

    @property
    def resume_file(self) -> Path:
        # Absolute, never resolved: a link's target is not the grid's file to replace.
        return Path(os.path.abspath(partial_file(self.out, self.entry, self.seed)))


@dataclass
class Outcome:
    """What became of a grid's runs: ``trained`` and ``stopped`` (at the time limit, with
    their resume state) and ``not_started`` (the limit came first) as ``(dataset, entry,
    seed)``; ``failed`` as lines."""

    trained: list = field(default_factory=list)
    stopped: list = field(default_factory=list)
    not_started: list = field(default_factory=list)
    failed: list = field(default_factory=list)


def train_job(job: RunJob, deadline=None, workdir=None, threads=None, quiet=False) -> dict:
    """Train one run (the body of a packed process or a Ray task): ``{"summary": ...}``,
    ``{"stopped": progress}`` at the time limit, or ``{"not_started": True}`` when the
    limit had passed before it began.  ``threads``: this process's torch threads unless
    the run's settings pin them (``torch_threads``); ``quiet``: no progress bars (runs
    side by side would interleave them)."""
    from recbole_freq.quick_start.quick_start import run
    from recbole_freq.quick_start.resume import TimeLimitReached

    if deadline is not None and time.time() >= deadline:
        return {"not_started": True}
    if workdir and os.path.isdir(workdir):
        # Ray workers of a remote cluster may start elsewhere; relative paths
        # (data_path, checkpoint_dir, log/) are meant relative to the driver's folder.
        os.chdir(workdir)
    if threads:
        import torch

        from recbole_freq.utils.reproducibility import give_packed_runs

        torch.set_num_threads(threads)
        give_packed_runs(threads)  # a deterministic run pins these, not 1 (seen on a GPU)
    overrides = {
        **job.references.get(job.entry, {}),
        **job.overrides,
        **entry_overrides(job.entry),
        "seed": job.seed,
    }
    if quiet:
        overrides["show_progress"] = False
    with console_warnings_only():  # each run's log file keeps its whole account
        try:
            summary = run(
                split_entry(job.entry)[0],
                job.dataset,
                [*job.config_files, *entry_config_files(job.entry)],
                cmd_overrides=overrides,
                paper=job.entry in job.paper_models,
                shared_with=entry_models(job.models),
                resume_file=job.resume_file,
                deadline=deadline,
                # Removed by record_result once the run file is stored: a run file
                # that cannot be written must not take the finished run with it.
                leave_resume_state=True,
            )
        except TimeLimitReached as stop:
            return {"stopped": stop.progress}
    return {"summary": summary}


def record_result(job: RunJob, result: dict, outcome: Outcome, log, started: float) -> None:
    """Store a finished run; note a stopped or not-started one; one line each."""
    key = (job.dataset, job.entry, job.seed)
    minutes = (time.time() - started) / 60
    if "summary" in result:
        try:
            store_run(job.out, job.settings, job.entry, job.seed, result["summary"])
        except OutputWriteError as error:
            summary_file = result["summary"].get("summary_file")
            line = (
                f"{job.name}: {error}; the run finished"
                + (f" and its summary is in {summary_file}" if summary_file else "")
                + (
                    f"; its resume state stays in {job.resume_file}, so the same command "
                    "stores it once the folder can be written"
                    if job.resume_file.is_file()
                    else ""
                )
            )
            outcome.failed.append(line)
            log(f"FAILED   {line}")
            return
        job.resume_file.unlink(missing_ok=True)
        outcome.trained.append(key)
        log(f"done     {job.name}: {_finished_line(result['summary'])}; {minutes:.1f} min")
    elif "stopped" in result:
        outcome.stopped.append(key)
        progress = result["stopped"]
        log(
            f"stopped  {job.name} at the time limit after epoch {progress['epochs_done'] - 1}: "
            f"{_best_so_far(progress)}; {minutes:.1f} min; its resume state: {job.resume_file}"
        )
    else:
        outcome.not_started.append(key)
        log(f"waiting  {job.name}: not started, the time limit came first")


def _best_so_far(progress: dict) -> str:
    if progress.get("best_epoch") is None:
        return "no validation yet"
    return (
        f"best valid {progress['valid_metric']} {progress['best_valid_score']:.4f} "
        f"at epoch {progress['best_epoch']}"
    )


def _finished_line(summary: dict) -> str:
    test = summary["test_result"]
    shown = ", ".join(f"{m} {test[m]:.4f}" for m in ("hit@10", "ndcg@10") if m in test)
    best = _best_so_far(
        {
            "best_epoch": summary.get("best_epoch"),
            "valid_metric": summary.get("valid_metric"),
            "best_valid_score": summary.get("best_valid_score", float("nan")),
        }
    )
    return f"{summary['epochs_run']} epochs, {best}; test {shown or test}{_devices(summary)}"


def _devices(summary: dict) -> str:
    """``; trained on cuda:0, then cpu`` for a run whose segments ran on other devices."""
    earlier = [entry.get("device") for entry in summary.get("earlier_segments_environment", [])]
    devices = [device for device in [*earlier, summary.get("device")] if device]
    distinct = [d for i, d in enumerate(devices) if i == 0 or d != devices[i - 1]]
    return f"; trained on {', then '.join(distinct)}" if len(distinct) > 1 else ""


def _start_line(job: RunJob, running: int, waiting: int) -> str:
    return f"start    {job.name}{_resumes_at(job)} [{running} running, {waiting} waiting]"


def _resumes_at(job: RunJob) -> str:
    """Where a run continues from its resume state: the epoch and the best so far."""
    if not job.resume_file.is_file():
        return ""
    from recbole_freq.quick_start.resume import best_epoch, load_resume_state, progress_problem

    try:
        state = load_resume_state(job.resume_file)
    except Exception:  # the run itself reports a resume state it cannot use
        return " (continues from its resume state)"
    problem = progress_problem(
        state, model=entry_model_name(job.entry), dataset=job.dataset, seed=job.seed
    )
    if problem is not None:  # the run itself refuses it
        return f" (its resume state is not usable: {problem})"
    best = best_epoch(state)
    so_far = f", best valid {best['valid_score']:.4f} at epoch {best['epoch']}" if best else ""
    return f" (continues at epoch {state['next_epoch']}{so_far})"


# ---------------------------------------------------------------------------- paths


def limit_reached(deadline, outcome: Outcome) -> bool:
    """Whether a run may no longer start: the limit has passed, or a run has already
    stopped because its next epoch would end after it (a new run's first epoch, which
    it trains before any boundary, would most likely end after it too)."""
    return deadline is not None and (time.time() >= deadline or bool(outcome.stopped))


def run_sequential(jobs, log, deadline=None) -> Outcome:
    """One run after another in this process, with its threads."""
    outcome = Outcome()
    for index, job in enumerate(jobs):
        if limit_reached(deadline, outcome):
            for rest in jobs[index:]:
                record_result(rest, {"not_started": True}, outcome, log, time.time())
            break
        log(_start_line(job, 1, len(jobs) - index - 1))
        started = time.time()
        record_result(job, train_job(job, deadline), outcome, log, started)
    return outcome


def end_with_parent(parent_pid: int) -> None:
    """This process gets SIGTERM when its parent dies (Linux's parent-death signal), and
    ends now if the parent is already gone: a packed run whose grid was killed (-9) must
    not train on unseen, delete its resume state and never be stored, nor write the same
    ``partial/`` file as the run a new grid starts in its place."""
    import signal

    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGTERM)


def _packed_worker(queue, index: int, job: RunJob, deadline, threads, parent_pid=None) -> None:
    if parent_pid is not None:
        end_with_parent(parent_pid)
    try:
        result = train_job(job, deadline, threads=threads, quiet=True)
    except BaseException as error:  # reported by the parent, which goes on with the others
        result = {"failed": f"{type(error).__name__}: {error}"}
    queue.put((index, result))


def run_packed(jobs, log, parallel: int, threads: int, deadline=None) -> Outcome:
    """At most ``parallel`` runs at once, each in a process of its own (started fresh,
    so that no run inherits another's state) with ``threads`` torch threads, on this
    machine's cores or its GPU; a run that fails is reported and the others go on."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # CUDA and forked threads do not mix
    queue = context.Queue()
    waiting, running, outcome = list(enumerate(jobs)), {}, Outcome()
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                if limit_reached(deadline, outcome):
                    for _, job in waiting:
                        record_result(job, {"not_started": True}, outcome, log, time.time())
                    waiting = []
                    break
                index, job = waiting.pop(0)
                process = context.Process(
                    target=_packed_worker,
                    args=(queue, index, job, deadline, threads, os.getpid()),
                )
                process.start()
                running[index] = (process, job, time.time())
                log(_start_line(job, len(running), len(waiting)))
            if not running:
                break
            index, result = _next_result(queue, running)
            process, job, started = running.pop(index)
            process.join()
            if "failed" in result:
                outcome.failed.append(f"{job.name}: {result['failed']}")
                log(f"FAILED   {job.name}: {result['failed']}")
            else:
                record_result(job, result, outcome, log, started)
    finally:
        for process, _, _ in running.values():  # interrupted: the runs keep their resume states
            process.terminate()
            process.join()
    return outcome


def _next_result(queue, running: dict) -> tuple[int, dict]:
    """The next ``(index, result)`` a packed run sends; a process that ended without
    sending one (killed, out of memory) is a failed run, not a wait forever."""
    import queue as queues

    while True:
        try:
            return queue.get(timeout=5)
        except queues.Empty:
            pass
        for index, (process, _, _) in running.items():
            if not process.is_alive():
                try:  # it may have sent its result just before ending
                    return queue.get(timeout=5)
                except queues.Empty:
                    return index, {"failed": f"its process ended with code {process.exitcode}"}


def run_on_ray(jobs, log, execution: Execution) -> Outcome:
    """Every run as a Ray task with ``cpus_per_run`` / ``gpus_per_run``; the cluster
    packs them (an existing one at ``address``, or a local instance)."""
    ray = import_ray("--ray", "ray[default]", ComparisonError)
    started_here = start_or_join(ray, execution.ray_address, error=ComparisonError)
    try:
        _check_ray_resources(ray.cluster_resources(), execution, started_here, log)
    except ComparisonError:
        if started_here:
            shutdown(ray)
        raise
    cpus, deadline = execution.cpus_per_run, execution.deadline
    remote = ray.remote(train_job).options(
        num_cpus=cpus, num_gpus=execution.gpus_per_run, max_retries=0
    )
    workdir, threads = os.getcwd(), max(1, int(cpus))
    pending = {
        remote.remote(job, deadline, workdir, threads, True): (job, time.time()) for job in jobs
    }
    log(f"submitted {len(pending)} runs to Ray")
    outcome = Outcome()
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            job, started = pending.pop(done[0])
            try:
                result = ray.get(done[0])
            except Exception as error:  # reported; the other runs go on
                outcome.failed.append(f"{job.name}: {error}")
                log(f"FAILED   {job.name}: {error}")
                continue
            record_result(job, result, outcome, log, started)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started_here:
            shutdown(ray)
    return outcome


def _check_ray_resources(resources: dict, execution: Execution, started_here: bool, log) -> None:
    """A run asking for more than the cluster has waits forever: refused on a local
    instance, a warning on a cluster (``ray_cluster.check_resources``)."""
    wanted = {
        "CPU": (execution.cpus_per_run, "cpus_per_run"),
        "GPU": (execution.gpus_per_run, "gpus_per_run"),
    }
    local = not (execution.ray_address or os.environ.get("RAY_ADDRESS"))
    check_resources(resources, wanted, started_here, local, log, error=ComparisonError)


def packing(parallel, threads_per_run, gpu: bool) -> tuple[int, int]:
    """``(runs at once, threads per run)`` for ``--parallel`` (a number, or ``auto``: as
    many runs as the cores hold at ``threads_per_run`` each, 1 by default; on a GPU,
    which the runs share, one per core as well) and ``--threads_per_run`` (default: the
    cores shared out among the runs)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = max(1, cores or 1)
    if threads_per_run is not None and threads_per_run < 1:
        raise ComparisonError(f"--threads_per_run {threads_per_run}: give 1 or more")
    if parallel == "auto":
        runs = max(1, cores // (threads_per_run or 1))
    else:
        try:
            runs = int(parallel)
        except (TypeError, ValueError):
            raise ComparisonError(
                f"--parallel {parallel!r}: give a number of runs at once, or auto"
            ) from None
        if runs < 1:
            raise ComparisonError(f"--parallel {runs}: give 1 or more runs at once")
    threads = threads_per_run or max(1, cores // runs)
    if runs * threads > cores and not gpu:
        raise ComparisonError(
            f"--parallel {runs} x --threads_per_run {threads} asks for {runs * threads} "
            f"threads on {cores} cores: the runs would fight over them (and take longer "
            "than one after another)"
        )
    return runs, threads
