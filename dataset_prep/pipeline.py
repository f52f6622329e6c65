"""Raw file -> RecBole atomic files (``<name>.inter`` and ``<name>.stats.json``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .atomic import staged_output
from .errors import StatsMismatchError
from .raw import RawSource
from .registry import DEFAULT_FORMAT, KNOWN_DATASETS, get_format, validate_name
from .stats import ExpectedStats, Stats, compute_stats

INTER_HEADER = "user_id:token\titem_id:token\ttimestamp:float\n"
STATS_SCHEMA = 1


@dataclass(frozen=True)
class ConversionResult:
    """What `convert` produced."""

    name: str
    stats: Stats
    expected: ExpectedStats | None
    mismatches: list[tuple[str, int, int]]
    source: RawSource
    inter_path: Path
    stats_path: Path


def convert(
    raw_path: Path | str,
    out_dir: Path | str,
    name: str,
    *,
    fmt: str = DEFAULT_FORMAT,
    expected: ExpectedStats | None = None,
    check: bool = True,
    show_progress: bool = True,
) -> ConversionResult:
    """Convert `raw_path` into ``out_dir/name/name.inter`` and ``name.stats.json``.

    `expected` defaults to the registry's statistics when `name` is known.
    If they differ and `check` is true, `StatsMismatchError` is raised and
    nothing is written. Output is all-or-nothing and byte-identical on re-runs.
    """
    validate_name(name)
    reader = get_format(fmt)
    raw = reader.read(raw_path, show_progress=show_progress)
    stats = compute_stats(raw.sequences)

    if expected is None and name in KNOWN_DATASETS:
        expected = KNOWN_DATASETS[name].expected
    mismatches = stats.mismatches(expected) if expected is not None else []
    if mismatches and check:
        raise StatsMismatchError(_mismatch_message(name, raw.source, mismatches), mismatches)

    target = Path(out_dir) / name
    inter_path = target / f"{name}.inter"
    stats_path = target / f"{name}.stats.json"
    with staged_output(target) as stage:
        inter_sha256 = write_inter(stage.open(inter_path.name), raw.sequences)
        summary = {
            "schema": STATS_SCHEMA,
            "dataset": name,
            "format": fmt,
            "source": raw.source.to_dict(),
            "inter_file": inter_path.name,
            "inter_sha256": inter_sha256,
            "stats": stats.to_dict(),
            "expected": expected.to_dict() if expected is not None else None,
            "matches_expected": None if expected is None else not mismatches,
        }
        text = json.dumps(summary, indent=2, sort_keys=True) + "\n"
        stage.open(stats_path.name).write(text.encode("utf-8"))

    return ConversionResult(
        name=name,
        stats=stats,
        expected=expected,
        mismatches=mismatches,
        source=raw.source,
        inter_path=inter_path,
        stats_path=stats_path,
    )


def convert_one_line(
    raw_path: Path | str,
    out_dir: Path | str,
    name: str,
    expected: ExpectedStats | None = None,
    show_progress: bool = True,
    *,
    check: bool = True,
) -> Stats:
    """Convert a one-line-per-user file; see `convert` (which also returns paths)."""
    return convert(
        raw_path,
        out_dir,
        name,
        fmt="one-line",
        expected=expected,
        check=check,
        show_progress=show_progress,
    ).stats


def write_inter(fh: BinaryIO, sequences: Sequence[tuple[str, Sequence[str]]]) -> str:
    """Write the .inter rows to `fh` and return the sha256 of what was written.

    Timestamps are a running counter over all rows, so sorting by time (stable
    or not, per user or global) reproduces exactly the input order.
    """
    digest = hashlib.sha256()

    def emit(text: str) -> None:
        data = text.encode("utf-8")
        digest.update(data)
        fh.write(data)

    emit(INTER_HEADER)
    timestamp = 0
    for user, items in sequences:
        emit(
            "".join(f"{user}\t{item}\t{timestamp + offset}\n" for offset, item in enumerate(items))
        )
        timestamp += len(items)
    return digest.hexdigest()


def _mismatch_message(name: str, source: RawSource, mismatches: list[tuple[str, int, int]]) -> str:
    known = KNOWN_DATASETS.get(name)
    diffs = ", ".join(
        f"{field} {actual:,} (expected {want:,})" for field, actual, want in mismatches
    )
    hint = f" (expected {known.raw_file})" if known is not None else ""
    return (
        f"{source.path.name} does not match the published statistics of {name}: {diffs}. "
        f"The wrong raw file was probably given{hint}; nothing was written."
    )
