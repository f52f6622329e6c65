"""Known datasets and raw formats.

Adding a raw format: write a module with a reader
``read(path, *, show_progress) -> RawSequences`` and add a `RawFormat` to
`FORMATS`. Adding a dataset: add a `KnownDataset` to `_KNOWN`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from . import one_line
from .errors import UsageError
from .raw import RawSequences
from .stats import ExpectedStats

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
DEFAULT_FORMAT = "one-line"

# Where the one-line-per-user files of the known datasets are published.
SOURCE_REPOSITORIES = (
    ("S3-Rec", "https://github.com/RUCAIBox/CIKM2020-S3Rec"),
    ("FMLP-Rec", "https://github.com/Woeoo/FMLP-Rec"),
    ("BSARec", "https://github.com/yehjin-shin/BSARec"),
)
_ONE_LINE_SOURCE = "S3-Rec / FMLP-Rec / BSARec data folder"


@dataclass(frozen=True)
class RawFormat:
    """A raw input format and its reader."""

    name: str
    description: str
    read: Callable[..., RawSequences]


@dataclass(frozen=True)
class KnownDataset:
    """A dataset whose statistics are published and checked on conversion."""

    name: str
    description: str
    raw_file: str
    source: str
    expected: ExpectedStats
    format: str = DEFAULT_FORMAT


FORMATS: Mapping[str, RawFormat] = MappingProxyType(
    {
        "one-line": RawFormat(
            name="one-line",
            description="one line per user: user_id item_id item_id ... (items in time order)",
            read=one_line.read_one_line,
        ),
    }
)


def _known(*datasets: KnownDataset) -> Mapping[str, KnownDataset]:
    return MappingProxyType({d.name: d for d in datasets})


KNOWN_DATASETS: Mapping[str, KnownDataset] = _known(
    KnownDataset(
        name="amazon-beauty",
        description="Amazon Beauty, 5-core",
        raw_file="Beauty.txt",
        source=_ONE_LINE_SOURCE,
        expected=ExpectedStats(users=22_363, items=12_101, interactions=198_502),
    ),
    KnownDataset(
        name="amazon-sports-outdoors",
        description="Amazon Sports and Outdoors, 5-core",
        raw_file="Sports_and_Outdoors.txt",
        source=_ONE_LINE_SOURCE,
        expected=ExpectedStats(users=35_598, items=18_357, interactions=296_337),
    ),
    KnownDataset(
        name="amazon-toys-games",
        description="Amazon Toys and Games, 5-core",
        raw_file="Toys_and_Games.txt",
        source=_ONE_LINE_SOURCE,
        expected=ExpectedStats(users=19_412, items=11_924, interactions=167_597),
    ),
    KnownDataset(
        name="yelp",
        description="Yelp",
        raw_file="Yelp.txt",
        source=_ONE_LINE_SOURCE,
        expected=ExpectedStats(users=30_431, items=20_033, interactions=316_354),
    ),
    KnownDataset(
        name="lastfm",
        description="LastFM (HetRec 2011)",
        raw_file="LastFM.txt",
        source=_ONE_LINE_SOURCE,
        expected=ExpectedStats(users=1_090, items=3_646, interactions=52_551),
    ),
    KnownDataset(
        name="ml-1m",
        description="MovieLens 1M",
        raw_file="ml-1m.txt",
        source=_ONE_LINE_SOURCE,
        expected=ExpectedStats(users=6_040, items=3_416, interactions=999_611),
    ),
)


def validate_name(name: str) -> str:
    """Return `name` if it is a usable dataset name, else raise `UsageError`."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise UsageError(
            f"invalid dataset name {name!r}: use letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return name


def get_format(fmt: str) -> RawFormat:
    """The registered format `fmt`, else a `UsageError` listing the known ones."""
    try:
        return FORMATS[fmt]
    except KeyError:
        known = ", ".join(sorted(FORMATS))
        raise UsageError(f"unknown raw format {fmt!r} (known formats: {known})") from None


def prepare_command(name: str, data_dir: Path | str, raw_path: Path | str | None = None) -> str:
    """The shell command that prepares dataset `name` into `data_dir`.

    Without `raw_path` the raw file appears as a ``<path to FILE>`` placeholder
    for the user to fill in; everything else is shell-quoted as needed.
    """
    validate_name(name)
    known = KNOWN_DATASETS.get(name)
    if raw_path is not None:
        raw = shlex.quote(str(raw_path))
    elif known is not None:
        raw = f"<path to {known.raw_file}>"
    else:
        raw = "<path to one-line-per-user file>"
    command = f"python -m dataset_prep {name} --raw {raw} --out {shlex.quote(str(data_dir))}"
    if known is not None and known.format != DEFAULT_FORMAT:
        command += f" --format {known.format}"
    return command
