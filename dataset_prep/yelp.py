"""Reader for the Yelp Open Dataset reviews, ``yelp_academic_dataset_review.json``.

JSON lines with ``user_id``, ``business_id`` and ``date``
(``YYYY-MM-DD HH:MM:SS``). As in S3-Rec, only reviews with
2019-01-01 00:00:00 <= date <= 2019-12-31 00:00:00 are kept, both ends
included, so nearly all of 31 December is left out: S3-Rec compares the date
strings with those bounds, and this reproduces it. Repeated reviews of the
same business by the same user are all kept (the processed Yelp has 11,830
such repeats). S3-Rec's ``stars <= 0`` filter removes nothing (stars are
1-5), so stars are not read.

Real times: Yelp's dates carry no time zone; they are read as UTC
(``date_to_seconds``), so intervals are exact and absolute times are off by the
business's UTC offset.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import RawFormatError
from .parsing import decode_line
from .procedure import Collector
from .raw import RawFile, RawSource, show_token

USER, ITEM, DATE = "user_id", "business_id", "date"
DATE_MIN = "2019-01-01 00:00:00"
DATE_MAX = "2019-12-31 00:00:00"
# The exact shape is required: S3-Rec compares date strings, which only orders
# them by time when every date has this fixed-width form.
_DATE_SHAPE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}")
_EXPECTED = "one JSON review per line, as in yelp_academic_dataset_review.json"


def new_collector() -> Collector:
    return Collector(to_seconds=date_to_seconds)


def date_to_seconds(date: str) -> float:
    """Unix seconds of a ``YYYY-MM-DD HH:MM:SS`` date read as UTC."""
    return datetime.fromisoformat(date).replace(tzinfo=timezone.utc).timestamp()


def read(path: Path | str, collector: Collector, *, show_progress: bool = True) -> RawSource:
    """Feed the reviews of `path` inside the 2019 window to `collector`.

    Every line is parsed and checked, also those outside the window, so a
    wrong or damaged file is reported rather than silently thinned out.
    """
    path = Path(path)
    outside = 0
    with RawFile(path, show_progress=show_progress) as raw:
        for number, line in raw:
            if not line.strip():
                continue
            review = _parse(path, number, line)
            user = _identifier(path, number, review, USER)
            item = _identifier(path, number, review, ITEM)
            date = _date(path, number, review)
            if date < DATE_MIN or date > DATE_MAX:
                outside += 1
                continue
            # Fixed-width date strings sort by time; no conversion needed.
            collector.add(user, item, date)
    collector.skipped["outside the 2019 date window"] = outside
    return raw.source


def _parse(path: Path, number: int, line: bytes) -> dict[str, Any]:
    try:
        value = json.loads(decode_line(path, number, line))
    except RecursionError:
        raise RawFormatError(
            path, number, f"not a review ({_EXPECTED}): values nested too deeply"
        ) from None
    except ValueError as exc:
        raise RawFormatError(
            path, number, f"not valid JSON ({_EXPECTED}): {_reason(exc)}"
        ) from None
    if not isinstance(value, dict):
        raise RawFormatError(path, number, f"expected a JSON object ({_EXPECTED})")
    return value


def _reason(exc: ValueError) -> str:
    return exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)


def _identifier(path: Path, number: int, review: dict[str, Any], key: str) -> str:
    if key not in review:
        hint = (
            "this looks like the business file, not the reviews"
            if key == USER and "business_id" in review and "review_id" not in review
            else f"expected {_EXPECTED}"
        )
        raise RawFormatError(path, number, f"missing field {key!r} ({hint})")
    value = review[key]
    if not isinstance(value, str) or not value.strip():
        raise RawFormatError(path, number, f"field {key!r} is not a non-empty string: {value!r}")
    return value


def _date(path: Path, number: int, review: dict[str, Any]) -> str:
    if DATE not in review:
        raise RawFormatError(path, number, f"missing field {DATE!r} (expected {_EXPECTED})")
    value = review[DATE]
    if isinstance(value, str) and _DATE_SHAPE.fullmatch(value):
        try:
            datetime.fromisoformat(value)  # rejects month 13, 25:00 and the like
            return value
        except ValueError:
            pass
    shown = show_token(value) if isinstance(value, str) else repr(value)
    raise RawFormatError(path, number, f"unparsable date {shown}: expected 'YYYY-MM-DD HH:MM:SS'")
