"""The one way the plugin reads a file it did not just write: a regular file of bounded
size, or one line saying what it is instead.

A pipe named like a run summary (``<checkpoint>.json``) or a comparison's run file made
``--recommend``, ``--evaluate`` and ``--compare`` wait forever, and a link to
``/dev/zero`` read until the memory ran out.  ``check_input_file`` refuses anything but a
regular file (following links, as ``open`` would) and any file above its size bound;
``read_input`` and ``read_input_text`` then read it opened non-blocking, checked again
on the open descriptor (a file swapped for a pipe in between is refused too), and never
more than the bound.  Errors are ``InputFileError`` (a ``ValueError``: exit code 2);
a missing file stays ``FileNotFoundError``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# Text the plugin reads (summaries, run records, manifests, id maps, yaml, hyper files,
# user lists): the largest real one is an id map of a few tens of MB.
MAX_INPUT_BYTES = 1 << 30


class InputFileError(ValueError):
    """A file to read that is not a regular file, or is larger than such a file can be."""


def file_kind(mode: int) -> str:
    """What a file of ``mode`` is, in words (``a pipe``, ``a device`` ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _check_status(status: os.stat_result, path: Path, what: str, limit: int) -> None:
    if not stat.S_ISREG(status.st_mode):
        raise InputFileError(
            f"{what} {path} is {file_kind(status.st_mode)}, not a regular file: reading it "
            "could wait forever or never end; name a regular file"
        )
    if status.st_size > limit:
        raise InputFileError(
            f"{what} {path} is {status.st_size:,} bytes, more than the {limit:,} such a file "
            "can hold; name the right file"
        )


def check_input_file(path: str | os.PathLike, what: str, limit: int = MAX_INPUT_BYTES) -> Path:
    """``path`` as a ``Path`` if it is a regular file of at most ``limit`` bytes."""
    path = Path(path)
    _check_status(path.stat(), path, what, limit)
    return path


def read_input(path: str | os.PathLike, what: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (``check_input_file``), at most ``limit``."""
    path = check_input_file(path, what, limit)
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(descriptor, "rb") as handle:
        _check_status(os.fstat(descriptor), path, what, limit)
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise InputFileError(f"{what} {path} grew past {limit:,} bytes while it was read")
    return data


def read_input_text(
    path: str | os.PathLike, what: str, limit: int = MAX_INPUT_BYTES, encoding: str = "utf-8"
) -> str:
    """``read_input`` decoded; a file that is not ``encoding`` is ``InputFileError``."""
    data = read_input(path, what, limit)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as error:
        raise InputFileError(f"{what} {path} is not {encoding} text ({error.reason})") from None
