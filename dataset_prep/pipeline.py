"""Raw file -> RecBole atomic files.

Writes ``<name>.inter``, ``<name>.stats.json`` and, for raw logs whose ids are
re-mapped, ``<name>.idmap.json`` (the raw id behind every new id).  Each is renamed
into place from a temporary, ``<name>.stats.json`` last: it is the manifest, recording
the sha256 of the others, so a preparation killed between two renames leaves files
that the plugin refuses to load together (``recbole_freq.data.guard.check_files_agree``)
until the dataset is prepared again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from . import procedure
from .atomic import file_sha256, staged_output
from .errors import RawFormatError, StatsMismatchError, UsageError
from .one_line import looks_like_one_line
from .raw import RawSequences, RawSource
from .registry import (
    KNOWN_DATASETS,
    ONE_LINE,
    TABLE,
    default_format,
    get_format,
    validate_name,
)
from .stats import ExpectedStats, Stats, compute_stats
from .tabular import TableOptions

INTER_HEADER = "user_id:token\titem_id:token\ttimestamp:float\n"
# Raw logs add the source's real time, in seconds (``RawFormat.real_time`` says whence).
REAL_TIME_COLUMN = "real_time"
INTER_HEADER_WITH_REAL_TIME = INTER_HEADER[:-1] + f"\t{REAL_TIME_COLUMN}:float\n"
STATS_SCHEMA = 2
IDMAP_SCHEMA = 1


@dataclass(frozen=True)
class ConversionResult:
    """What `convert` produced."""

    name: str
    format: str
    stats: Stats
    expected: ExpectedStats | None
    mismatches: list[tuple[str, int, int]]
    source: RawSource
    inter_path: Path
    stats_path: Path
    idmap_path: Path | None = None
    details: dict[str, Any] | None = None
    real_time: str | None = None  # where the real_time column came from; None: no column


def _check_options(reader, chosen: str, core, table) -> None:
    """Options that do not fit the format, refused before reading: a multi-GB log
    should not be read to fail on a flag."""
    if core is not None and (isinstance(core, bool) or not isinstance(core, int) or core < 1):
        raise UsageError(f"invalid core {core!r}: use an integer >= 1 (1 disables filtering)")
    if not reader.raw_log and core is not None:
        raise UsageError(f"--core applies to raw logs only: a {chosen} file is already filtered")
    if table is not None and chosen != TABLE:
        raise UsageError(
            f"--user-col, --item-col, --time-col, --sep, --time-format and --first-per-pair "
            f"apply to --format {TABLE} only (format here: {chosen})"
        )


def _read_with_hint(reader, chosen, raw_path, show_progress, core, table, name, fmt):
    """The raw file read; a known dataset's raw-format error on its first line says so
    when the file looks like the papers' one-line-per-user format."""
    try:
        return _read(reader, chosen, raw_path, show_progress, core, table)
    except RawFormatError as exc:
        known = KNOWN_DATASETS.get(name)
        if fmt is None and known is not None and exc.line in (1, None):
            if looks_like_one_line(raw_path):
                raise RawFormatError(
                    exc.path,
                    exc.line,
                    f"{exc.problem}. This looks like a one-line-per-user file "
                    f"({known.one_line_file}): add --format one-line",
                ) from None
        raise


def _stats_summary(name, chosen, raw, reader, stats, expected, mismatches, files) -> dict:
    """The ``<name>.stats.json`` record: source, files and their digest, the preparation,
    the statistics and whether they match the expected ones."""
    inter_path, inter_sha256, idmap_path, idmap_sha256 = files
    return {
        "schema": STATS_SCHEMA,
        "dataset": name,
        "format": chosen,
        "source": raw.source.to_dict(),
        "inter_file": inter_path.name,
        "inter_sha256": inter_sha256,
        "idmap_file": idmap_path.name if idmap_path is not None else None,
        "idmap_sha256": idmap_sha256,
        "preparation": raw.details or None,
        "real_time": (
            {"column": REAL_TIME_COLUMN, "unit": "seconds", "from": reader.real_time}
            if raw.times is not None
            else None
        ),
        "stats": stats.to_dict(),
        "expected": expected.to_dict() if expected is not None else None,
        "matches_expected": None if expected is None else not mismatches,
    }


