"""Torch's CPU threads on a machine shared with other work.

Torch's CPU kernels run on an OpenMP thread pool (GNU libgomp in the PyPI wheels).  With
no ``OMP_WAIT_POLICY`` set, a pool thread that reaches the barrier at the end of a
parallel region spins for about 3 ms before it sleeps, and a training step is thousands
of short regions.  On an idle machine that costs nothing.  When another process holds
one of the cores, the thread that lost its core finishes its share late while the
others spin on the remaining core, and every region waits: measured on a 2-core machine
with one other busy process, a small Transformer step took 2,453 ms with 2 threads,
818 ms with 1 thread and 537 ms with 2 threads under ``OMP_WAIT_POLICY=PASSIVE``, and
the main job's epoch 790 s against 73 s alone (``benchmarks/bench_shared_cpu.py``).

A passive policy fixes the shared machine and costs 7-9% of an idle machine's epoch (the
threads fall asleep between regions and are woken for the next); no fixed spin count
met both (``benchmarks/results/shared-cpu-spin-sweep-ml-100k-cpu.md``).  So where it can,
the package keeps OpenMP's own spin and shortens it only while the cores are contended
(``SpinGovernor``).  libgomp already switches to a short spin (100 iterations) whenever
it manages more threads than there are CPUs, as its manual documents for
``GOMP_SPINCOUNT``; the governor watches how long this process's threads wait for a
core (the run-queue delay in ``/proc/self/task/*/schedstat``) and, while they wait,
keeps one idle OpenMP team of its own alive, which puts libgomp over that count.  The
spin decides only when a waiting thread sleeps, never what is computed, so the numbers
of a run do not depend on it.

Where the governor cannot work (not Linux, torch's OpenMP not libgomp, no run-queue
statistics, or a container's CPU quota below the affinity mask: there a spinning thread
burns the quota itself), importing the package sets ``OMP_WAIT_POLICY=PASSIVE`` with
``GOMP_SPINCOUNT=1000`` as before: a waiting thread spins about 50 us, then sleeps.
A user's own ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is kept and switches both off.
libgomp reads its environment once, when torch loads it, so the passive fallback needs
``recbole_freq`` imported before torch (true of the command line, ``--compare``'s
workers, Ray workers); a program that imported torch first keeps OpenMP's default, and
the governor where it can work.  The run file says which (``omp_wait_policy_set_by``).

The thread count of a run that pins none (``torch_threads``, ``deterministic``,
``--threads_per_run``) is the number of cores this process may use: the CPUs in its
affinity mask (``os.sched_getaffinity``: ``taskset``, a batch scheduler's allocation),
lowered to a container's CPU quota (cgroup ``cpu.max``), unless ``OMP_NUM_THREADS`` or an
earlier ``torch.set_num_threads`` asked for fewer.  Both are recorded in every run file.
"""

from __future__ import annotations

import ctypes
import importlib.util
import math
import os
import sys
import threading
import time
from pathlib import Path

WAIT_POLICY_VARIABLE = "OMP_WAIT_POLICY"
PASSIVE = "PASSIVE"
SPIN_VARIABLE = "GOMP_SPINCOUNT"
# Spins before a waiting libgomp thread sleeps: about 50 us here, little CPU to take
# from other work (measured on the main job: as fast beside a busy process as no spin,
# alone within the noise of one round of it).
SHORT_SPIN = "1000"
# Tells the processes this one starts (--compare's workers, a local Ray) that the
# policy they inherit was the package's choice, not the user's.
SET_BY_PACKAGE_MARK = "RECBOLE_FREQ_OMP_WAIT_POLICY"
SET_BY_PACKAGE = "recbole_freq (unset by the user)"
SET_BY_GOVERNOR = "OpenMP's default, its short spin while the cores are contended (recbole_freq)"
SET_BY_USER = "the environment"
SET_TOO_LATE = "OpenMP's default (torch was imported before recbole_freq)"

_wait_policy: tuple[str | None, str | None] = (None, None)
_wait_policy_set_by: str | None = None
_cores_at_import = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def _torch_openmp_is_libgomp() -> bool:
    """Whether the torch this process runs (or will import) uses GNU libgomp."""
    if "torch" in sys.modules:
        return _loaded_libgomp_path() is not None
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    library = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return any(library.glob("libgomp*.so*"))


def _loaded_libgomp_path() -> str | None:
    """The libgomp torch runs on, among those this process has loaded (scikit-learn's
    wheel brings a copy of its own, and RecBole loads it before the first run)."""
    torch = sys.modules.get("torch")
    torch_folder = str(Path(torch.__file__).parent) if getattr(torch, "__file__", None) else None
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            return torchs_libgomp(maps, torch_folder)
    except OSError:
        return None


