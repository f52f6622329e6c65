"""Command line: ``python -m dataset_prep NAME --raw PATH --out DATA_DIR``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .atomic import lock_folder
from .download import (
    ONE_LINE_SOURCE,
    RAW,
    DownloadError,
    check_url,
    default_source,
    fetch,
    partial_file,
    place,
    shown_url,
    source_of,
)
from .errors import DatasetPrepError, StatsMismatchError, UsageError
from .pipeline import convert
from .registry import FORMATS, KNOWN_DATASETS, ONE_LINE, SOURCE_REPOSITORIES, TABLE
from .stats import COUNT_CONVENTION, format_report
from .tabular import TableOptions

PROG = "python -m dataset_prep"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
_TABLE_FLAGS = ("user_col", "item_col", "time_col", "sep", "time_format", "first_per_pair")


def _add_download_options(parser) -> None:
    fetch = parser.add_argument_group(
        "--download (known datasets; nothing is downloaded without it)"
    )
    fetch.add_argument(
        "--download",
        action="store_true",
        help="fetch the public file (resumable; an existing file is never replaced), "
        "verify it and prepare it",
    )
    fetch.add_argument(
        "--source",
        choices=(RAW, ONE_LINE_SOURCE),
        default=None,
        help="the raw public file (default, where it can be downloaded) or the papers' "
        "one-line-per-user file",
    )
    fetch.add_argument(
        "--downloads",
        metavar="DIR",
        help="where downloaded files are kept (default: DATA_DIR/downloads)",
    )
    fetch.add_argument("--url", metavar="URL", help="a mirror of the file (same bytes)")


def _add_table_options(parser) -> None:
    table = parser.add_argument_group(f"--format {TABLE} (your own CSV/TSV log with a header)")
    table.add_argument("--user-col", metavar="COL", help="user column (default: user_id)")
    table.add_argument("--item-col", metavar="COL", help="item column (default: item_id)")
    table.add_argument("--time-col", metavar="COL", help="time column (default: timestamp)")
    table.add_argument(
        "--sep",
        metavar="SEP",
        help="field separator: one character, or 'tab' (default: ',' "
        "or a tab if the header has one)",
    )
    table.add_argument(
        "--time-format",
        metavar="FMT",
        help="strptime format of the times (default: numbers or ISO 8601 dates)",
    )
    table.add_argument(
        "--first-per-pair",
        action="store_true",
        help="keep only the first row of each (user, item) pair in file order",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} NAME --raw PATH --out DATA_DIR [options]\n"
        f"       {PROG} NAME --download --out DATA_DIR [--source raw|one-line]\n"
        f"       {PROG} --list",
        description=(
            "Prepare a raw dataset as RecBole atomic files DATA_DIR/NAME/NAME.inter, "
            "NAME.stats.json and (raw logs) NAME.idmap.json, following the S3-Rec "
            "procedure. Known dataset names (see --list) read their public raw source "
            "and get their statistics checked."
        ),
    )
    parser.add_argument("name", nargs="?", metavar="NAME", help="dataset name (see --list)")
    parser.add_argument("--raw", metavar="PATH", help="raw input file (gzipped or not)")
    parser.add_argument("--out", metavar="DATA_DIR", help="RecBole data_path to write into")
    _add_download_options(parser)
    parser.add_argument(
        "--format",
        choices=sorted(FORMATS),
        help=f"raw input format (default: the raw source of a known NAME, else {ONE_LINE})",
    )
    parser.add_argument(
        "--core",
        type=int,
        metavar="K",
        help="raw logs: keep the K-core of users and items (default 5; 1 keeps everything)",
    )
    _add_table_options(parser)
    parser.add_argument(
        "--no-check",
        action="store_true",
        help="write the output even if a known dataset's statistics differ",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing dataset of this name whose interactions differ",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--list", action="store_true", help="list the known datasets and exit")
    return parser


def list_text() -> str:
    """The --list output: known datasets, raw files and their sources, expected statistics."""
    header = (
        f"{'name':<24}{'raw file':<39}{'users':>8}{'items':>8}{'interactions':>14}"
        f"{'avg len':>9}{'sparsity':>10}"
    )
    lines = ["Known datasets (S3-Rec procedure; expected statistics as published):", ""]
    lines.append(header)
    for d in KNOWN_DATASETS.values():
        e = d.expected
        avg = e.interactions / e.users
        sparsity = 100 * (1 - e.interactions / (e.users * e.items))
        lines.append(
            f"{d.name:<24}{d.raw_file:<39}{e.users:>8,}{e.items:>8,}{e.interactions:>14,}"
            f"{avg:>9.2f}{sparsity:>9.2f}%"
        )
    lines += ["", f"({COUNT_CONVENTION})", "", "Where to get the raw files:"]
    for d in KNOWN_DATASETS.values():
        lines.append(f"  {d.name} ({d.description}): {d.raw_file}, --format {d.format}")
        lines.append(f"      {d.source}")
        lines.append(
            f"      or the processed {d.one_line_file} of S3-Rec/FMLP-Rec/BSARec "
            f"with --format {ONE_LINE}"
        )
        if d.note:
            lines.append(f"      note: {d.note}")
    lines += ["", "One-line-per-user files are published in:"]
    lines += [f"  {label:<9} {url}" for label, url in SOURCE_REPOSITORIES]
    lines += ["", "Formats:"]
    lines += [f"  {f.name:<14} {f.description}" for f in FORMATS.values()]
    lines += [
        "",
        "Usage:",
        f"  {PROG} amazon-beauty --download --out dataset      (fetch, verify, prepare)",
        f"  {PROG} amazon-beauty --download --source one-line --out dataset",
        f"  {PROG} amazon-beauty --raw reviews_Beauty_5.json.gz --out dataset",
        f"  {PROG} amazon-beauty --raw Beauty.txt --out dataset --format {ONE_LINE}",
        f"  {PROG} mylog --raw log.csv --out dataset --format {TABLE} "
        "--user-col user --item-col item --time-col time",
    ]
    return "\n".join(lines)


def preparation_text(details: dict[str, Any]) -> str:
    """What the S3-Rec procedure did: rows read and skipped, the k-core filter."""
    skipped = ", ".join(
        f"{n:,} {reason}" for reason, n in details.get("rows_skipped", {}).items() if n
    )
    lines = [
        f"read {details['rows_read']:,} rows: {details['interactions_collected']:,} "
        "interactions" + (f" (skipped: {skipped})" if skipped else "")
    ]
    core, removed = details["core"], details["removed_by_core"]
    cores = (
        f"{core['user']}-core"
        if core["user"] == core["item"]
        else f"{core['user']}-core users / {core['item']}-core items"
    )
    lines.append(
        f"{cores} ({core['passes']} pass{'es' if core['passes'] != 1 else ''}) "
        f"removed {removed['users']:,} users, "
        f"{removed['items']:,} items, {removed['interactions']:,} interactions"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    if args.list:
        if args.name or args.raw or args.out:
            parser.error("--list takes no other arguments")
        print(list_text())
        return EXIT_OK
    if args.download and args.raw:
        parser.error("--download fetches the file itself; give --raw or --download, not both")
    if not args.download and (args.source or args.downloads or args.url):
        parser.error("--source, --downloads and --url go with --download")
    missing = [
        flag
        for flag, value in (
            ("NAME", args.name),
            ("--raw", args.raw or args.download),
            ("--out", args.out),
        )
        if not value
    ]
    if missing:
        parser.error(f"missing {', '.join(missing)} (or use --download, or --list)")
    try:
        lock = _lock_downloads(args) if args.download else None
    except DatasetPrepError as exc:
        _error(str(exc))
        return EXIT_USAGE
    try:
        return _prepare(args)
    finally:
        if lock is not None:
            os.close(lock)


def _lock_downloads(args: argparse.Namespace) -> int | None:
    """Two downloads of one file at once appended to one ``.part``: the downloads
    folder is held for the whole download, check and naming."""
    if args.format is not None:
        raise UsageError("--download knows each file's format; give --source, not --format")
    _source(args)  # an unknown name or source, and a bad --url: before any folder is made
    if args.url is not None:
        check_url(args.url)
    folder = _downloads_folder(args)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"cannot create the downloads folder {folder}: {error.strerror}") from None
    return lock_folder(
        folder,
        f"another dataset_prep is downloading into {folder} right now; wait for it to "
        "finish and run again",
    )


def _prepare(args: argparse.Namespace) -> int:
    """Download (with ``--download``), convert and report: ``main`` after its checks."""
    downloaded = None
    try:
        if args.download:
            path, source = _download(args)
            args.raw, args.format = str(path), source.format
            downloaded = _unverified_files(source, _downloads_folder(args), path)
        result = convert(
            args.raw,
            args.out,
            args.name,
            fmt=args.format,
            check=not args.no_check,
            show_progress=not args.quiet,
            core=args.core,
            table=_table_options(args),
            force=args.force,
        )
    except StatsMismatchError as exc:
        _error(f"{exc} Use --no-check to write it anyway.{_delete_hint(downloaded)}")
        return EXIT_USAGE
    except DownloadError as exc:
        _error(str(exc))
        return EXIT_FAILURE
    except DatasetPrepError as exc:
        _error(f"{exc}{_delete_hint(downloaded)}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _error("interrupted; nothing was written" + _partial_note(args))
        return EXIT_INTERRUPTED
    except OSError as exc:
        # Input errors are DatasetPrepError; an OSError here is about writing output.
        _error(f"cannot write output: {exc}")
        return EXIT_FAILURE

    if downloaded and downloaded[0].name.endswith(".part"):
        placed = place(downloaded[0])  # verified by the counts (or --no-check): its name now
        print(f"kept the download as {placed}")
    src = result.source
    print(f"{src.path} ({src.size:,} bytes, sha256 {src.sha256[:16]}..., format {result.format})")
    if result.details:
        print(preparation_text(result.details))
    print(format_report(result.name, result.stats, result.expected))
    if result.mismatches:
        print(
            "warning: statistics differ from the expected ones (--no-check given)",
            file=sys.stderr,
        )
    print(f"wrote {result.inter_path} ({result.stats.interactions:,} rows)")
    print(real_time_text(result.real_time))
    if result.idmap_path is not None:
        print(f"wrote {result.idmap_path}")
    print(f"wrote {result.stats_path}")
    return EXIT_OK


def _delete_hint(downloaded) -> str:
    """For an error about a download that no recorded SHA-256 verified: which files to
    delete to download it again (the ``.part`` file, or an archive and its member)."""
    if not downloaded:
        return ""
    names = " and ".join(str(path) for path in downloaded)
    return f" (the downloaded file{'s are' if len(downloaded) > 1 else ' is'} {names}: delete {'them' if len(downloaded) > 1 else 'it'} to download again)"


def _source(args: argparse.Namespace):
    return source_of(args.name, args.source or default_source(args.name))


def _downloads_folder(args: argparse.Namespace) -> Path:
    return Path(args.downloads or Path(args.out) / "downloads")


def _unverified_files(source, folder: Path, path: Path) -> list[Path]:
    """The downloaded files that only the counts can verify (no recorded SHA-256)."""
    if source.sha256 is not None:
        return []
    return [path] if source.member is None else [folder / source.file, path]


def _partial_note(args: argparse.Namespace) -> str:
    """What an interrupted download kept, as it is on disk (an empty part is no part)."""
    if not args.download:
        return ""
    try:
        part = partial_file(_downloads_folder(args) / _source(args).file)
    except DatasetPrepError:
        return ""
    try:
        size = part.lstat().st_size
    except OSError:
        size = 0
    if size == 0:
        return " (nothing was downloaded yet)"
    return f" ({size:,} bytes of the download are kept in {part}: run the same command again to resume)"


def _download(args: argparse.Namespace):
    """Fetch NAME's chosen source; the path to prepare and the source."""
    source = _source(args)
    folder = _downloads_folder(args)
    path = fetch(source, folder, url=args.url, show_progress=not args.quiet, defer=True)
    print(f"{path} ({path.stat().st_size:,} bytes, from {shown_url(args.url or source.url)})")
    return path, source


def _table_options(args: argparse.Namespace) -> TableOptions | None:
    """TableOptions from the CSV flags; None when no flag was given and the format is not CSV."""
    given = {flag: getattr(args, flag) for flag in _TABLE_FLAGS if getattr(args, flag)}
    if not given and args.format != TABLE:
        return None
    keep_first = given.pop("first_per_pair", False)
    return TableOptions(**given, keep_first_per_pair=keep_first)


def real_time_text(real_time: str | None) -> str:
    """What the ``.inter`` holds as time: said once per conversion."""
    if real_time is None:
        return (
            "times: none in this format (it holds only the order): timestamp counts 0, 1, "
            "2, ... and there is no real_time column, so TiSASRec's intervals are position "
            "distances"
        )
    return (
        f"times: timestamp counts 0, 1, 2, ... in the order above; real_time holds seconds "
        f"from {real_time} (TiSASRec reads its intervals from it)"
    )


def _error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)
