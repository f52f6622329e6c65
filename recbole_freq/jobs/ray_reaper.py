"""The end of a local Ray this process started, however this process ends.

``ray.shutdown()`` stops the local instance when the driver ends normally; a driver
killed with ``kill -9`` left ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent``
running under init (they ignore SIGTERM).  So before a local Ray starts, a small
watcher process is started beside the driver.  It follows the driver's process tree:
every process the driver starts from then on (Ray's GCS and raylet) and everything those
start (agents, workers) is noted, with its start time (a PID can be reused).  When the
driver releases the watcher (after ``ray.shutdown()``), or dies and so closes the pipe
the watcher reads, the watcher freezes every noted process still alive (SIGSTOP, so that
none starts another), adds what they started meanwhile, and kills them (SIGKILL).

Ray's processes rename themselves (``setproctitle`` overwrites their command line and
environment), so they are found by their parents, not by a mark.  A cluster this
process only joined is never touched: no watcher is started for it.  Only processes
whose command line names Ray are killed, in case the driver started anything else.

Run as a script (``python ray_reaper.py DRIVER_PID``) by ``start_watcher``: it imports
nothing of the package, so it starts in milliseconds.  Linux only (it reads ``/proc``);
elsewhere no watcher is started.
"""

from __future__ import annotations

import os
import select
import signal
import sys

# How often the watcher reads the process table while the driver lives (seconds).
POLL_SECONDS = 0.25


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every live process."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":  # a zombie is already dead
            table[int(name)] = (int(fields[1]), fields[19])  # ppid, starttime (stat 4, 22)
    return table


def descendants(roots, table, skip=frozenset()) -> set[int]:
    """The processes below ``roots`` in ``table``, not entering the subtrees of ``skip``."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, frontier = set(), list(roots)
    while frontier:
        for child in children.get(frontier.pop(), ()):
            if child not in found and child not in skip:
                found.add(child)
                frontier.append(child)
    return found


def names_ray(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"ray" in handle.read().lower()
    except OSError:
        return False


class Watch:
    """The processes started by ``driver`` after this watch began, and their own."""

    def __init__(self, driver: int):
        self.driver = driver
        table = process_table()
        # What the driver had started before (and this watcher) is not Ray's.
        self.before = descendants([driver], table) | {os.getpid()}
        self.noted: dict[int, str] = {}

    def note(self, table) -> None:
        for pid in descendants([self.driver, *self.noted], table, skip=self.before):
            self.noted.setdefault(pid, table[pid][1])

    def alive(self, table) -> list[int]:
        return [pid for pid, start in self.noted.items() if table.get(pid, (0, None))[1] == start]

    def end(self) -> None:
        """Freeze what is left, until nothing new appears, then kill it all."""
        frozen: set[int] = set()
        for _ in range(20):
            table = process_table()
            self.note(table)
            new = [pid for pid in self.alive(table) if pid not in frozen and names_ray(pid)]
            if not new:
                break
            for pid in new:
                _signal(pid, signal.SIGSTOP)
                frozen.add(pid)
        for pid in frozen:
            _signal(pid, signal.SIGKILL)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def start_watcher():
    """Start the watcher of this process's Ray processes (call it before ``ray.init``);
    the watcher process, or None where ``/proc`` is not there.  ``release`` it once Ray
    is shut down."""
    import subprocess

    if not os.path.exists(f"/proc/{os.getpid()}/stat"):
        return None
    watcher = subprocess.Popen(
        [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        # Out of the terminal's process group: Ctrl-C reaches the driver, not the watcher.
        start_new_session=True,
    )
    watcher.stdout.readline()  # it has read the table: what starts next is Ray's
    return watcher


def release(watcher, wait: float = 30.0) -> None:
    """Tell the watcher the driver is done with Ray: it kills what is left of it and
    ends; waits for that (at most ``wait`` seconds)."""
    import subprocess

    if watcher is None:
        return
    for stream in (watcher.stdin, watcher.stdout):
        try:
            stream.close()
        except OSError:
            pass
    try:
        watcher.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        pass


def _watch(driver: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch = Watch(driver)
    print("watching", flush=True)
    stdin = sys.stdin.fileno()
    while True:
        # End of file: the driver closed the pipe (``release``) or ended, kill -9
        # included (the kernel closes its end).
        ready, _, _ = select.select([stdin], [], [], POLL_SECONDS)
        if ready and not os.read(stdin, 4096):
            break
        watch.note(process_table())
    watch.end()


if __name__ == "__main__":
    _watch(int(sys.argv[1]))
