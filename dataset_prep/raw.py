"""Shared plumbing for raw-format readers.

A reader turns one raw file into either `RawSequences` (users in output
order, each with its items in time order: the one-line format, already
processed) or, for raw logs, rows fed to a `procedure.Collector`. `RawFile`
gives readers numbered lines, transparently gunzipped, plus the file's size
and sha256 (recorded in the .stats.json) and a progress bar.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from tqdm import tqdm

from .errors import RawFormatError, RawInputError

# Small files convert in well under a second; a bar there is only noise.
PROGRESS_MIN_BYTES = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGIC = b"PK\x03\x04"
_CHUNK = 1 << 20
# A line of a real log is a few kB (a long Yelp review); a longer one is a file without
# line breaks, read whole into memory (MemoryError on a 1.2 GB line).
MAX_LINE_BYTES = 64 << 20
_UTF8_BOM = b"\xef\xbb\xbf"
# Longest first: the UTF-32 LE mark begins with the UTF-16 LE one.
_OTHER_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)


@dataclass(frozen=True)
class RawSource:
    """Identity of a raw input file (its bytes as stored, compressed or not)."""

    path: Path
    size: int
    sha256: str

    def to_dict(self) -> dict[str, str | int]:
        # The bare file name keeps the .stats.json identical wherever the raw file lives.
        return {"file": self.path.name, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class IdMap:
    """Raw ids behind re-mapped ids: ``users[k]`` is the raw id of user ``k + 1``."""

    users: list[str]
    items: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"user": self.users, "item": self.items}


@dataclass(frozen=True)
class RawSequences:
    """Parsed data: (user token, item tokens in time order), in output order.

    Tokens must be non-empty and free of whitespace; they are written verbatim.
    `id_map` is set when the tokens are re-mapped ids (raw logs), and
    `details` holds what the preparation did (rows read, skipped, filtered).
    `times` holds, per sequence, each interaction's real time in seconds (raw logs;
    None for the one-line format, whose files hold only the order).
    """

    source: RawSource
    sequences: list[tuple[str, list[str]]]
    id_map: IdMap | None = None
    details: dict[str, Any] = field(default_factory=dict)
    times: list[list[float]] | None = None


class _Tap(io.RawIOBase):
    """A read-only view of a file that hashes, counts and reports every byte read.

    Sitting below the gzip decoder, it measures the stored (compressed) bytes,
    which is what the sha256 and the progress bar should describe.
    """

    def __init__(self, fh: BinaryIO, digest: Any, bar: tqdm) -> None:
        super().__init__()
        self._fh = fh
        self._digest = digest
        self._bar = bar
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._fh.readinto(buffer)
        if n:
            self._digest.update(memoryview(buffer)[:n])
            self.size += n
            self._bar.update(n)
        return n or 0


class RawFile:
    """A raw file read as numbered byte lines, hashed on the way.

    Gzip files are decompressed on the fly whatever their name, so a
    ``.json.gz`` need not be unpacked first. Use as a context manager so the
    file and the progress bar are closed even when a reader stops at a
    malformed line::

        with RawFile(path, show_progress=True) as raw:
            for number, line in raw:
                ...
        raw.source  # size and sha256, once every line was read
    """

    def __init__(self, path: Path | str, *, show_progress: bool = True) -> None:
        self.path = Path(path)
        self.show_progress = show_progress
        self.compressed = False
        self._digest = hashlib.sha256()
        self._done = False
        self._fh: BinaryIO | None = None
        self._tap: _Tap | None = None
        self._lines: BinaryIO | None = None
        self._bar: tqdm | None = None

    def __enter__(self) -> RawFile:
        try:
            self._fh = open(self.path, "rb", buffering=0)
        except FileNotFoundError:
            raise RawInputError(f"raw file not found: {self.path}") from None
        except IsADirectoryError:
            raise RawInputError(f"raw path is a directory, not a file: {self.path}") from None
        except OSError as exc:
            raise RawInputError(f"cannot read raw file {self.path}: {exc.strerror}") from None
        if not stat.S_ISREG(os.fstat(self._fh.fileno()).st_mode):
            # A device or pipe (/dev/zero) never ends, or ends anywhere: not a data file.
            self._fh.close()
            raise RawInputError(
                f"raw path {self.path} is not a regular file (a device, pipe or socket); "
                "give the downloaded or exported data file"
            )
        try:
            self._open_layers()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _open_layers(self) -> None:
        assert self._fh is not None
        total = os.fstat(self._fh.fileno()).st_size
        self._bar = tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            desc=f"reading {self.path.name}",
            disable=not self.show_progress or total < PROGRESS_MIN_BYTES,
            leave=False,
        )
        self._tap = _Tap(self._fh, self._digest, self._bar)
        buffered = io.BufferedReader(self._tap, _CHUNK)
        try:
            magic = buffered.peek(4)[:4]
        except OSError as exc:
            raise RawInputError(f"cannot read raw file {self.path}: {exc.strerror}") from None
        if magic == _ZIP_MAGIC:
            raise RawInputError(
                f"{self.path} is a zip archive: extract it and give the data file inside "
                "with --raw (see --list for the file each dataset needs)"
            )
        if magic[:2] == _GZIP_MAGIC:
            self.compressed = True
            self._lines = gzip.GzipFile(fileobj=buffered, mode="rb")
        else:
            self._lines = buffered

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._fh is not None:
            self._fh.close()

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """Yield (1-based line number, line bytes including the newline)."""
        if self._lines is None or self._tap is None:
            raise RuntimeError("iterate a RawFile inside its `with` block")
        number = 0
        try:
            for number, line in enumerate(_text_lines(self._bounded_lines()), start=1):
                if number == 1:
                    line = self._without_byte_order_mark(line)
                yield number, line
            # Read what no line consumed (gzip trailer, trailing bytes) so the
            # hash and size cover the whole file.
            while self._tap.read(_CHUNK):
                pass
        except EOFError:
            raise RawFormatError(
                self.path,
                number + 1,
                "the gzip data ends abruptly: the file is truncated (an interrupted "
                "download?); download it again",
            ) from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise RawFormatError(
                self.path,
                number + 1,
                f"the gzip data is corrupt ({exc}); download the file again",
            ) from None
        except OSError as exc:
            raise RawInputError(
                f"cannot read raw file {self.path} after line {number}: {exc.strerror}"
            ) from None
        self._done = True

    def _bounded_lines(self) -> Iterator[bytes]:
        """The stream's lines, each read with a bound: a line over ``MAX_LINE_BYTES``
        is a ``RawFormatError`` naming its number, not a read of the whole file."""
        assert self._lines is not None
        limit, number = MAX_LINE_BYTES, 0
        while line := self._lines.readline(limit + 1):
            number += line.count(b"\r") + 1  # as _text_lines will split it
            if len(line) > limit and not line.endswith(b"\n"):
                raise RawFormatError(
                    self.path,
                    number,
                    f"a line longer than {limit:,} bytes: not a line of a log (a binary "
                    "file, or one without line breaks?)",
                )
            yield line

    def _without_byte_order_mark(self, line: bytes) -> bytes:
        """The first line without a UTF-8 byte-order mark (editors on Windows write one);
        text in another encoding is refused, since every reader expects UTF-8."""
        if line.startswith(_UTF8_BOM):
            return line[len(_UTF8_BOM) :]
        for mark, encoding in _OTHER_BOMS:
            if line.startswith(mark):
                raise RawInputError(
                    f"{self.path} is {encoding} text (it starts with a {encoding} byte-order "
                    "mark); save it as UTF-8 and run again"
                )
        if b"\x00" in line:
            raise RawInputError(
                f"{self.path} has NUL bytes on its first line: it is binary, or UTF-16/32 text "
                "without a byte-order mark; give a UTF-8 text file"
            )
        return line

    @property
    def source(self) -> RawSource:
        """Size and hash of the file; only valid once every line was read."""
        if not self._done or self._tap is None:
            raise RuntimeError("RawFile.source read before the whole file was read")
        return RawSource(path=self.path, size=self._tap.size, sha256=self._digest.hexdigest())


def _text_lines(lines: Iterator[bytes]) -> Iterator[bytes]:
    """Lines ended by ``\\n``, ``\\r\\n`` or a lone ``\\r`` (classic Mac files), each with
    its ending.  Binary iteration splits at ``\\n`` only, so a file with ``\\r`` endings
    would read as one line: one user holding every item."""
    for line in lines:
        if b"\r" not in line:
            yield line
            continue
        pieces = line.split(b"\r")
        last = pieces.pop()
        if last == b"\n":  # the line's own CRLF ending
            pieces[-1] += b"\r\n"
            last = b""
        else:
            pieces[-1] += b"\r"
        for piece in pieces[:-1]:
            yield piece + b"\r"
        yield pieces[-1]
        if last:
            yield last


def show_token(token: bytes | str, limit: int = 40) -> str:
    """A raw token quoted for an error message, shortened and made printable."""
    if isinstance(token, bytes):
        token = token.decode("utf-8", errors="backslashreplace")
    text = token
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return repr(text)
