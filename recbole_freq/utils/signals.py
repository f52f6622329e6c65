"""SIGTERM handled as Ctrl-C: ``kill`` or a scheduler's time limit stops a job where it
stands, keeps what it can, names the command that continues it, and exits with 143
(128 + 15) where Ctrl-C exits with 130.  Used by the command line (``recbole_freq.cli``)
and by a search, whose Ray driver would otherwise abort with a C stack dump."""

from __future__ import annotations


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C, with what was kept and how to continue (the message)."""


# Set when SIGTERM arrived: the interrupt it raised ends with 143, not Ctrl-C's 130.
_terminated = False


def on_sigterm(signum=None, frame=None) -> None:
    """SIGTERM (``kill``, a scheduler's time limit) is handled as Ctrl-C is: the job
    stops where it stands, keeps what it can and names the command that continues it."""
    global _terminated
    _terminated = True
    raise KeyboardInterrupt("terminated (SIGTERM)")


def terminated() -> bool:
    return _terminated


def mark_terminated() -> None:
    """Record a SIGTERM that a search handled itself (``recbole_freq.jobs.tune``)."""
    global _terminated
    _terminated = True


def catch_sigterm():
    """Install ``on_sigterm`` for the main thread; returns the handler it replaced."""
    import signal
    import threading

    global _terminated
    _terminated = False
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, on_sigterm)
