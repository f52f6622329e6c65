"""SIGTERM handled as Ctrl-C: ``kill`` or a scheduler's time limit stops a job where it
stands, keeps what it can, names the command that continues it, and exits with 143
(128 + 15) where Ctrl-C exits with 130.  Used by the command line (``recbole_freq.cli``)
and by a search, whose Ray driver would otherwise abort with a C stack dump.  While
torch is loading, either signal ends the process at once with its exit code: an
exception raised there would abort it."""

from __future__ import annotations

import os
import signal
import sys


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C, with what was kept and how to continue (the message)."""


# Set when SIGTERM arrived: the interrupt it raised ends with 143, not Ctrl-C's 130.
_terminated = False


def torch_is_loading() -> bool:
    """Whether ``import torch`` is running now (its package body is executing)."""
    spec = getattr(sys.modules.get("torch"), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))  # importlib's own flag


def _exit_at_once_if_torch_is_loading(signum: int) -> None:
    # While torch loads, its C++ code calls back into Python (pybind11); an exception
    # raised there cannot unwind and the process aborts ("terminate called after
    # throwing an instance of 'pybind11::error_already_set'", SIGABRT), so end it here.
    if torch_is_loading():
        os.write(2, b"interrupted: while torch was loading; stopped at once\n")
        os._exit(128 + signum)


def on_sigint(signum=None, frame=None) -> None:
    """Ctrl-C raises KeyboardInterrupt, as Python's own handler does, except while torch
    loads, where it ends the process at once (exit code 130)."""
    _exit_at_once_if_torch_is_loading(signal.SIGINT)
    raise KeyboardInterrupt


def on_sigterm(signum=None, frame=None) -> None:
    """SIGTERM (``kill``, a scheduler's time limit) is handled as Ctrl-C is: the job
    stops where it stands, keeps what it can and names the command that continues it."""
    global _terminated
    _exit_at_once_if_torch_is_loading(signal.SIGTERM)
    _terminated = True
    raise KeyboardInterrupt("terminated (SIGTERM)")


def terminated() -> bool:
    return _terminated


def mark_terminated() -> None:
    """Record a SIGTERM that a search handled itself (``recbole_freq.jobs.tune``)."""
    global _terminated
    _terminated = True


def catch_interrupts() -> dict:
    """Install ``on_sigint`` and ``on_sigterm`` for the main thread; returns the handlers
    they replaced (``restore_handlers`` puts them back)."""
    import threading

    global _terminated
    _terminated = False
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {
        signal.SIGINT: signal.signal(signal.SIGINT, on_sigint),
        signal.SIGTERM: signal.signal(signal.SIGTERM, on_sigterm),
    }


def restore_handlers(previous: dict) -> None:
    for signum, handler in previous.items():
        if handler is not None:  # None: installed outside Python, cannot be put back
            signal.signal(signum, handler)


def run_to_exit(main) -> int:
    """``main()``'s exit code (a ``SystemExit`` it raises, ``--help``'s, included), for
    ``sys.exit``; once it is known, Ctrl-C or SIGTERM (while the interpreter shuts down:
    Ray's, torch's and the loggers' clean-up) ends the process at once with that code.
    The job's files are written and its result reported: an interrupt there printed a
    traceback ("Exception ignored in atexit callback") or turned a finished job's 0 into
    130."""
    import threading

    try:
        code = main()
    except SystemExit as exit_:
        code = exit_.code
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # as sys.exit(message) does
        code = 1
    code = code or 0

    def at_once(signum, frame):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 (a closed stream: nothing to flush)
                pass
        os._exit(code)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, at_once)
        signal.signal(signal.SIGTERM, at_once)
    return code
