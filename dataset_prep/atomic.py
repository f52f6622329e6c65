"""All-or-nothing output: staged temporary files, replaced into place at the end.

Temporaries live in the target directory so `os.replace` is an atomic rename
on the same filesystem; readers therefore see either the old file or the
complete new one, never a partial write.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from .errors import UsageError

# .<name>.recbole-freq.<pid>-<random>.tmp: the marker says the file is ours (nothing is
# removed that another program may have named alike) and the process that owns it is in
# its name, so a later run can tell the leftovers of a killed process from a live one's.
TEMPORARY_MARKER = "recbole-freq"
_TEMPORARY = re.compile(rf"^\.(?P<name>.+)\.{TEMPORARY_MARKER}\.(?P<pid>\d+)-[0-9a-f]{{16}}\.tmp$")


def temporary_name(target: Path) -> Path:
    """``.<name>.recbole-freq.<pid>-<random>.tmp`` beside ``target``: unpredictable
    (nobody can plant a link there in advance), marked as ours and naming its owner
    process."""
    token = secrets.token_hex(8)
    return target.with_name(f".{target.name}.{TEMPORARY_MARKER}.{os.getpid()}-{token}.tmp")


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temporaries(directory: Path | str) -> list[str]:
    """Remove the temporary files that killed processes left in ``directory``: only
    names with our marker (``temporary_name``) whose process is gone; a live process's
    temporary files and every other program's files are left alone.  Returns the names
    removed."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMPORARY.match(entry.name)
        if match is None or _process_alive(int(match["pid"])):
            continue
        if not entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed.append(entry.name)
    return removed


class Stage:
    """Temporary files in one directory waiting to be renamed into place."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._pending: list[tuple[Path, Path, BinaryIO]] = []
        self._removals: list[Path] = []

    def open(self, filename: str) -> BinaryIO:
        """A binary file that becomes `directory/filename` on commit."""
        final = self.directory / filename
        tmp = temporary_name(final)
        # os.open with 0o666 lets the umask decide permissions, like a plain open().
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        fh = os.fdopen(fd, "wb")
        self._pending.append((tmp, final, fh))
        return fh

    def remove(self, filename: str) -> None:
        """Delete `directory/filename`, if present, after the renames of `commit`.

        For files an earlier run wrote that this run does not, so that no stale
        file is left beside the new ones.
        """
        self._removals.append(self.directory / filename)

    def commit(self) -> None:
        """Flush every temporary to disk, rename each over its target, then remove."""
        for _, _, fh in self._pending:
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
        while self._pending:
            tmp, final, _ = self._pending[0]
            os.replace(tmp, final)
            self._pending.pop(0)
        while self._removals:
            with contextlib.suppress(FileNotFoundError):
                self._removals[0].unlink()
            self._removals.pop(0)

    def discard(self) -> None:
        """Close and delete every temporary not yet renamed."""
        for tmp, _, fh in self._pending:
            with contextlib.suppress(OSError):
                fh.close()
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        self._pending.clear()
        self._removals.clear()


@contextlib.contextmanager
def staged_output(directory: Path | str) -> Iterator[Stage]:
    """Create `directory` if needed and commit the staged files if the block succeeds.

    On any exception (KeyboardInterrupt included) the temporaries are removed
    and directories this call created are removed again if they are empty.
    """
    directory = Path(directory)
    created = _make_dirs(directory)
    try:
        lock = _lock_folder(directory)
    except BaseException:
        for path in reversed(created):
            with contextlib.suppress(OSError):
                path.rmdir()
        raise
    try:
        remove_stale_temporaries(directory)
        stage = Stage(directory)
        try:
            yield stage
            stage.commit()
        except BaseException:
            stage.discard()
            for path in reversed(created):
                with contextlib.suppress(OSError):
                    path.rmdir()  # fails, as wanted, if anything is in it
            raise
    finally:
        if lock is not None:
            os.close(lock)  # releases the lock


def lock_folder(directory: Path, busy_message: str) -> int | None:
    """An exclusive lock on ``directory`` itself (no lock file is left behind), as an
    open descriptor (closing it releases the lock); ``UsageError(busy_message)`` if
    another process holds it, None where folders cannot be locked (then nothing is
    excluded)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return None
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(busy_message) from None
    except OSError:
        os.close(fd)
        return None
    return fd


def _lock_folder(directory: Path) -> int | None:
    """Two preparations of one dataset at once would otherwise publish the files of two
    inputs side by side."""
    return lock_folder(
        directory,
        f"another dataset_prep is writing {directory} right now; wait for it to finish "
        "and run again",
    )


def _make_dirs(directory: Path) -> list[Path]:
    """mkdir -p, returning the directories actually created, outermost first."""
    missing = []
    path = directory
    while not path.exists():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    if path.exists() and not path.is_dir():
        raise UsageError(f"cannot create output directory {directory}: {path} is not a directory")
    created = []
    try:
        for path in reversed(missing):
            try:
                path.mkdir()
            except FileExistsError:
                if not path.is_dir():
                    raise UsageError(
                        f"cannot create output directory {directory}: {path} is not a directory"
                    ) from None
                continue  # made concurrently by someone else: not ours to remove
            created.append(path)
    except BaseException:
        for path in reversed(created):
            with contextlib.suppress(OSError):
                path.rmdir()
        raise
    return created


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
