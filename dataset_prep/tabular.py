"""Reader for user logs as CSV or TSV: a header line, then one interaction per row.

The user, item and time columns are found by name (``--user-col``,
``--item-col``, ``--time-col``); a RecBole-style header such as
``user_id:token`` also matches ``user_id``. Other columns are ignored. The
rows then go through the same procedure as the papers' datasets (grouping,
stable time sort, k-core, ids from 1), so users can bring their own logs.

Separator: ``,`` unless given, or a tab when the header line contains one.
Comma-separated files follow the usual CSV quoting; tab-separated ones are
read without quoting, as RecBole reads its atomic files.

Times: by default each value must be a number (e.g. unix seconds) or an ISO
8601 date, one kind for the whole column, since a mix has no common order;
``--time-format`` gives a `datetime.strptime` format instead. The real time
column of the output (``real_time``) holds numbers as they are and dates as unix
seconds, dates without a time zone read as UTC (``time_to_seconds``).
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import RawFormatError, UsageError
from .parsing import MAX_DIGITS, decode_line
from .procedure import Collector
from .raw import RawFile, RawSource, show_token

_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
_SEPARATOR_NAMES = {"tab": "\t", "\\t": "\t", "comma": ",", "semicolon": ";", "space": " "}


@dataclass(frozen=True)
class TableOptions:
    """How to read a CSV/TSV log; the defaults match RecBole's field names."""

    user_col: str = "user_id"
    item_col: str = "item_id"
    time_col: str = "timestamp"
    sep: str | None = None
    time_format: str | None = None
    keep_first_per_pair: bool = False

    def __post_init__(self) -> None:
        names = {"--user-col": self.user_col, "--item-col": self.item_col}
        names["--time-col"] = self.time_col
        for flag, name in names.items():
            if not isinstance(name, str) or not name.strip():
                raise UsageError(f"{flag} must name a column")
        if len(set(names.values())) < len(names):
            raise UsageError("--user-col, --item-col and --time-col must name different columns")
        if self.sep is not None:
            sep = _SEPARATOR_NAMES.get(self.sep, self.sep)
            if len(sep) != 1 or sep in '\r\n"':
                raise UsageError(
                    f"invalid --sep {self.sep!r}: give one character (or 'tab', 'comma')"
                )
            object.__setattr__(self, "sep", sep)


def new_collector(options: TableOptions) -> Collector:
    return Collector(keep_first_per_pair=options.keep_first_per_pair, to_seconds=time_to_seconds)


def time_to_seconds(value: int | float | datetime) -> float:
    """A time column's value in seconds: numbers as they are (the column's own unit,
    which should be seconds), dates as unix seconds, read as UTC when they carry no
    time zone."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
    return float(value)


def read(
    path: Path | str,
    collector: Collector,
    *,
    show_progress: bool = True,
    options: TableOptions | None = None,
) -> RawSource:
    """Feed every row of the CSV/TSV log `path` to `collector`."""
    path = Path(path)
    options = options or TableOptions()
    with RawFile(path, show_progress=show_progress) as raw:
        lines = _text_lines(path, raw)
        header_line = next(lines, None)
        if header_line is None:
            raise RawFormatError(path, None, "file is empty (expected a header line)")
        sep = options.sep or ("\t" if "\t" in header_line else ",")
        quoting = csv.QUOTE_NONE if sep == "\t" else csv.QUOTE_MINIMAL
        reader = csv.reader(_chain(header_line, lines), delimiter=sep, quoting=quoting)
        try:
            header = next(reader)
            columns = _columns(path, header, options, sep)
            times = _TimeParser(path, options.time_format)
            for row in reader:
                number = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != len(header):
                    raise RawFormatError(
                        path, number, f"expected {len(header)} fields, found {len(row)}"
                    )
                user, item, time = (row[index].strip() for index in columns)
                for value, flag, name in (
                    (user, "--user-col", options.user_col),
                    (item, "--item-col", options.item_col),
                ):
                    if not value:
                        raise RawFormatError(path, number, f"empty {name!r} ({flag}) value")
                collector.add(user, item, times.parse(number, time))
        except csv.Error as exc:
            raise RawFormatError(path, reader.line_num, f"malformed CSV: {exc}") from None
    return raw.source


def _text_lines(path: Path, raw: RawFile) -> Iterator[str]:
    for number, line in raw:
        text = decode_line(path, number, line)
        yield text.lstrip("\ufeff") if number == 1 else text


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest


def _columns(path: Path, header: list[str], options: TableOptions, sep: str) -> list[int]:
    names = [name.strip() for name in header]
    found = []
    for flag, wanted in (
        ("--user-col", options.user_col),
        ("--item-col", options.item_col),
        ("--time-col", options.time_col),
    ):
        matches = [i for i, name in enumerate(names) if name == wanted]
        if not matches:  # RecBole atomic header: "user_id:token" names "user_id"
            matches = [i for i, name in enumerate(names) if name.split(":", 1)[0] == wanted]
        if len(matches) > 1:
            raise RawFormatError(path, 1, f"column {wanted!r} appears {len(matches)} times")
        if not matches:
            shown = ", ".join(repr(name) for name in names)
            raise RawFormatError(
                path,
                1,
                f"missing column {wanted!r} (header has {shown} with separator {sep!r}); "
                f"name the right column with {flag}, or the separator with --sep",
            )
        found.append(matches[0])
    return found


class _TimeParser:
    """Turns time values into sort keys of one kind for the whole column."""

    def __init__(self, path: Path, time_format: str | None) -> None:
        self.path = path
        self.time_format = time_format
        self.kind: str | None = None
        self.kind_line = 0

    def parse(self, number: int, text: str) -> Any:
        value, kind = self._value(number, text)
        if self.kind is None:
            self.kind, self.kind_line = kind, number
        elif kind != self.kind:
            raise RawFormatError(
                self.path,
                number,
                f"timestamp {show_token(text)} is a {kind} but line {self.kind_line} has a "
                f"{self.kind}; one column must use one kind of time",
            )
        return value

    def _value(self, number: int, text: str) -> tuple[Any, str]:
        if self.time_format is not None:
            try:
                value = datetime.strptime(text, self.time_format)
            except ValueError:
                raise RawFormatError(
                    self.path,
                    number,
                    f"unparsable timestamp {show_token(text)}: does not match "
                    f"--time-format {self.time_format!r}",
                ) from None
            return value, _date_kind(value)
        if _NUMBER.fullmatch(text):
            digits = text.lstrip("+-")
            if digits.isdigit() and len(digits) > MAX_DIGITS:  # int() fails past 4,300 digits
                raise RawFormatError(
                    self.path, number, f"timestamp {show_token(text)} is out of range"
                )
            value = int(text) if digits.isdigit() else float(text)
            if isinstance(value, float) and not math.isfinite(value):
                raise RawFormatError(
                    self.path, number, f"timestamp {show_token(text)} is out of range"
                )
            return value, "number"
        try:
            date = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
        except ValueError:
            raise RawFormatError(
                self.path,
                number,
                f"unparsable timestamp {show_token(text)}: expected a number (e.g. unix "
                "seconds) or an ISO 8601 date; give --time-format for other date forms",
            ) from None
        return date, _date_kind(date)


def _date_kind(value: datetime) -> str:
    return "date without time zone" if value.tzinfo is None else "date with time zone"
