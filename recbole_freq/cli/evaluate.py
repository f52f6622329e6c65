"""``run_recbole_freq.py --evaluate CKPT --under V ...``: test one trained checkpoint under
several evaluation protocols (``recbole_freq.jobs.evaluate``)."""

from __future__ import annotations

import argparse
import json

from recbole_freq.cli.common import (
    EXPECTED_ERRORS,
    CommandLineParser,
    add_trust_data_option,
    report_error,
)
from recbole_freq.utils.command import invoked_command
from recbole_freq.utils.files import check_output_file, write_atomic


def build_parser() -> argparse.ArgumentParser:
    parser = CommandLineParser(
        prog=f"{invoked_command()} --evaluate",
        allow_abbrev=False,
        description="Test a trained checkpoint under evaluation variants: a protocol name "
        "(its evaluation pieces) or key=value changes joined by '+' (history_mask, "
        "eval_negatives, mode). Training pieces stay the checkpoint's.",
    )
    parser.add_argument("--evaluate", required=True, metavar="CHECKPOINT")
    parser.add_argument(
        "--under",
        nargs="+",
        default=["recbole", "bsarec"],
        metavar="VARIANT",
        help="e.g. recbole history_mask=zero history_mask=exclude bsarec "
        "mode=uni100+eval_negatives=unseen (default: recbole bsarec)",
    )
    parser.add_argument(
        "--data_path", default=None, help="folder holding <dataset>/ (default: the training run's)"
    )
    parser.add_argument("--device", default="cpu")
    add_trust_data_option(parser, "checkpoint")
    parser.add_argument("--output", default=None, help="also write the results as JSON here")
    return parser


def cli(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from recbole_freq.jobs.evaluate import evaluate_checkpoint, markdown  # loads torch, RecBole

    try:
        if args.output:
            check_output_file(args.output, "--output")
        results = evaluate_checkpoint(
            args.evaluate, args.under, args.data_path, args.device, args.trust_data
        )
        if args.output:
            write_atomic(args.output, json.dumps(results, indent=2))
    except EXPECTED_ERRORS as error:
        return report_error(error)
    print(markdown(results, args.evaluate))
    return 0
