"""``run_recbole_freq.py --compare M1,M2``: models x seeds side by side
(``recbole_freq.jobs.compare``)."""

from __future__ import annotations

import argparse
import shlex
import sys

from recbole_freq.cli.common import (
    EXPECTED_ERRORS,
    TIME_LIMIT_EXIT,
    CommandLineParser,
    parse_job_args,
    report_error,
    split_config_files,
)
from recbole_freq.utils.command import DEFAULT_DATASET, DEFAULT_SEEDS, invoked_command
from recbole_freq.utils.signals import RunInterrupted


def build_parser() -> argparse.ArgumentParser:
    parser = CommandLineParser(
        prog=f"{invoked_command()} --compare",
        allow_abbrev=False,
        description="Compare models over several seeds on one or several datasets (a "
        "models x datasets table beside the papers'). Any other --key=value is a RecBole "
        "config override applied to every run.",
    )
    parser.add_argument(
        "--compare",
        required=True,
        help="models, comma-separated; Model@train_loss=model|bce|bpr adds that model once "
        "more with another loss (e.g. SASRec,SASRec@train_loss=model,BSARec --paper: "
        "SASRec with the paper's BCE and with its own CE, BSARec's gain over each); "
        "Model@variant=NAME a named row of a paper's table (properties/variant/<Model>/, e.g. "
        "BSARec@variant=only-self-attention)",
    )
    parser.add_argument(
        "--dataset",
        "-d",
        default=DEFAULT_DATASET,
        help="a dataset, or several comma-separated (a grid: each in <out>/<dataset>/, and "
        "the models x datasets table in <out>/grid.md)",
    )
    parser.add_argument(
        "--seeds",
        default=",".join(map(str, DEFAULT_SEEDS)),
        help="comma-separated seeds (default 2024,2025,2026)",
    )
    parser.add_argument("--config_files", nargs="+", default=None, help="yaml files for every run")
    parser.add_argument(
        "--out", default=None, help="output folder (default comparisons/<dataset>[+<dataset>...])"
    )
    parser.add_argument(
        "--baselines",
        default=None,
        help="models the Improv. row compares against (default: the RecBole built-ins)",
    )
    parser.add_argument(
        "--metrics", default=None, help="test metrics to report (default hit/ndcg @5,10,20)"
    )
    parser.add_argument(
        "--protocols",
        default=None,
        help="train and test every model under each of these protocols, comma-separated "
        "(e.g. recbole,bsarec): a table per protocol and one side by side",
    )
    parser.add_argument(
        "--paper",
        action="store_true",
        help="models with paper settings for the dataset get them (properties/paper/), and "
        "every model runs under the protocol they name unless one is given",
    )
    parser.add_argument(
        "--correction",
        choices=("holm", "bh"),
        default="holm",
        help="multiple-testing correction of the per-user significance tests (Holm, or "
        "Benjamini-Hochberg)",
    )
    parser.add_argument(
        "--mixed_protocols",
        action="store_true",
        help="table runs made under different protocols anyway (each row names its own)",
    )
    parser.add_argument(
        "--mixed_code",
        action="store_true",
        help="table runs made by different code (their recorded commits) anyway; the "
        "tables then name each run's code",
    )
    parser.add_argument(
        "--status",
        action="store_true",
        help="train nothing: write the tables (a dataset's once all its runs are stored; "
        "a grid's of the runs stored so far) and, for the others, unfinished.md (each one's "
        "epochs and validation scores from its resume state); exit code 3 while runs remain",
    )
    add_execution_arguments(parser)
    return parser


def add_execution_arguments(parser: argparse.ArgumentParser) -> None:
    """How the runs go: packed onto this machine, as Ray tasks, under a time limit."""
    parser.add_argument(
        "--parallel",
        default=None,
        help="runs at once on this machine (a number, or auto: as many as its cores hold), "
        "each in its own process; one GPU is shared by them (default: one after another)",
    )
    parser.add_argument(
        "--threads_per_run",
        type=int,
        default=None,
        help="torch threads of each --parallel run (default: the cores shared out)",
    )
    parser.add_argument(
        "--time_limit",
        type=parse_duration,
        default=None,
        help="stop every run at an epoch boundary before this much time has passed (90m, "
        "2h, 1h30m, or seconds), keeping its state; the same command continues (exit code 3)",
    )
    parser.add_argument("--ray", action="store_true", help="run the trials as parallel Ray tasks")
    parser.add_argument("--cpus_per_run", type=float, default=1.0, help="Ray CPUs per run")
    parser.add_argument("--gpus_per_run", type=float, default=0.0, help="Ray GPUs per run")
    parser.add_argument(
        "--ray_address", default=None, help="Ray cluster to join (default RAY_ADDRESS or local)"
    )


