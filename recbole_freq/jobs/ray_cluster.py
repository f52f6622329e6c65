"""Starting or joining Ray, and checking that its resources fit the tasks: one place for
the search (``recbole_freq.jobs.tune``) and the comparison's ``--ray`` mode.

- ``import_ray``: Ray, or one line saying what to install;
- ``check_address``: fail in seconds on an address nothing listens on (``ray.init``
  would retry for minutes);
- ``start_or_join``: join ``address`` (else ``RAY_ADDRESS``) or start a local Ray, never
  the cluster Ray's temp folder last recorded;
- ``check_resources``: a task asking for more CPUs or GPUs than the cluster has waits
  forever: refused on a local Ray this call started, a warning on a cluster (its
  autoscaler may still add nodes).

Errors are ``RaySetupError`` (a ``ValueError``: exit code 2), or the ``error`` class a
caller passes for its own messages.
"""

from __future__ import annotations

import os
import socket
import sys


class RaySetupError(ValueError):
    """Ray cannot be imported, reached or started as asked."""


# The oldest Ray tested on numpy 2 (setup.cfg asks for it too).
OLDEST_RAY = (2, 40)


def _ray_older_than(oldest: tuple[int, int]) -> str | None:
    """The installed Ray's version if it is older than ``oldest``, else ``None`` (also
    when Ray is not installed or its version is unreadable: the import then says why)."""
    import importlib.metadata
    import re

    try:
        version = importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        return None
    numbers = re.match(r"(\d+)\.(\d+)", version)
    if numbers and tuple(map(int, numbers.groups())) < oldest:
        return version
    return None


def import_ray(purpose: str, install: str, error: type[Exception] = RaySetupError):
    """``import ray`` (and ``ray.tune`` when ``install`` names it), or ``error``."""
    too_old = _ray_older_than(OLDEST_RAY)
    if too_old:
        raise error(
            f"{purpose} needs Ray >= {'.'.join(map(str, OLDEST_RAY))}, found {too_old}, which "
            "cannot import on numpy 2 (installing RecBole without --no-deps brings Ray 2.6.3 "
            f"back). Install a current one with: pip install '{install}>={'.'.join(map(str, OLDEST_RAY))}'"
        )
    try:
        import ray

        if "tune" in install:
            from ray import tune  # noqa: F401
    except ImportError as failure:
        raise error(
            f"{purpose} needs Ray, which cannot be imported ({failure}). Install it with: "
            f"pip install '{install}'"
        ) from None
    return ray


def check_address(address: str, timeout: float = 5.0, error=RaySetupError) -> None:
    """Refuse an address that is not ``host:port`` or where nothing listens.  ``auto``
    and ``local`` are left to ``ray.init``."""
    if address in ("auto", "local"):
        return
    host_port = address.split("://", 1)[-1].rstrip("/")
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise error(
            f"Ray address {address!r} is not host:port (e.g. 10.0.0.5:6379 or "
            "ray://10.0.0.5:10001), 'auto' or 'local'"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as failure:
        raise error(
            f"cannot reach the Ray cluster at {address}: {failure}. Check the address (the "
            "head node prints it after 'ray start --head'), or leave out --ray_address "
            "and RAY_ADDRESS to start a local Ray."
        ) from None


def check_token_authentication(address: str, error=RaySetupError) -> None:
    """Refuse, in one line that says what to set, a cluster whose token authentication
    (Ray >= 2.52, ``RAY_AUTH_MODE=token``) rejects this process: ``ray.init`` would only
    report "Failed to connect" after retrying.  A ``ray://`` client address, or a Ray
    without the probe's API, is left to ``ray.init``."""
    if address in ("auto", "local") or "://" in address:
        return
    try:
        from ray._raylet import GcsClient
        from ray.exceptions import AuthenticationError
    except ImportError:
        return
    try:
        GcsClient(address=address).internal_kv_get(b"recbole-freq-probe", namespace=None, timeout=5)
    except AuthenticationError:
        mode = os.environ.get("RAY_AUTH_MODE", "disabled")
        missing = (
            "set RAY_AUTH_MODE=token and the cluster's token"
            if mode != "token"
            else "RAY_AUTH_MODE is token but the token is missing or not the cluster's: set"
        )
        raise error(
            f"the Ray cluster at {address} uses token authentication: {missing} "
            "(RAY_AUTH_TOKEN, a file named by RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token; "
            "'ray get-auth-token' on the head node prints it), then run again"
        ) from None
    except Exception:  # noqa: BLE001 (any other answer: ray.init reports it)
        return


def start_or_join(ray, address=None, num_cpus=None, error=RaySetupError) -> bool:
    """Join ``address`` (else ``RAY_ADDRESS``) or start a local Ray; True if this call
    started or joined it (and so should shut it down), False if Ray was already up.
    Worker output stays in the per-run RecBole logs instead of the console."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        check_address(address, error=error)
    if ray.is_initialized():
        return False
    if address:
        check_token_authentication(address, error=error)
    global _watcher
    import signal

    from recbole_freq.jobs import ray_reaper

    # ray.init replaces SIGTERM's handler (its own calls sys.exit, which ended a
    # comparison with a C stack dump and no way on); the command line's is put back.
    sigterm_handler = signal.getsignal(signal.SIGTERM)
    # Ray's C++ failure handler printed that dump on SIGTERM; this driver's signals are
    # handled in Python (its workers keep theirs: they read the environment, not this).
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    try:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            _watcher = ray_reaper.start_watcher()
            # "local": without it ray.init joins whatever cluster the address file in the
            # shared temp folder names ($RAY_TMPDIR/ray/ray_current_cluster, writable by
            # every user), a stranger's or a dead one.
            ray.init(
                address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False
            )
    except (ConnectionError, TimeoutError, RuntimeError) as failure:
        shutdown(ray)
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        raise error(f"cannot start or join {where}: {failure}") from None
    except BaseException:  # Ctrl-C while Ray starts: nothing of it is left running
        shutdown(ray)
        raise
    finally:
        if sigterm_handler is not None and _is_main_thread():
            signal.signal(signal.SIGTERM, sigterm_handler)
    return True


# The watcher of the local Ray this process started (``ray_reaper``), while it runs.
_watcher = None


def shutdown(ray) -> None:
    """Shut down the Ray this process started or joined; a local one's processes are all
    gone when this returns (``ray_reaper``), Ray's agents included."""
    global _watcher
    from recbole_freq.jobs import ray_reaper

    try:
        ray.shutdown()
    finally:
        watcher, _watcher = _watcher, None
        ray_reaper.release(watcher)


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def check_resources(
    resources: dict,
    wanted: dict[str, tuple[float, str]],
    started_here: bool,
    local: bool,
    warn,
    tasks: str = "the runs",
    hint: str = "",
    error=RaySetupError,
) -> None:
    """``wanted``: resource (``CPU``, ``GPU``) -> (amount per task, the option that set it).
    A shortfall is ``error`` on a local Ray this call started, else ``warn(message)``."""
    for kind, (amount, option) in wanted.items():
        total = resources.get(kind, 0.0)
        if amount <= total:
            continue
        message = (
            f"--{option}={amount:g} but the Ray cluster has {total:g} {kind}(s): {tasks} "
            "would wait forever"
        )
        if started_here and local:
            raise error(f"{message}; lower --{option}{hint}")
        warn("warning: " + message + " unless the cluster grows")
