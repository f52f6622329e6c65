"""A search folder trusted enough to resume: Ray keeps a search's state as pickles, so
only a folder its user alone could have written is read back (``--resume``)."""

from __future__ import annotations

import os
from pathlib import Path


class TuneSetupError(ValueError):
    """A search that cannot start as asked (missing package, bad option, no cluster)."""


def check_search_folder_trusted(folder: Path) -> None:
    """``TuneSetupError`` unless ``folder`` and everything in it belong to the current
    user and no one else can write them, nor replace them in their parent.

    Ray keeps a search's state as pickles (``tuner.pkl``, the searcher's state), and
    ``Tuner.restore`` unpickles them: a results folder is as trusted as a program, so
    ``--resume`` continues only a folder its user could have written alone."""
    import stat

    if not folder.is_dir():
        return  # "nothing to resume" is said next
    me = os.geteuid()

    def problem(path: Path, info) -> str | None:
        if info.st_uid != me:
            return f"{path} belongs to uid {info.st_uid}, not to you (uid {me})"
        group_writes = info.st_mode & stat.S_IWGRP and not _private_group(info.st_gid)
        if info.st_mode & stat.S_IWOTH or group_writes:
            return f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
        return None

    parent = folder.parent.stat()
    found = None
    if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
        found = f"{folder.parent} lets anyone replace the folder (writable by all, no sticky bit)"
    paths = [folder] + sorted(folder.rglob("*"))
    for path in paths:
        if found:
            break
        found = problem(path, path.lstat())
        if not found and path.is_symlink():
            found = problem(path, path.stat()) if path.exists() else None
    if found:
        raise TuneSetupError(
            f"refusing to resume {folder}: {found}. Ray's saved search state is pickled and "
            "runs as code when read: resume only a search folder that you alone could have "
            "written (or start afresh with another --name)"
        )


def _private_group(gid: int) -> bool:
    """Whether group ``gid`` is the current user's own (a user-private group, as a umask
    of 002 expects): its write permission then lets no one else in."""
    try:
        import grp
        import pwd

        group = grp.getgrgid(gid)
        me = pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return False
    return gid == os.getegid() and set(group.gr_mem) <= {me} and group.gr_name == me
