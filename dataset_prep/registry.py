"""Known datasets and raw formats.

Adding a raw log format: write a module with a reader
``read(path, collector, *, show_progress) -> RawSource`` that feeds
(user, item, time) rows to a `procedure.Collector`, and add a `RawFormat`
to `FORMATS`. Adding a dataset: add a `KnownDataset` to `KNOWN_DATASETS`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from . import amazon, lastfm, movielens, one_line, tabular, yelp
from .errors import UsageError
from .procedure import Collector
from .stats import ExpectedStats

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Format of names that are not known datasets (kept from the first version).
DEFAULT_FORMAT = "one-line"
ONE_LINE = "one-line"
TABLE = "csv"

# Where the one-line-per-user files of the known datasets are published.
SOURCE_REPOSITORIES = (
    ("S3-Rec", "https://github.com/RUCAIBox/CIKM2020-S3Rec"),
    ("FMLP-Rec", "https://github.com/Woeee/FMLP-Rec"),
    ("BSARec", "https://github.com/yehjin-shin/BSARec"),
)
_ONE_LINE_SOURCE = "data/ folder of S3-Rec, FMLP-Rec or BSARec"


@dataclass(frozen=True)
class RawFormat:
    """A raw input format and its reader.

    `raw_log` formats are read row by row into a `Collector` and then go
    through the S3-Rec procedure (`procedure.prepare`); the one-line format
    is already processed and is only validated. `real_time` says where the
    ``real_time`` column (seconds) of a raw log's output comes from; None for a
    format that holds no times.
    """

    name: str
    description: str
    read: Callable[..., Any]
    raw_log: bool = True
    new_collector: Callable[..., Collector] = Collector
    real_time: str | None = None


@dataclass(frozen=True)
class KnownDataset:
    """A dataset whose statistics are published and checked on conversion.

    `raw_file` in `format` is the public raw source; `one_line_file` is the
    processed file the paper repositories distribute (``--format one-line``).
    """

    name: str
    description: str
    raw_file: str
    format: str
    source: str
    one_line_file: str
    expected: ExpectedStats
    note: str = ""


FORMATS: Mapping[str, RawFormat] = MappingProxyType(
    {
        "amazon-2014": RawFormat(
            name="amazon-2014",
            description="Amazon 2014 reviews, reviews_<Category>_5.json.gz "
            "(reviewerID, asin, unixReviewTime; JSON or Python-literal lines)",
            read=amazon.read,
            real_time="unixReviewTime (unix seconds; whole days in the 2014 release)",
        ),
        "yelp": RawFormat(
            name="yelp",
            description="Yelp Open Dataset yelp_academic_dataset_review.json "
            f"(JSON lines; {yelp.DATE_MIN} <= date <= {yelp.DATE_MAX})",
            read=yelp.read,
            new_collector=yelp.new_collector,
            real_time="date (no time zone), read as UTC",
        ),
        "lastfm-hetrec": RawFormat(
            name="lastfm-hetrec",
            description=f"HetRec 2011 LastFM {lastfm.FILE} (first tag row per user and artist)",
            read=lastfm.read,
            new_collector=lastfm.new_collector,
            real_time="timestamp (unix milliseconds) / 1000",
        ),
        "movielens-dat": RawFormat(
            name="movielens-dat",
            description="MovieLens 1M ratings.dat (UserID::MovieID::Rating::Timestamp)",
            read=movielens.read,
            real_time="Timestamp (unix seconds)",
        ),
        TABLE: RawFormat(
            name=TABLE,
            description="your own CSV/TSV log with a header: user, item and time columns "
            "(--user-col, --item-col, --time-col; --sep, --time-format, --first-per-pair)",
            read=tabular.read,
            new_collector=tabular.new_collector,
            real_time="the time column: numbers as they are, dates as unix seconds (UTC when "
            "they carry no time zone)",
        ),
        ONE_LINE: RawFormat(
            name=ONE_LINE,
            description="processed one line per user: user_id item_id item_id ... "
            "(items in time order; no filtering, ids kept)",
            read=one_line.read_one_line,
            raw_log=False,
        ),
    }
)

_AMAZON_SOURCE = (
    "https://jmcauley.ucsd.edu/data/amazon/ (2014 release, 5-core reviews; "
    "not the ratings-only CSVs, not the 2018/2023 releases)"
)


def _known(*datasets: KnownDataset) -> Mapping[str, KnownDataset]:
    return MappingProxyType({d.name: d for d in datasets})


KNOWN_DATASETS: Mapping[str, KnownDataset] = _known(
    KnownDataset(
        name="amazon-beauty",
        description="Amazon Beauty, 5-core",
        raw_file="reviews_Beauty_5.json.gz",
        format="amazon-2014",
        source=_AMAZON_SOURCE,
        one_line_file="Beauty.txt",
        expected=ExpectedStats(users=22_363, items=12_101, interactions=198_502),
    ),
    KnownDataset(
        name="amazon-sports-outdoors",
        description="Amazon Sports and Outdoors, 5-core",
        raw_file="reviews_Sports_and_Outdoors_5.json.gz",
        format="amazon-2014",
        source=_AMAZON_SOURCE,
        one_line_file="Sports_and_Outdoors.txt",
        expected=ExpectedStats(users=35_598, items=18_357, interactions=296_337),
    ),
    KnownDataset(
        name="amazon-toys-games",
        description="Amazon Toys and Games, 5-core",
        raw_file="reviews_Toys_and_Games_5.json.gz",
        format="amazon-2014",
        source=_AMAZON_SOURCE,
        one_line_file="Toys_and_Games.txt",
        expected=ExpectedStats(users=19_412, items=11_924, interactions=167_597),
    ),
    KnownDataset(
        name="yelp",
        description="Yelp, reviews of 2019",
        raw_file="yelp_academic_dataset_review.json",
        format="yelp",
        source="Yelp Open Dataset (JSON): https://www.yelp.com/dataset",
        one_line_file="Yelp.txt",
        expected=ExpectedStats(users=30_431, items=20_033, interactions=316_354),
        note=(
            "the BSARec authors could not find the Yelp release S3-Rec processed and use "
            "its Yelp.txt; another release gives other counts"
        ),
    ),
    KnownDataset(
        name="lastfm",
        description="LastFM (HetRec 2011)",
        raw_file=lastfm.FILE,
        format="lastfm-hetrec",
        source="HetRec 2011: https://grouplens.org/datasets/hetrec-2011/ "
        "(hetrec2011-lastfm-2k.zip, extract the .dat file)",
        one_line_file="LastFM.txt",
        expected=ExpectedStats(users=1_090, items=3_646, interactions=52_551),
    ),
    KnownDataset(
        name="ml-1m",
        description="MovieLens 1M",
        raw_file="ratings.dat",
        format="movielens-dat",
        source="GroupLens: https://grouplens.org/datasets/movielens/1m/ "
        "(ml-1m.zip, extract ml-1m/ratings.dat)",
        one_line_file="ml-1m.txt",
        expected=ExpectedStats(users=6_040, items=3_416, interactions=999_611),
        note="the BSARec table prints 6,041 users / 3,417 items: RecBole's counts, "
        "which include the padding id",
    ),
)


# File systems take names of 255 bytes; checkpoint and log names add the model, the date
# and a random suffix to the dataset's.
MAX_NAME_BYTES = 128


def validate_name(name: str) -> str:
    """Return `name` if it is a usable dataset name, else raise `UsageError`."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise UsageError(
            f"invalid dataset name {name[:60]!r}: use letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    if len(name) > MAX_NAME_BYTES:
        raise UsageError(
            f"dataset name {name[:40]!r}... has {len(name)} characters: it names files and "
            f"folders, so it may have at most {MAX_NAME_BYTES}"
        )
    return name