def cli(argv: list[str]) -> int:
    parser = build_parser()
    args, overrides = parse_job_args(parser, argv)
    from recbole_freq.jobs.compare import Execution, compare  # only now: torch, RecBole

    try:
        result = compare(
            args.compare,
            args.dataset,
            seeds=args.seeds,
            config_files=split_config_files(args.config_files),
            overrides=overrides,
            out=args.out,
            baselines=args.baselines,
            metrics=args.metrics,
            protocols=args.protocols,
            mixed_protocols=args.mixed_protocols,
            mixed_code=args.mixed_code,
            paper=args.paper,
            correction=args.correction,
            status=args.status,
            execution=Execution(
                parallel=args.parallel,
                threads_per_run=args.threads_per_run,
                time_limit=args.time_limit,
                ray=args.ray,
                ray_address=args.ray_address,
                cpus_per_run=args.cpus_per_run,
                gpus_per_run=args.gpus_per_run,
            ),
        )
    except EXPECTED_ERRORS as error:
        return report_error(error)
    except RunInterrupted as interrupt:
        raise RunInterrupted(
            f"{interrupt}. Continue with the same command (stored runs are skipped): "
            f"{invoked_command()} {shlex.join(argv)}"
        ) from interrupt
    labels = ", ".join(dict.fromkeys(row["protocol"] for row in result["rows"]))
    if labels:
        print(f"Protocol{'s' if ',' in labels else ''}: {labels}\n")
    print(result["markdown"])
    if result.get("read_only"):
        print("(read only: another comparison is writing this folder; no file was written)")
    for name, path in result["files"].items():
        print(f"{name:<9} {path}")
    if result["failed"]:
        # The tables and unfinished.md of what is stored are written; one line says what
        # failed (each run's own line is above) and how to go on.
        command = shlex.join(a for a in argv if a != "--status")
        first = result["failed"][0]
        more = (
            f" (and {len(result['failed']) - 1} more, listed above)"
            if len(result["failed"]) > 1
            else ""
        )
        print(
            f"error: {len(result['failed'])} run(s) failed: {first}{more}; the other runs are "
            f"stored. Continue with: {invoked_command()} {command}",
            file=sys.stderr,
        )
        return 1
    if not result["complete"]:
        command = shlex.join(a for a in argv if a != "--status")
        if not args.status and not result["trained"] and not result["stopped"]:
            # Nothing began: the same command would end the same way.
            print(
                f"the time limit ended before any run could start ({len(result['not_started'])} "
                "not started); give a longer --time_limit (a run's first epoch must fit in it)",
                file=sys.stderr,
            )
            return TIME_LIMIT_EXIT
        print(_runs_left_line(result, args.status, command), file=sys.stderr)
        return TIME_LIMIT_EXIT
    return 0


def _runs_left_line(result: dict, status: bool, command: str) -> str:
    """What a comparison with runs left says: how many, what it wrote, how to go on."""
    stopped = "unfinished" if status else "stopped at the time limit"
    if "grid" in result["files"]:
        tables = (
            "grid.md holds the runs stored so far, and a dataset's comparison table "
            "comes once all its runs are stored"
        )
    else:  # a mean over the seeds stored so far would read as the row's result
        tables = (
            "unfinished.md shows where each run stands; the comparison table comes "
            "once every run is stored"
        )
    return (
        f"{len(result['stopped'])} run(s) {stopped} and "
        f"{len(result['not_started'])} not started; {tables}. Continue with: "
        f"{invoked_command()} {command}"
    )


def parse_duration(text: str) -> float:
    """``90m``, ``2h``, ``1h30m``, ``45s`` or plain seconds, as seconds."""
    import re

    match = re.fullmatch(
        r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?", text.strip()
    )
    if not text.strip() or match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (90m, 2h, 1h30m, 3600)")
    hours, minutes, seconds = (float(part or 0) for part in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive duration")
    return total
