"""``run_recbole_freq.py --recommend CKPT``: top-k recommendations of a trained checkpoint
(``recbole_freq.jobs.recommend``)."""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from recbole_freq.cli.common import (
    EXPECTED_ERRORS,
    CommandLineParser,
    add_trust_data_option,
    report_error,
)
from recbole_freq.utils.command import RECOMMEND_CONTEXTS as CONTEXTS
from recbole_freq.utils.command import RECOMMEND_FORMATS as FORMATS
from recbole_freq.utils.command import invoked_command
from recbole_freq.utils.files import OutputWriteError, check_output_file, write_atomic


def build_parser() -> argparse.ArgumentParser:
    parser = CommandLineParser(
        prog=f"{invoked_command()} --recommend",
        allow_abbrev=False,
        description="Top-k recommendations of a trained checkpoint, in external tokens.",
    )
    parser.add_argument("--recommend", required=True, metavar="CHECKPOINT")
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--users", help="comma-separated user tokens, or a file with one per line")
    who.add_argument("--all_users", action="store_true", help="every user of the dataset")
    parser.add_argument("--topk", type=int, default=10)
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="default: csv, or json when --output ends in .json",
    )
    parser.add_argument("--output", default=None, help="file to write (atomically); default stdout")
    parser.add_argument("--context", choices=CONTEXTS, default="next")
    parser.add_argument(
        "--keep_history", action="store_true", help="do not exclude the user's history items"
    )
    parser.add_argument(
        "--data_path", default=None, help="folder holding <dataset>/ (default: the training run's)"
    )
    parser.add_argument(
        "--ids",
        choices=("auto", "raw", "tokens"),
        default="auto",
        help="raw: users in and ids out are the raw ids of a log that dataset_prep "
        "re-mapped (through <dataset>.idmap.json); tokens: the .inter file's tokens; auto "
        "(default): raw when the dataset has an id map",
    )
    parser.add_argument("--batch_size", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    add_trust_data_option(parser, "checkpoint")
    return parser


def _users_to_read(model, config, splits, tokens, uids, args):
    """``(tokens, uids, histories)``: a user whom no split row holds (a single
    interaction) is read from that interaction under ``next``; with ``--all_users`` the
    users with nothing to read (no interaction, or under ``test`` no test row) are left
    out and named in one line."""
    from recbole_freq.jobs.recommend import reads_times, single_item_histories, users_without_rows

    missing = users_without_rows(splits, uids, args.context)
    histories = {}
    if args.context == "next" and len(missing):
        fields = [model.ITEM_ID]
        if reads_times(model):
            fields.append(model.INTERVAL_TIME_FIELD)
        histories = single_item_histories(config, missing, fields)
    unread = missing[~np.isin(missing, list(histories))]
    if args.all_users and len(unread):
        keep = ~np.isin(uids, unread)
        skipped = [token for token, kept in zip(tokens, keep) if not kept]
        shown = ", ".join(skipped[:20]) + (
            f" and {len(skipped) - 20} more" if len(skipped) > 20 else ""
        )
        reason = (
            "no interaction" if args.context == "next" else "no test row (too few interactions)"
        )
        print(f"skipped {len(skipped)} user(s) with {reason}: {shown}", file=sys.stderr)
        tokens = [token for token, kept in zip(tokens, keep) if kept]
        uids = uids[keep]
    return tokens, uids, histories


def cli(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    # Only now: the checkpoint and its dataset load torch and RecBole.
    from recbole_freq.checkpoint.loader import CheckpointError, UntrustedCheckpointError
    from recbole_freq.jobs.recommend import (
        format_recommendations,
        known_users,
        load_raw_ids,
        parse_user_tokens,
        recommend,
        user_ids,
    )
    from recbole_freq.quick_start.restore import describe_checkpoint, restore_model

    fmt = args.format or ("json" if (args.output or "").endswith(".json") else "csv")
    try:
        if args.topk < 1 or args.batch_size < 1:
            raise ValueError("--topk and --batch_size must be >= 1")
        if args.output:
            check_output_file(args.output, "--output")
        model, config, dataset, loaders, checkpoint = restore_model(
            args.recommend, args.data_path, args.device, trust_data=args.trust_data
        )
        print(describe_checkpoint(args.recommend, config, checkpoint), file=sys.stderr)
        splits = [loader._dataset for loader in loaders]
        raw_ids = load_raw_ids(config, dataset, args.ids)
        if args.all_users:
            tokens = [str(t) for t in dataset.field2id_token[dataset.uid_field][1:]]
        else:
            from_file = args.users if os.path.isfile(args.users) else None
            tokens = known_users(dataset, parse_user_tokens(args.users), raw_ids, from_file)
        uids = user_ids(dataset, tokens)
        tokens, uids, histories = _users_to_read(model, config, splits, tokens, uids, args)
        items, scores = recommend(
            model,
            splits,
            uids,
            args.topk,
            args.context,
            not args.keep_history,
            args.batch_size,
            progress=True,
            histories=histories,
        )
        text = format_recommendations(dataset, tokens, items, scores, fmt, raw_ids)
    except (*EXPECTED_ERRORS, CheckpointError, UntrustedCheckpointError) as error:
        return report_error(error)
    if args.output:
        try:
            write_atomic(args.output, text)
        except OutputWriteError as error:
            return report_error(error)
        print(f"wrote {len(tokens)} users' top-{args.topk} to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
