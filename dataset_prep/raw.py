"""Shared plumbing for raw-format readers.

A reader turns one raw file into `RawSequences`: users in output order, each
with its items in time order. `RawFile` gives readers numbered lines plus
the file's size and sha256 (recorded in the .stats.json) and a progress bar.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from .errors import RawInputError

# Small files convert in well under a second; a bar there is only noise.
PROGRESS_MIN_BYTES = 1 << 20


@dataclass(frozen=True)
class RawSource:
    """Identity of a raw input file."""

    path: Path
    size: int
    sha256: str

    def to_dict(self) -> dict[str, str | int]:
        # The bare file name keeps the .stats.json identical wherever the raw file lives.
        return {"file": self.path.name, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class RawSequences:
    """Parsed raw data: (user token, item tokens in time order), in output order.

    Tokens must be non-empty and free of whitespace; they are written verbatim.
    """

    source: RawSource
    sequences: list[tuple[str, list[str]]]


class RawFile:
    """A raw file read as numbered byte lines, hashed on the way.

    Use as a context manager so the file and the progress bar are closed even
    when a reader stops at a malformed line::

        with RawFile(path, show_progress=True) as raw:
            for number, line in raw:
                ...
        raw.source  # size and sha256, once every line was read
    """

    def __init__(self, path: Path | str, *, show_progress: bool = True) -> None:
        self.path = Path(path)
        self.show_progress = show_progress
        self._digest = hashlib.sha256()
        self._size = 0
        self._done = False
        self._fh: BinaryIO | None = None
        self._bar: tqdm | None = None

    def __enter__(self) -> RawFile:
        try:
            self._fh = open(self.path, "rb")
        except FileNotFoundError:
            raise RawInputError(f"raw file not found: {self.path}") from None
        except IsADirectoryError:
            raise RawInputError(f"raw path is a directory, not a file: {self.path}") from None
        except OSError as exc:
            raise RawInputError(f"cannot read raw file {self.path}: {exc.strerror}") from None
        total = os.fstat(self._fh.fileno()).st_size
        self._bar = tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            desc=f"reading {self.path.name}",
            disable=not self.show_progress or total < PROGRESS_MIN_BYTES,
            leave=False,
        )
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._fh is not None:
            self._fh.close()

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """Yield (1-based line number, line bytes including the newline)."""
        if self._fh is None or self._bar is None:
            raise RuntimeError("iterate a RawFile inside its `with` block")
        number = 0
        try:
            for number, line in enumerate(self._fh, start=1):
                self._digest.update(line)
                self._size += len(line)
                self._bar.update(len(line))
                yield number, line
        except OSError as exc:
            raise RawInputError(
                f"cannot read raw file {self.path} after line {number}: {exc.strerror}"
            ) from None
        self._done = True

    @property
    def source(self) -> RawSource:
        """Size and hash of the file; only valid once every line was read."""
        if not self._done:
            raise RuntimeError("RawFile.source read before the whole file was read")
        return RawSource(path=self.path, size=self._size, sha256=self._digest.hexdigest())


def show_token(token: bytes, limit: int = 40) -> str:
    """A raw token quoted for an error message, shortened and made printable."""
    text = token.decode("utf-8", errors="backslashreplace")
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return repr(text)