def torchs_libgomp(maps_lines, torch_folder: str | None) -> str | None:
    """The libgomp among ``/proc/self/maps``' lines that lies in torch's folder (its
    wheel's ``lib``), else the only one loaded; ``None`` when none or several others."""
    loaded = []
    for line in maps_lines:
        fields = line.split(None, 5)
        if len(fields) == 6 and "/libgomp" in fields[5] and fields[5].strip() not in loaded:
            loaded.append(fields[5].strip())
    for path in loaded:
        if torch_folder and path.startswith(torch_folder + os.sep):
            return path
    return loaded[0] if len(loaded) == 1 else None


def governor_unavailable() -> str | None:
    """Why the spin governor cannot work in this process (then the passive policy), or
    ``None`` when it can."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if _read_run_delays() == {}:
        return "no run-queue statistics (/proc/self/task/*/schedstat)"
    if not _torch_openmp_is_libgomp():
        return "torch's OpenMP is not GNU libgomp"
    limit = cgroup_cpu_limit()
    if limit and _cores_at_import and limit < _cores_at_import:
        return "a CPU quota below the affinity mask"
    return None


def choose_wait_policy() -> None:
    """Before torch loads OpenMP: OpenMP's own policy under the spin governor where it
    can work, else a passive wait policy, unless the user chose one."""
    global _wait_policy, _wait_policy_set_by
    if _wait_policy_set_by is not None:
        return
    chosen = os.environ.get(WAIT_POLICY_VARIABLE), os.environ.get(SPIN_VARIABLE)
    if any(chosen):
        inherited = os.environ.get(SET_BY_PACKAGE_MARK) == f"{chosen[0]} {chosen[1]}"
        _wait_policy = chosen
        _wait_policy_set_by = SET_BY_PACKAGE if inherited else SET_BY_USER
    elif governor_unavailable() is None:
        _wait_policy, _wait_policy_set_by = (None, None), SET_BY_GOVERNOR
    elif "torch" in sys.modules:
        _wait_policy, _wait_policy_set_by = (None, None), SET_TOO_LATE
    else:
        os.environ[WAIT_POLICY_VARIABLE] = PASSIVE
        os.environ[SPIN_VARIABLE] = SHORT_SPIN
        os.environ[SET_BY_PACKAGE_MARK] = f"{PASSIVE} {SHORT_SPIN}"
        _wait_policy, _wait_policy_set_by = (PASSIVE, SHORT_SPIN), SET_BY_PACKAGE


def wait_policy_record() -> dict:
    """The wait policy torch's OpenMP runs under in this process, and who chose it."""
    return {
        "omp_wait_policy": _wait_policy[0],
        "gomp_spincount": _wait_policy[1],
        "omp_wait_policy_set_by": _wait_policy_set_by,
    }