def get_format(fmt: str) -> RawFormat:
    """The registered format `fmt`, else a `UsageError` listing the known ones."""
    try:
        return FORMATS[fmt]
    except KeyError:
        known = ", ".join(sorted(FORMATS))
        raise UsageError(f"unknown raw format {fmt!r} (known formats: {known})") from None


def default_format(name: str) -> str:
    """The format used for `name` when none is given: its raw source if known."""
    known = KNOWN_DATASETS.get(name)
    return known.format if known is not None else DEFAULT_FORMAT


def download_command(name: str, data_dir: Path | str, source: str | None = None) -> str:
    """The one command that downloads known dataset `name` and prepares it into
    `data_dir` (``--download``; ``source``: raw or one-line, by default the raw file
    where it can be downloaded)."""
    from .download import RAW, default_source

    validate_name(name)
    source = source or default_source(name)
    command = f"python -m dataset_prep {name} --download --out {shlex.quote(str(data_dir))}"
    return command if source == RAW else command + f" --source {source}"


def prepare_command(
    name: str,
    data_dir: Path | str,
    raw_path: Path | str | None = None,
    *,
    fmt: str | None = None,
    alternative: bool = True,
) -> str:
    """The shell command that prepares dataset `name` into `data_dir`.

    Without `raw_path` the raw file appears as a ``<path to FILE>`` placeholder
    for the user to fill in; everything else is shell-quoted as needed. For a
    known dataset without `raw_path` and `fmt`, the command starts from the
    public raw source and, if `alternative`, a second line gives the command
    for the one-line file of the paper repositories.
    """
    validate_name(name)
    if fmt is not None:
        get_format(fmt)
    known = KNOWN_DATASETS.get(name)
    chosen = fmt or default_format(name)
    command = _command(name, data_dir, raw_path, chosen)
    if known is not None and raw_path is None and fmt is None and alternative:
        command += "\n    or, from the one-line file of S3-Rec/FMLP-Rec/BSARec: " + _command(
            name, data_dir, None, ONE_LINE
        )
    return command


def _command(name: str, data_dir: Path | str, raw_path: Path | str | None, fmt: str) -> str:
    known = KNOWN_DATASETS.get(name)
    if raw_path is not None:
        raw = shlex.quote(str(raw_path))
    elif known is not None and fmt == known.format:
        raw = f"<path to {known.raw_file}>"
    elif known is not None and fmt == ONE_LINE:
        raw = f"<path to {known.one_line_file}>"
    elif fmt == TABLE:
        raw = "<path to CSV/TSV log>"
    else:
        raw = "<path to one-line-per-user file>" if fmt == ONE_LINE else "<path to raw file>"
    command = f"python -m dataset_prep {name} --raw {raw} --out {shlex.quote(str(data_dir))}"
    if fmt != default_format(name):
        command += f" --format {fmt}"
    return command
