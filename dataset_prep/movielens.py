"""Reader for MovieLens 1M, ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``).

Every rating is an interaction, whatever its value (BSARec applies no
threshold); the timestamp is in unix seconds. There is no header line.
"""

from __future__ import annotations

from pathlib import Path

from .errors import RawFormatError
from .parsing import MAX_DIGITS, NOT_AN_INTEGER, decode_line, parse_int
from .procedure import Collector
from .raw import RawFile, RawSource, show_token

FIELDS = ("UserID", "MovieID", "Rating", "Timestamp")
SEPARATOR = "::"


def read(path: Path | str, collector: Collector, *, show_progress: bool = True) -> RawSource:
    """Feed every rating of `path` to `collector`."""
    path = Path(path)
    with RawFile(path, show_progress=show_progress) as raw:
        for number, line in raw:
            text = decode_line(path, number, line)
            if not text.strip():
                continue
            fields = text.strip().split(SEPARATOR)
            if len(fields) != len(FIELDS):
                hint = (
                    " (this looks like movies.dat or users.dat; give ratings.dat)"
                    if len(fields) in (3, 5)
                    else ""
                )
                raise RawFormatError(
                    path,
                    number,
                    f"expected {len(FIELDS)} fields {SEPARATOR.join(FIELDS)}, "
                    f"found {len(fields)}{hint}",
                )
            user, movie, rating, timestamp = fields
            # Ids are read as integers, as BSARec's pandas reader does, so that
            # '7' and '07' are the same user.
            user_id, movie_id = parse_int(user), parse_int(movie)
            if user_id is None or movie_id is None:
                bad, name = (user, "UserID") if user_id is None else (movie, "MovieID")
                raise RawFormatError(path, number, f"{name} {show_token(bad)} {NOT_AN_INTEGER}")
            if not _is_number(rating):
                raise RawFormatError(path, number, f"Rating {show_token(rating)} is not a number")
            time = parse_int(timestamp)
            if time is None:
                raise RawFormatError(
                    path,
                    number,
                    f"unparsable timestamp {show_token(timestamp)}: expected unix seconds "
                    f"(an integer of at most {MAX_DIGITS} digits)",
                )
            collector.add(str(user_id), str(movie_id), time)
    return raw.source


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
