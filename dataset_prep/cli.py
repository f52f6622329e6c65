"""Command line: ``python -m dataset_prep NAME --raw PATH --out DATA_DIR``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .errors import DatasetPrepError, StatsMismatchError
from .pipeline import convert
from .registry import DEFAULT_FORMAT, FORMATS, KNOWN_DATASETS, SOURCE_REPOSITORIES
from .stats import COUNT_CONVENTION, format_report

PROG = "python -m dataset_prep"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} NAME --raw PATH --out DATA_DIR [options]\n       {PROG} --list",
        description=(
            "Convert a raw dataset into RecBole atomic files "
            "DATA_DIR/NAME/NAME.inter and DATA_DIR/NAME/NAME.stats.json. "
            "Known dataset names get their statistics checked."
        ),
    )
    parser.add_argument("name", nargs="?", metavar="NAME", help="dataset name (see --list)")
    parser.add_argument("--raw", metavar="PATH", help="raw input file")
    parser.add_argument("--out", metavar="DATA_DIR", help="RecBole data_path to write into")
    parser.add_argument(
        "--format",
        default=DEFAULT_FORMAT,
        choices=sorted(FORMATS),
        help=f"raw input format (default: {DEFAULT_FORMAT})",
    )
    parser.add_argument(
        "--no-check",
        action="store_true",
        help="write the output even if a known dataset's statistics differ",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--list", action="store_true", help="list the known datasets and exit")
    return parser


def list_text() -> str:
    """The --list output: known datasets, raw files, expected statistics."""
    header = f"{'name':<24}{'raw file':<25}{'users':>8}{'items':>8}{'interactions':>14}  source"
    lines = ["Known datasets:", "", header]
    for d in KNOWN_DATASETS.values():
        e = d.expected
        lines.append(
            f"{d.name:<24}{d.raw_file:<25}{e.users:>8,}{e.items:>8,}{e.interactions:>14,}"
            f"  {d.source}"
        )
    lines += ["", COUNT_CONVENTION, "", "Raw one-line-per-user files are published in:"]
    lines += [f"  {label:<9} {url}" for label, url in SOURCE_REPOSITORIES]
    lines += ["", "Formats:"]
    lines += [f"  {f.name:<9} {f.description}" for f in FORMATS.values()]
    lines += ["", f"Usage: {PROG} NAME --raw PATH --out DATA_DIR"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    if args.list:
        if args.name or args.raw or args.out:
            parser.error("--list takes no other arguments")
        print(list_text())
        return EXIT_OK
    missing = [
        flag
        for flag, value in (
            ("NAME", args.name),
            ("--raw", args.raw),
            ("--out", args.out),
        )
        if not value
    ]
    if missing:
        parser.error(f"missing {', '.join(missing)} (or use --list)")

    try:
        result = convert(
            args.raw,
            args.out,
            args.name,
            fmt=args.format,
            check=not args.no_check,
            show_progress=not args.quiet,
        )
    except StatsMismatchError as exc:
        _error(f"{exc} Use --no-check to write it anyway.")
        return EXIT_USAGE
    except DatasetPrepError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _error("interrupted; nothing was written")
        return EXIT_INTERRUPTED
    except OSError as exc:
        # Input errors are DatasetPrepError; an OSError here is about writing output.
        _error(f"cannot write output: {exc}")
        return EXIT_FAILURE

    src = result.source
    print(f"{src.path} ({src.size:,} bytes, sha256 {src.sha256[:16]}...)")
    print(format_report(result.name, result.stats, result.expected))
    if result.mismatches:
        print(
            "warning: statistics differ from the expected ones (--no-check given)",
            file=sys.stderr,
        )
    print(f"wrote {result.inter_path} ({result.stats.interactions:,} rows)")
    print(f"wrote {result.stats_path}")
    return EXIT_OK


def _error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)
