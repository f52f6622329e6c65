"""Small field parsers shared by the raw-log readers."""

from __future__ import annotations

import re
from pathlib import Path

from .errors import RawFormatError

# ASCII only: str.isdigit() also accepts characters such as '³' that int() rejects.
# At most 30 digits: no id or time of a real log is longer, and thousands of digits
# made int() and float() fail with ValueError or OverflowError tracebacks.
MAX_DIGITS = 30
_INTEGER = re.compile(rf"-?[0-9]{{1,{MAX_DIGITS}}}")
NOT_AN_INTEGER = f"is not an integer (of at most {MAX_DIGITS} ASCII digits)"


def parse_int(text: str) -> int | None:
    """`text` as an integer if it is one written in at most ``MAX_DIGITS`` ASCII
    digits, else None (the caller says ``NOT_AN_INTEGER``)."""
    text = text.strip()
    return int(text) if _INTEGER.fullmatch(text) else None


def decode_line(path: Path, number: int, line: bytes) -> str:
    """The line as text without its line ending; a `RawFormatError` if not UTF-8."""
    try:
        return line.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise RawFormatError(
            path,
            number,
            f"not valid UTF-8 text (byte {exc.start + 1} of the line); dataset_prep reads "
            "UTF-8: convert the file first, e.g. iconv -f latin1 -t utf-8",
        ) from None
