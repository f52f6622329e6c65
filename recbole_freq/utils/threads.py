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

So the package sets ``OMP_WAIT_POLICY=PASSIVE`` with ``GOMP_SPINCOUNT=1000`` when it is
imported, unless the user set either (``ACTIVE`` is kept: a machine reserved for one run
may want it): a waiting thread spins about 50 us (libgomp's own default spins about
3 ms), then sleeps.  What that costs alone and saves beside other work, measured:
``docs/running.md``, "Threads on a shared machine".  LLVM's libomp (macOS wheels) reads the policy and
not the spin count.  libgomp reads both once, when torch loads it, so this only takes
effect when ``recbole_freq`` is imported before torch: true of the command line,
``--compare``'s worker processes (spawned with this environment), Ray workers (they
import the package to unpickle the trial) and a Python program that imports
``recbole_freq`` first.  A program that imported
torch first keeps OpenMP's default; the run file says so (``omp_wait_policy_set_by``).

The thread count of a run that pins none (``torch_threads``, ``deterministic``,
``--threads_per_run``) is the number of cores this process may use: the CPUs in its
affinity mask (``os.sched_getaffinity``: ``taskset``, a batch scheduler's allocation),
lowered to a container's CPU quota (cgroup ``cpu.max``), unless ``OMP_NUM_THREADS`` or an
earlier ``torch.set_num_threads`` asked for fewer.  Both are recorded in every run file.
"""

from __future__ import annotations

import math
import os
import sys
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
SET_BY_USER = "the environment"
SET_TOO_LATE = "OpenMP's default (torch was imported before recbole_freq)"

_wait_policy: tuple[str | None, str | None] = (None, None)
_wait_policy_set_by: str | None = None


def prefer_passive_wait() -> None:
    """Before torch loads OpenMP: a passive wait policy unless the user chose one."""
    global _wait_policy, _wait_policy_set_by
    if _wait_policy_set_by is not None:
        return
    chosen = os.environ.get(WAIT_POLICY_VARIABLE), os.environ.get(SPIN_VARIABLE)
    if any(chosen):
        inherited = os.environ.get(SET_BY_PACKAGE_MARK) == f"{chosen[0]} {chosen[1]}"
        _wait_policy = chosen
        _wait_policy_set_by = SET_BY_PACKAGE if inherited else SET_BY_USER
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
