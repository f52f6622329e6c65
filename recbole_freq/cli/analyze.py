"""``run_recbole_freq.py --analyze CKPT ...``: frequency analysis of trained checkpoints
(``recbole_freq.jobs.analyze.measures``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from recbole_freq.cli.common import (
    EXPECTED_ERRORS,
    CommandLineParser,
    UsageError,
    add_trust_data_option,
    report_error,
)
from recbole_freq.utils.command import DEFAULT_MAX_SEQUENCES, invoked_command
from recbole_freq.utils.files import OutputWriteError, check_writable, write_atomic


def build_parser() -> argparse.ArgumentParser:
    parser = CommandLineParser(
        prog=f"{invoked_command()} --analyze",
        allow_abbrev=False,
        description="Frequency analysis of trained checkpoints (figures + analysis.json).",
    )
    parser.add_argument("--analyze", nargs="+", required=True, metavar="CHECKPOINT")
    parser.add_argument("--out", default=None, help="output folder (default analysis/<names>)")
    parser.add_argument("--max_sequences", type=int, default=DEFAULT_MAX_SEQUENCES)
    parser.add_argument(
        "--data_path", default=None, help="folder holding <dataset>/ (default: the training run's)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--labels",
        default=None,
        help="the checkpoints' names in the figures, comma-separated in their order "
        "(default: each one's model, numbered where models repeat)",
    )
    add_trust_data_option(parser, "checkpoint")
    return parser


def cli(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    # Only now: the analysis loads torch, RecBole and matplotlib.
    from recbole_freq.checkpoint.loader import CheckpointError, UntrustedCheckpointError
    from recbole_freq.jobs.analyze.figures import write_figures
    from recbole_freq.jobs.analyze.measures import analyse_checkpoint, label_results

    out = Path(args.out or Path("analysis") / "_vs_".join(Path(p).stem for p in args.analyze))
    created = not out.exists()
    labels = None
    if args.labels is not None:
        names = [name.strip() for name in args.labels.split(",")]
        if len(names) != len(args.analyze) or not all(names):
            return report_error(
                UsageError(
                    f"--labels names {len(names)} checkpoint(s) for the {len(args.analyze)} "
                    "given; give one non-empty name per checkpoint, comma-separated"
                )
            )
        labels = dict(zip(args.analyze, names))
    try:
        if args.max_sequences < 1:
            raise ValueError(f"--max_sequences={args.max_sequences} must be >= 1")
        check_writable(out, "--out")
        results, skipped = [], []
        for path in args.analyze:
            try:
                results.append(
                    analyse_checkpoint(
                        path, args.data_path, args.max_sequences, args.device, args.trust_data
                    )
                )
            except (*EXPECTED_ERRORS, CheckpointError, UntrustedCheckpointError) as error:
                if len(args.analyze) == 1:
                    raise
                skipped.append((path, error))
        if not results:
            raise ValueError(
                f"none of the {len(skipped)} checkpoints can be analysed; first: "
                f"{skipped[0][0]}: {skipped[0][1]}"
            )
        if skipped:
            # A batch never fails as a whole because of one checkpoint.
            reasons = "; ".join(f"{path}: {error}" for path, error in skipped)
            print(
                f"warning: skipped {len(skipped)} of {len(args.analyze)} checkpoints: "
                + " ".join(reasons.split()),
                file=sys.stderr,
            )
    except (*EXPECTED_ERRORS, CheckpointError, UntrustedCheckpointError) as error:
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()  # the folder this call made, still empty: nothing left behind
        return report_error(error)
    label_results(results, labels)
    figures = []
    try:
        write_figures(results, out, figures)
        report = {
            "definitions": "see recbole_freq/jobs/analyze/measures.py",
            "figures": figures,
            "checkpoints": results,
        }
        write_atomic(out / "analysis.json", json.dumps(report, indent=1))
    except OutputWriteError as error:
        # The failed file was not written; the figures before it were, and are named.
        if not figures:
            return report_error(error)
        failed = str(error).replace("; nothing was written", "")  # of that one file
        done = f"of this analysis, {', '.join(figures)} were written to {out}"
        return report_error(OutputWriteError(error.errno, f"{failed}; {done}"))
    print(f"wrote {', '.join(figures)} and analysis.json to {out}")
    return 0