def convert(
    raw_path: Path | str,
    out_dir: Path | str,
    name: str,
    *,
    fmt: str | None = None,
    expected: ExpectedStats | None = None,
    check: bool = True,
    show_progress: bool = True,
    core: int | None = None,
    table: TableOptions | None = None,
    force: bool = False,
) -> ConversionResult:
    """Convert `raw_path` into ``out_dir/name/name.inter`` and companions.

    `fmt` defaults to the raw-source format of a known dataset and to
    ``one-line`` for other names. Raw logs go through the S3-Rec procedure
    with a `core`-core filter (default 5); `table` describes a CSV/TSV log.
    `expected` defaults to the registry's statistics when `name` is known.
    If they differ and `check` is true, `StatsMismatchError` is raised and
    nothing is written. Output is all-or-nothing and byte-identical on re-runs.
    An existing dataset of that name whose interactions differ is replaced only with
    `force`: checkpoints trained on it would otherwise silently rank other items.
    """
    validate_name(name)
    chosen = fmt if fmt is not None else default_format(name)
    reader = get_format(chosen)
    _check_options(reader, chosen, core, table)
    raw = _read_with_hint(reader, chosen, raw_path, show_progress, core, table, name, fmt)
    stats = compute_stats(raw.sequences)

    if expected is None and name in KNOWN_DATASETS:
        expected = KNOWN_DATASETS[name].expected
    mismatches = stats.mismatches(expected) if expected is not None else []
    if mismatches and check:
        raise StatsMismatchError(
            _mismatch_message(name, chosen, raw.source, mismatches), mismatches
        )

    target = Path(out_dir) / name
    inter_path = target / f"{name}.inter"
    stats_path = target / f"{name}.stats.json"
    idmap_path = target / f"{name}.idmap.json" if raw.id_map is not None else None
    with staged_output(target) as stage:
        inter_sha256 = write_inter(stage.open(inter_path.name), raw.sequences, raw.times)
        if not force:
            _refuse_replacing_other_data(inter_path, inter_sha256, name, raw)
        idmap_sha256 = None
        if raw.id_map is not None and idmap_path is not None:
            idmap = {"schema": IDMAP_SCHEMA, "dataset": name, **raw.id_map.to_dict()}
            idmap_bytes = _json_bytes(idmap, indent=None)
            stage.open(idmap_path.name).write(idmap_bytes)
            idmap_sha256 = hashlib.sha256(idmap_bytes).hexdigest()
        else:
            stage.remove(f"{name}.idmap.json")  # ids are not re-mapped: no map applies
        summary = _stats_summary(
            name, chosen, raw, reader, stats, expected, mismatches,
            (inter_path, inter_sha256, idmap_path, idmap_sha256),
        )  # fmt: skip
        stage.open(stats_path.name).write(_json_bytes(summary, indent=2))

    return ConversionResult(
        name=name,
        format=chosen,
        stats=stats,
        expected=expected,
        mismatches=mismatches,
        source=raw.source,
        inter_path=inter_path,
        stats_path=stats_path,
        idmap_path=idmap_path,
        details=raw.details or None,
        real_time=reader.real_time if raw.times is not None else None,
    )


def _read(
    reader: Any,
    fmt: str,
    raw_path: Path | str,
    show_progress: bool,
    core: int | None,
    table: TableOptions | None,
) -> RawSequences:
    if not reader.raw_log:
        return reader.read(raw_path, show_progress=show_progress)
    if fmt == TABLE:
        options = table or TableOptions()
        collector = reader.new_collector(options)
        source = reader.read(raw_path, collector, show_progress=show_progress, options=options)
    else:
        collector = reader.new_collector()
        source = reader.read(raw_path, collector, show_progress=show_progress)
    k = procedure.DEFAULT_CORE if core is None else core
    return procedure.prepare(collector, source, user_core=k, item_core=k)


def _json_bytes(value: Any, *, indent: int | None) -> bytes:
    # json's default ASCII escaping keeps raw ids of any script readable by any tool.
    return (json.dumps(value, indent=indent, sort_keys=True) + "\n").encode("utf-8")


