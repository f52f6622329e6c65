"""Reader for the Amazon 2014 review files (McAuley et al.), e.g. ``reviews_Beauty_5.json.gz``.

One review per line. The 2014 release writes many of these files as Python
dict literals (``{'reviewerID': 'A1...', ...}``) rather than strict JSON,
which is why S3-Rec reads them with ``eval``. Each line is parsed as JSON
first (fast, and what strict files need) and otherwise with
`ast.literal_eval`, which accepts literals only and so never runs code from
the file. Every review is an implicit interaction (S3-Rec's rating filter,
``overall <= 0``, removes nothing from ratings 1-5): ``reviewerID``, ``asin``,
``unixReviewTime``.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from .errors import RawFormatError
from .parsing import MAX_DIGITS, decode_line, parse_int
from .procedure import Collector
from .raw import RawFile, RawSource, show_token

USER, ITEM, TIME = "reviewerID", "asin", "unixReviewTime"
_EXPECTED = "one review per line, as in the 2014 files reviews_<Category>_5.json.gz"


def read(path: Path | str, collector: Collector, *, show_progress: bool = True) -> RawSource:
    """Feed every review of `path` (gzipped or not) to `collector`."""
    path = Path(path)
    with RawFile(path, show_progress=show_progress) as raw:
        for number, line in raw:
            if not line.strip():
                continue
            review = _parse(path, number, line)
            user = _identifier(path, number, review, USER)
            item = _identifier(path, number, review, ITEM)
            collector.add(user, item, _time(path, number, review))
    return raw.source


def _parse(path: Path, number: int, line: bytes) -> dict[str, Any]:
    text = decode_line(path, number, line)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        try:
            value = ast.literal_eval(text.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise RawFormatError(
                path,
                number,
                f"not a JSON object or Python dict literal ({_EXPECTED}): "
                f"{show_token(text.strip())}",
            ) from None
    if not isinstance(value, dict):
        raise RawFormatError(path, number, f"expected an object with review fields ({_EXPECTED})")
    return value


def _identifier(path: Path, number: int, review: dict[str, Any], key: str) -> str:
    if key not in review:
        raise RawFormatError(path, number, f"missing field {key!r} ({_missing_hint(review)})")
    value = review[key]
    if not isinstance(value, str) or not value.strip():
        raise RawFormatError(path, number, f"field {key!r} is not a non-empty string: {value!r}")
    return value


def _time(path: Path, number: int, review: dict[str, Any]) -> int:
    if TIME not in review:
        raise RawFormatError(path, number, f"missing field {TIME!r} ({_missing_hint(review)})")
    value = review[TIME]
    # S3-Rec applies int(); accept what int() reads exactly: integers and digit strings.
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**MAX_DIGITS:
        return value
    if isinstance(value, str) and (parsed := parse_int(value)) is not None:
        return parsed
    raise RawFormatError(
        path,
        number,
        f"unparsable timestamp {TIME}={show_token(str(value))}: expected unix seconds "
        f"(an integer of at most {MAX_DIGITS} digits)",
    )


def _missing_hint(review: dict[str, Any]) -> str:
    if "parent_asin" in review or "user_id" in review:
        return (
            "this looks like the 2023 Amazon release; the papers use the 2014 "
            "reviews_<Category>_5.json.gz files"
        )
    if "title" in review or "related" in review or "salesRank" in review:
        return "this looks like a product metadata file (meta_*.json.gz), not reviews"
    return f"expected {_EXPECTED}"
