"""What decides a run's numbers beyond its settings, set and recorded.

The same seed and settings give the same metrics only on the same thread count, device
and library versions: a float sum over 2 threads is added in another order than over 1,
and the last bits of a loss part at once (then training follows another path).  So every
run file keeps ``environment_record`` (versions, device and its name, torch's thread
counts, whether deterministic algorithms were on), and ``deterministic: True`` (on by
default under ``--paper``) makes a run repeatable bit for bit:

- torch's intra-op threads are pinned to ``torch_threads`` (when unset: 1, or the
  ``--threads_per_run`` of a packed comparison's process), so the float reductions run
  in one order on every machine, whatever its core count;
- ``torch.use_deterministic_algorithms(True, warn_only=True)``: CUDA kernels that would
  add in a varying order (index_add, scatter_add, cuBLAS' split reductions) take their
  deterministic variants; an operation without one warns instead of stopping the run;
- ``CUBLAS_WORKSPACE_CONFIG`` is set (CUDA needs it for deterministic cuBLAS); cuDNN's
  deterministic kernels are RecBole's ``reproducibility: True`` (its default);
- ``MKL_CBWR=AVX2`` (Intel MKL's conditional numerical reproducibility), when the
  process's first run sets it before any matrix product: MKL otherwise picks its
  kernels by the processor's instruction set, so that two machines with different
  processors add a batched matrix product in another order (measured: RecBole's SASRec,
  one epoch on lastfm under ``sasrec``, loss 12.500072002 with MKL's own choice on this
  project's AVX-512 machine and 12.500071883 with ``COMPATIBLE``, each bit-identical over
  three fresh processes).  ``AVX2`` is the branch every x86 processor of the last decade
  runs; ``COMPATIBLE`` (any x86) made these matrix products 4x slower here.  A user's
  own ``MKL_CBWR`` is kept.

What no setting inside a run can fix: torch's own vectorised CPU kernels are chosen by
the processor as well (``cpu_capability`` in the record, e.g. AVX512 or AVX2), and
``ATEN_CPU_CAPABILITY`` is read when torch is imported; runs that must agree across
machines set ``ATEN_CPU_CAPABILITY=avx2`` in the environment of every process.

``torch_threads`` alone pins the thread count without the rest.  A run without either
(and outside a packed comparison) takes ``threads.default_threads()``: the cores this
process may use (affinity mask, container quota), or fewer where ``OMP_NUM_THREADS`` or
an earlier ``torch.set_num_threads`` asked for fewer; ``torch_threads_set_by`` in the
record says which rule set the count.
"""

from __future__ import annotations

import os
import platform

from recbole_freq.utils.threads import (
    default_threads,
    govern_spinning,
    usable_cores,
    wait_policy_record,
)

_DEFAULT_THREADS: tuple[int, str] | None = None
_PACKED_THREADS: int | None = None
_THREADS_SET_BY: str | None = None
# CUDA's documented setting for deterministic cuBLAS (the CUDA Toolkit's "Results
# reproducibility" section); it must be in the environment before cuBLAS starts.
CUBLAS_WORKSPACE = ":4096:8"
# MKL reads MKL_CBWR at its first call, so only the first run of a process can set it.
MKL_REPRODUCIBLE = "AVX2"


class ThreadSettingError(ValueError):
    """A ``torch_threads`` value that is not a positive whole number."""


def _setting(config, key):
    try:
        return config[key]
    except KeyError:
        return None


def run_threads(config) -> int | None:
    """The intra-op thread count a run pins (``None``: the process's default)."""
    return _pinned_threads(config)[0]


def _pinned_threads(config) -> tuple[int | None, str | None]:
    threads = _setting(config, "torch_threads")
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ThreadSettingError(
                f"torch_threads={threads!r} must be a whole number of threads, 1 or more"
            )
        return threads, "torch_threads"
    if _setting(config, "deterministic"):
        if _PACKED_THREADS:
            return _PACKED_THREADS, "deterministic, --threads_per_run"
        return 1, "deterministic (1 thread unless torch_threads)"
    return None, None


