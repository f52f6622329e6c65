"""Reader for HetRec 2011 LastFM, ``user_taggedartists-timestamps.dat``.

From ``hetrec2011-lastfm-2k.zip``: a header line
``userID<TAB>artistID<TAB>tagID<TAB>timestamp`` (timestamp in milliseconds),
then one row per tag a user gave an artist. As in S3-Rec, a user's artist
becomes one interaction, from the first row of that (user, artist) pair in
file order and with that row's timestamp; later tags of the pair are skipped.
"""

from __future__ import annotations

from pathlib import Path

from .errors import RawFormatError
from .parsing import NOT_AN_INTEGER, decode_line, parse_int
from .procedure import Collector
from .raw import RawFile, RawSource, show_token

HEADER = ("userID", "artistID", "tagID", "timestamp")
FILE = "user_taggedartists-timestamps.dat"


def new_collector() -> Collector:
    return Collector(keep_first_per_pair=True, to_seconds=milliseconds_to_seconds)


def milliseconds_to_seconds(timestamp: int) -> float:
    """HetRec's timestamps are unix milliseconds."""
    return timestamp / 1000


def read(path: Path | str, collector: Collector, *, show_progress: bool = True) -> RawSource:
    """Feed the first tag row of every (user, artist) pair in `path` to `collector`."""
    path = Path(path)
    header_seen = False
    with RawFile(path, show_progress=show_progress) as raw:
        for number, line in raw:
            text = decode_line(path, number, line)
            if not text.strip():
                continue
            if not header_seen:
                text = text.lstrip("\ufeff")  # a byte-order mark from a re-saved file
            fields = text.strip().split("\t")
            if not header_seen:
                _check_header(path, number, fields)
                header_seen = True
                continue
            if len(fields) != len(HEADER):
                raise RawFormatError(
                    path,
                    number,
                    f"expected {len(HEADER)} tab-separated fields ({' '.join(HEADER)}), "
                    f"found {len(fields)}",
                )
            values = [parse_int(field) for field in fields]
            for name, field, value in zip(HEADER, fields, values, strict=True):
                if value is None:
                    what = "unparsable timestamp" if name == "timestamp" else name
                    raise RawFormatError(
                        path, number, f"{what} {show_token(field)} {NOT_AN_INTEGER}"
                    )
            user, artist, _tag, timestamp = values
            collector.add(str(user), str(artist), timestamp)
    if not header_seen:
        raise RawFormatError(path, None, f"file is empty (expected {FILE})")
    return raw.source


def _check_header(path: Path, number: int, fields: list[str]) -> None:
    # Without the exact header this is another file: user_taggedartists.dat has
    # day/month/year instead of a timestamp, user_artists.dat has play counts.
    if tuple(field.strip() for field in fields) != HEADER:
        raise RawFormatError(
            path,
            number,
            f"expected the header {' '.join(HEADER)!r} of {FILE} from hetrec2011-lastfm-2k, "
            f"found {show_token(' '.join(fields), 60)}",
        )