def convert_one_line(
    raw_path: Path | str,
    out_dir: Path | str,
    name: str,
    expected: ExpectedStats | None = None,
    show_progress: bool = True,
    *,
    check: bool = True,
    force: bool = False,
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
        force=force,
    ).stats


def _refuse_replacing_other_data(
    inter_path: Path, new_sha256: str, name: str, raw: RawSequences
) -> None:
    if not inter_path.is_file():
        return
    old_sha256 = file_sha256(inter_path)
    if old_sha256 != new_sha256 and _interactions_sha256(inter_path) != _sha256_of(
        lambda emit: _emit_rows(emit, raw.sequences, None)
    ):
        raise UsageError(
            f"{inter_path} already holds a different {name!r} (sha256 {old_sha256[:16]}, "
            f"new {new_sha256[:16]}): models trained on it would rank other items. Prepare "
            "the new data under another name, or add --force to replace it"
        )


def write_inter(
    fh: BinaryIO,
    sequences: Sequence[tuple[str, Sequence[str]]],
    times: Sequence[Sequence[float]] | None = None,
) -> str:
    """Write the .inter rows to `fh` and return the sha256 of what was written.

    Timestamps are a running counter over all rows, so sorting by time (stable
    or not, per user or global) reproduces exactly the input order: the order of
    a sequence is decided here (stable sort, ties in file order), and equal raw
    times would leave it to whoever sorts next. RecBole 1.2.1 happens to sort
    stably (``np.argsort(kind="stable")``), but a counter does not depend on
    that, or on the file order surviving every step before the sort.

    `times` (raw logs) adds each interaction's real time in seconds as the
    column ``real_time``, which time-aware models read for their intervals
    (TiSASRec); ``<name>.idmap.json`` maps the ids back to the raw file.
    """
    digest = hashlib.sha256()

    def emit(text: str) -> None:
        data = text.encode("utf-8")
        digest.update(data)
        fh.write(data)

    _emit_rows(emit, sequences, times)
    return digest.hexdigest()


def _emit_rows(emit, sequences, times) -> None:
    emit(INTER_HEADER if times is None else INTER_HEADER_WITH_REAL_TIME)
    timestamp = 0
    for index, (user, items) in enumerate(sequences):
        if times is None:
            rows = (f"{user}\t{item}\t{timestamp + k}\n" for k, item in enumerate(items))
        else:
            rows = (
                f"{user}\t{item}\t{timestamp + k}\t{_seconds_text(seconds)}\n"
                for k, (item, seconds) in enumerate(zip(items, times[index], strict=True))
            )
        emit("".join(rows))
        timestamp += len(items)


def _seconds_text(seconds: float) -> str:
    # Whole seconds as integers; otherwise the shortest text that reads back exactly.
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


def _sha256_of(write) -> str:
    digest = hashlib.sha256()
    write(lambda text: digest.update(text.encode("utf-8")))
    return digest.hexdigest()


def _interactions_sha256(inter_path: Path) -> str:
    """sha256 of a prepared ``.inter`` without its ``real_time`` column: the same
    interactions in the same order, whether or not it was written with real times."""
    digest = hashlib.sha256()
    with open(inter_path, "rb") as handle:
        header = handle.readline()
        columns = header.rstrip(b"\r\n").split(b"\t")
        if columns[:3] != INTER_HEADER.encode().rstrip(b"\n").split(b"\t"):
            return ""
        digest.update(INTER_HEADER.encode())
        for line in handle:
            digest.update(b"\t".join(line.rstrip(b"\r\n").split(b"\t")[:3]) + b"\n")
    return digest.hexdigest()


def _mismatch_message(
    name: str, fmt: str, source: RawSource, mismatches: list[tuple[str, int, int]]
) -> str:
    known = KNOWN_DATASETS.get(name)
    diffs = ", ".join(
        f"{field} {actual:,} (expected {want:,})" for field, actual, want in mismatches
    )
    hint = note = ""
    if known is not None:
        wanted = known.one_line_file if fmt == ONE_LINE else known.raw_file
        hint = f" (expected {wanted})"
        note = f" Note: {known.note}." if known.note else ""
    return (
        f"{source.path.name} does not match the published statistics of {name}: {diffs}. "
        f"The wrong raw file was probably given{hint}; nothing was written.{note}"
    )