def give_packed_runs(threads: int) -> None:
    """The threads a packed run's process was given (``--threads_per_run``): what a
    deterministic run without ``torch_threads`` pins in that process instead of 1."""
    global _PACKED_THREADS
    _PACKED_THREADS = threads


def apply_determinism(config) -> None:
    """Set this process's threads and deterministic algorithms as ``config`` asks; a
    later run in the same process (a comparison, a search) that asks for neither gets
    the process's default threads (``threads.default_threads``) back."""
    import torch

    global _DEFAULT_THREADS, _THREADS_SET_BY
    first_run = _DEFAULT_THREADS is None
    if first_run:
        _DEFAULT_THREADS = default_threads()
    threads, why = _pinned_threads(config)
    if threads is None and _PACKED_THREADS:
        threads, why = _PACKED_THREADS, "--threads_per_run"
    elif threads is None:
        threads, why = _DEFAULT_THREADS
    torch.set_num_threads(threads)
    govern_spinning(threads)  # how waiting threads spin: utils/threads.py
    _THREADS_SET_BY = why
    deterministic = bool(_setting(config, "deterministic"))
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        if first_run:
            os.environ.setdefault("MKL_CBWR", MKL_REPRODUCIBLE)
    torch.use_deterministic_algorithms(deterministic, warn_only=True)


def _processor_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(module_name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module_name)
    except PackageNotFoundError:
        return None


_CODE_IDENTITY: dict | None = None


def code_identity() -> dict:
    """The code this process runs: the git commit of the checkout the package was
    imported from and whether its tracked files had uncommitted changes then (None for
    both where it is an installed package, not a checkout, or git is missing), and the
    package version.  Read once per process (a resumed run's later segments are other
    processes and record their own)."""
    global _CODE_IDENTITY
    if _CODE_IDENTITY is None:
        from pathlib import Path

        commit, changed = checkout_state(Path(__file__).resolve().parents[2])
        _CODE_IDENTITY = {
            "commit": commit,
            "uncommitted_changes": changed,
            "recbole_freq_version": _version("recbole-freq"),
        }
    return dict(_CODE_IDENTITY)


# What a checkout holds that is not code: the stored results (run files, resume states)
# change as runs go on, and a lent machine is sent the tree without some of them.
NOT_CODE = ("benchmarks/results",)


def checkout_state(root) -> tuple[str | None, bool | None]:
    """``(commit, uncommitted_changes)`` of the git checkout at ``root`` (both None where
    it is none, or git is missing); changes under ``NOT_CODE`` are not changes of code."""
    import subprocess

    # Neither hooks nor a file-system monitor (core.fsmonitor names a program) run:
    # nothing in the checkout's git configuration executes.
    git = ["git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null",
           "--no-optional-locks", "-C", str(root)]  # fmt: skip
    if not ((root / ".git").exists() and (root / "recbole_freq").is_dir()):
        return None, None
    try:
        commit = subprocess.run(
            [*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=20,
            check=True,
        ).stdout.strip() or None  # fmt: skip
        status = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no", "--", ".",
             *(f":(exclude){path}" for path in NOT_CODE)],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit, bool(status.strip())


def environment_record(config) -> dict:
    """What decides the run's numbers besides its settings: the code (its commit), library
    versions, the device and its name, torch's thread counts and the determinism
    switches in force."""
    import numpy
    import torch

    device = torch.device(str(_setting(config, "device") or "cpu"))
    if device.type == "cuda" and torch.cuda.is_available():
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = _processor_name()
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),  # plain str: resume states hold it (no TorchVersion)
        "recbole": _version("recbole"),
        "numpy": numpy.__version__,
        "recbole_freq": _version("recbole-freq"),
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "device": str(device),
        "device_name": device_name,
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "torch_threads_set_by": _THREADS_SET_BY,
        "torch_interop_threads": torch.get_num_interop_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl_cbwr": os.environ.get("MKL_CBWR"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        **wait_policy_record(),
        "code": code_identity(),
    }