def cgroup_cpu_limit(root: str | os.PathLike = "/sys/fs/cgroup") -> int | None:
    """The whole CPUs a container's quota allows (cgroup v2 ``cpu.max``, else v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), rounded up; ``None`` without a quota."""
    root = Path(root)
    try:
        quota, _, period = (root / "cpu.max").read_text().strip().partition(" ")
        if quota == "max":
            return None
        return max(1, math.ceil(int(quota) / int(period or 100000)))
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask, lowered to the CPU quota."""
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:  # macOS, Windows: no affinity call
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return max(1, min(cores, limit) if limit else cores)


def default_threads() -> tuple[int, str]:
    """``(threads, why)`` for a run that pins none: the usable cores, or fewer where
    ``OMP_NUM_THREADS`` or an earlier ``torch.set_num_threads`` asked for fewer."""
    import torch

    current = torch.get_num_threads()
    if os.environ.get("OMP_NUM_THREADS"):
        return current, "OMP_NUM_THREADS"
    cores = usable_cores()
    if current < cores:
        return current, "set before the run (torch.set_num_threads)"
    return cores, "the cores this process may use"


def _read_run_delays(skip: int | None = None) -> dict[int, int]:
    """Nanoseconds each thread of this process has waited on a run queue for a core."""
    delays = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return delays
    for task in tasks:
        if int(task) == skip:
            continue
        try:
            with open(f"/proc/self/task/{task}/schedstat", encoding="ascii") as stat:
                delays[int(task)] = int(stat.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended between the listing and the read
    return delays


class SpinGovernor:
    """OpenMP's own spin while this process's threads find free cores; libgomp's short,
    oversubscribed spin while they wait for one (the module's docstring says why).

    Every ``interval`` seconds it sums how long the process's threads waited on a run
    queue.  ``engage_after`` intervals in a row above ``engage_rate`` (seconds of waiting
    per second: 0.1 is a tenth of a core's worth, where an idle machine gives about
    0.001 and one busy process beside two threads on two cores about 0.5) start an
    idle OpenMP team of its own; ``release_after`` intervals in a row below it end the
    team, so that a phase with one thread (evaluation's Python) does not flip it back
    and forth.
    """

    def __init__(self, libgomp, interval=0.5, engage_rate=0.1, engage_after=2, release_after=60):
        self.libgomp = libgomp
        self.interval, self.engage_rate = interval, engage_rate
        self.engage_after, self.release_after = engage_after, release_after
        self.team_threads = 1
        self.engaged = False
        self.engagements = 0
        self.engaged_seconds = 0.0
        self._streak = 0
        self._engaged_at = 0.0
        self._release = None
        self._thread = None

    def observe(self, wait_rate: float) -> str | None:
        """``"engage"``, ``"release"`` or ``None`` after one interval's waiting rate."""
        contended = wait_rate > self.engage_rate
        self._streak = self._streak + 1 if contended != self.engaged else 0
        if not self.engaged and self._streak >= self.engage_after:
            return "engage"
        if self.engaged and self._streak >= self.release_after:
            return "release"
        return None

    def helper_team_size(self) -> int:
        """Threads the idle team needs for libgomp to manage more threads than CPUs:
        it counts 1 for the first thread plus each team's threads beyond its first, and
        compares with the CPUs it saw when it started (the affinity mask then)."""
        cpus = max(self.libgomp.omp_get_num_procs(), _cores_at_import or 1)
        return max(2, cpus - self.team_threads + 2)

    def engage(self) -> None:
        import torch

        size = self.helper_team_size()
        if self.engaged or self.team_threads < 2 or size > MAX_HELPER_TEAM:
            return  # a run on one thread never waits at a barrier
        ready, self._release = threading.Event(), threading.Event()

        def hold_a_team(release=self._release):
            self.libgomp.omp_set_num_threads(size)  # this thread's own setting only
            torch.ones(size * PARALLEL_GRAIN).mul_(2.0)  # one parallel region: the team
            ready.set()
            release.wait()  # the team lives until this thread ends

        threading.Thread(target=hold_a_team, name="recbole_freq-spin-team", daemon=True).start()
        ready.wait(timeout=10)
        self.engaged, self._streak = True, 0
        self.engagements += 1
        self._engaged_at = time.monotonic()

    def release(self) -> None:
        if self._release is not None:
            self._release.set()
            self._release = None
        if self.engaged:
            self.engaged_seconds += time.monotonic() - self._engaged_at
        self.engaged, self._streak = False, 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._watch, name="recbole_freq-spin-governor", daemon=True
            )
            self._thread.start()

    def _watch(self) -> None:
        own = threading.get_native_id()
        before, then = _read_run_delays(own), time.monotonic()
        while True:
            time.sleep(self.interval)
            now, at = _read_run_delays(own), time.monotonic()
            waited = sum(max(0, delay - before.get(task, delay)) for task, delay in now.items())
            decision = self.observe(waited / 1e9 / max(at - then, 1e-9))
            if decision == "engage":
                self.engage()
            elif decision == "release":
                self.release()
            before, then = now, at

    def record(self) -> dict:
        engaged = self.engaged_seconds + (
            time.monotonic() - self._engaged_at if self.engaged else 0.0
        )
        return {"engagements": self.engagements, "engaged_seconds": round(engaged, 1)}


# Elements per thread that make torch split an elementwise operation across threads
# (torch's internal grain size is 32,768).
PARALLEL_GRAIN = 65536
# More idle threads than this for the governor's team (a machine whose affinity mask
# holds far more CPUs than a run uses) and it stays off.
MAX_HELPER_TEAM = 64
_governor: SpinGovernor | None = None


def govern_spinning(team_threads: int) -> SpinGovernor | None:
    """Start (once per process) or update the spin governor for a run of
    ``team_threads`` torch threads, where the package chose it; the governor or ``None``."""
    global _governor
    if _wait_policy_set_by != SET_BY_GOVERNOR or (team_threads < 2 and _governor is None):
        return _governor
    if _governor is None:
        path = _loaded_libgomp_path()
        if path is None:
            return None
        _governor = SpinGovernor(ctypes.CDLL(path))
        _governor.start()
    _governor.team_threads = team_threads
    return _governor


def governor_record() -> dict | None:
    """How often and how long this process's governor shortened the spin, or ``None``."""
    return None if _governor is None else _governor.record()


def _forget_governor_in_child() -> None:
    global _governor
    _governor = None  # a forked child has none of its parent's threads


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_governor_in_child)
