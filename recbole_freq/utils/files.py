"""The one way the plugin writes a file: whole or not at all, never through a planted link.

Every file the plugin produces (checkpoints, run summaries, comparison tables and figures,
analysis reports, recommendations, search results) goes through ``write_atomic``:

1. a temporary file is created *exclusively* in the target folder (``O_CREAT | O_EXCL |
   O_NOFOLLOW`` under an unpredictable name), so a link or file planted at a temporary
   name is never opened, let alone written through;
2. the content is written, flushed and ``fsync``-ed;
3. the temporary file is renamed over the target (atomic on one file system, and a link
   at the target is replaced, not followed), then the folder is ``fsync``-ed.

If any step fails (a full disk, a read-only folder, an interrupt) the temporary file is
removed, the previous file at the target is left exactly as it was, and
``OutputWriteError`` says which path could not be written and why, in one line.

``check_writable`` is the early form of the same promise: the command-line jobs call it
for each output location before training starts, so a run never trains for hours and
then finds it cannot store the result.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

# One naming and clean-up rule for every temporary file of the project (dataset_prep's
# too): .<name>.recbole-freq.<pid>-<random>.tmp, and a killed process's leftovers (that
# name, a process that is gone) are removed.
from dataset_prep.atomic import remove_stale_temporaries, temporary_name

__all__ = [
    "plain_value",
    "remove_stale_temporaries",
    "OutputPathError",
    "OutputWriteError",
    "check_output_file",
    "check_writable",
    "temporary_name",
    "write_atomic",
]


class OutputPathError(ValueError):
    """An output path of the wrong kind (a folder where a file is wanted, or the reverse):
    a usage error, exit code 2."""


class OutputWriteError(RuntimeError):
    """A file or folder the run must write cannot be written (an environment failure:
    exit code 1).  ``errno`` is the operating system's error number, when there is one."""

    def __init__(self, errno_: int | None, message: str):
        super().__init__(message)
        self.errno = errno_


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


def _os_error_in(error: BaseException) -> OSError | None:
    """The operating-system failure behind ``error``: writers such as ``torch.save`` wrap
    a failed write (ENOSPC ...) in an error of their own."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _open_exclusive(path: Path) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    flags |= getattr(os, "O_BINARY", 0)
    # 0o666 lets the umask decide the permissions, as a plain open() would.
    return os.open(path, flags, 0o666)


def _open_temporary(path: Path) -> BinaryIO:
    return os.fdopen(_open_exclusive(path), "wb")


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # not supported here (e.g. Windows): the rename itself is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_content(handle: BinaryIO, content) -> None:
    if isinstance(content, str):
        handle.write(content.encode("utf-8"))
    elif isinstance(content, (bytes, bytearray, memoryview)):
        handle.write(content)
    else:
        content(handle)


def write_atomic(
    path: str | os.PathLike, content: str | bytes | Callable[[BinaryIO], object]
) -> Path:
    """Write ``content`` to ``path`` atomically (see the module docstring).

    ``content`` is text (written as UTF-8), bytes, or a function that writes into the
    binary file object it is given (``torch.save``, ``figure.savefig`` ...).  The parent
    folder is created if missing.  Returns the target path.
    """
    target = Path(path)
    if target.is_dir():
        raise OutputPathError(f"cannot write {target}: it is a folder; name a file instead")
    _refuse_special_file(target, "cannot write")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputWriteError(
            error.errno, f"cannot write {target}: cannot create its folder ({_reason(error)})"
        ) from error
    temporary = temporary_name(target)
    try:
        handle = _open_temporary(temporary)
    except OSError as error:
        raise OutputWriteError(
            error.errno, f"cannot write {target}: {_reason(error)}; nothing was changed"
        ) from error
    try:
        with handle:
            _write_content(handle, content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        cause = _os_error_in(error)
        if cause is None:
            raise
        kept = "the previous file was kept" if target.exists() else "nothing was written"
        raise OutputWriteError(
            cause.errno, f"cannot write {target}: {_reason(cause)}; {kept}"
        ) from error
    _fsync_folder(target.parent)
    return target


def check_writable(folder: str | os.PathLike, what: str) -> Path:
    """Create ``folder`` if needed and prove a file can be created in it (and removed);
    ``OutputWriteError`` naming ``what`` otherwise.  Used before any training starts."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutputPathError(f"{what} {folder} is a file, not a folder; name a folder instead")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(folder)
        probe = temporary_name(folder / "write-probe")
        os.close(_open_exclusive(probe))
        os.unlink(probe)
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:  # the name given, not the machine: usage
            raise OutputPathError(
                f"{what} {folder}: a name in it is too long for the file system; give a shorter one"
            ) from error
        raise OutputWriteError(
            error.errno, f"cannot write to {what} {folder}: {_reason(error)}"
        ) from error
    return folder


def _refuse_special_file(target: Path, what: str) -> None:
    """``OutputPathError`` if ``target`` exists as anything but a regular file: a device,
    a pipe or a link (to ``/proc/self/fd/1`` ...) would be replaced by a regular file."""
    import stat

    from recbole_freq.utils.inputs import file_kind

    try:
        mode = target.lstat().st_mode
    except OSError:
        return
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    raise OutputPathError(
        f"{what} {target}: it is {file_kind(mode)}, which writing would replace with a regular file; "
        "name a regular file or a new one (stdout is the default where there is one)"
    )


def check_output_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` can be written as a file: not a folder, not a special file (a device, a
    pipe, a link), and its folder writable."""
    target = Path(path)
    if target.is_dir():
        raise OutputPathError(f"{what} {target} is a folder; name a file to write instead")
    _refuse_special_file(target, what)
    check_writable(target.parent, f"the folder of {what}")
    return target


def plain_value(value):
    """``value`` as plain Python for JSON, YAML and CSV: NumPy / torch / Ray scalars become
    numbers, tuples lists, dict keys strings, and anything else its ``str``."""
    if hasattr(value, "item") and not isinstance(value, (str, list, tuple, dict)):
        try:  # NumPy's float64 is a float, but YAML refuses it: convert it first
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            return str(value)
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain_value(v) for k, v in value.items()}
    return str(value)
