"""Exceptions raised by dataset_prep.

Every expected failure (bad usage, bad input, wrong raw file) is a
`DatasetPrepError`; the CLI prints its message and exits with status 2
instead of showing a traceback.
"""

from __future__ import annotations

from pathlib import Path


class DatasetPrepError(Exception):
    """Base class for expected, user-facing errors."""


class UsageError(DatasetPrepError):
    """Bad arguments: invalid dataset name, unknown format, unusable output path."""


class RawInputError(DatasetPrepError):
    """The raw file is missing, unreadable or malformed."""


class RawFormatError(RawInputError):
    """Malformed raw content, located by file and 1-based line number."""

    def __init__(self, path: Path | str, line: int | None, problem: str) -> None:
        self.path = Path(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}" if line is None else f"{self.path}, line {line}"
        super().__init__(f"{where}: {problem}")


class StatsMismatchError(DatasetPrepError):
    """A known dataset's statistics differ from the expected ones."""

    def __init__(self, message: str, mismatches: list[tuple[str, int, int]]) -> None:
        self.mismatches = mismatches
        super().__init__(message)
