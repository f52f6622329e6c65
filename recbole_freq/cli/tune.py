"""``run_recbole_freq.py --hyper_file FILE``: a Ray Tune search (``recbole_freq.jobs.tune``)."""

from __future__ import annotations

import argparse
import shlex
import sys

from recbole_freq.cli.common import (
    EXPECTED_ERRORS,
    CommandLineParser,
    UsageError,
    parse_job_args,
    report_error,
    split_config_files,
)
from recbole_freq.utils.command import SEARCHES, invoked_command
from recbole_freq.utils.files import OutputWriteError, check_output_file, write_atomic
from recbole_freq.utils.signals import RunInterrupted


def build_parser() -> argparse.ArgumentParser:
    parser = CommandLineParser(
        prog=f"{invoked_command()} --hyper_file",
        allow_abbrev=False,
        description="Hyperparameter search with Ray Tune over a RecBole hyper file. Any "
        "other --key=value is a RecBole setting fixed for every trial (e.g. --epochs=50).",
    )
    parser.add_argument("--model", "-m", default="BSARec")
    parser.add_argument("--dataset", "-d", default="ml-100k")
    parser.add_argument("--config_files", nargs="+", default=None)
    parser.add_argument("--paper", action="store_true", help="start from the paper settings")
    parser.add_argument(
        "--hyper_file",
        required=True,
        help="RecBole hyper file (search space); --params_file, as in RecBole's run_hyper.py",
    )
    parser.add_argument(
        "--output_file",
        default=None,
        help="also write the ranked trials and the best configuration's path to this file "
        "(as RecBole's run_hyper.py does)",
    )
    parser.add_argument(
        "--search",
        choices=SEARCHES,
        default=None,
        help="default: grid for a discrete space without --num_samples, else random",
    )
    parser.add_argument("--num_samples", type=int, default=None, help="trials of a sampled search")
    parser.add_argument(
        "--fixed_first",
        action="store_true",
        help="first trial: the tuned keys' fixed values (e.g. --paper's), so the ranking "
        "says whether the space beats them on validation",
    )
    parser.add_argument("--scheduler", choices=("asha", "none"), default="asha")
    parser.add_argument(
        "--grace_period", type=int, default=1, help="validation rounds before ASHA may stop a trial"
    )
    parser.add_argument("--cpus_per_trial", type=float, default=1.0)
    parser.add_argument("--gpus_per_trial", type=float, default=0.0)
    parser.add_argument("--max_concurrent", type=int, default=None)
    parser.add_argument("--storage_path", default="ray_results")
    parser.add_argument("--name", default=None, help="experiment name (default model-dataset-time)")
    parser.add_argument("--resume", action="store_true", help="continue the search --name")
    parser.add_argument(
        "--trial_store",
        default=None,
        help="folder that keeps each trial's reports and resume state as plain files; a "
        "new search with the same settings and folder replays them (another machine, a "
        "later session) and continues unfinished trials",
    )
    parser.add_argument("--ray_address", default=None, help="existing cluster (else RAY_ADDRESS)")
    parser.add_argument("--num_cpus", type=int, default=None, help="CPUs of a local Ray")
    parser.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2, 3))
    # RecBole's run_hyper.py flags: the plugin searches with Ray Tune and tabulates the
    # trials itself (_recbole_run_hyper_flags says so).
    parser.add_argument("--tool", default="Ray", help="Ray (RecBole's run_hyper.py flag)")
    parser.add_argument("--display_file", default=None, help=argparse.SUPPRESS)
    return parser


def _recbole_run_hyper_flags(args) -> None:
    """RecBole's ``--tool`` and ``--display_file``: ``--tool Ray`` is what the plugin does;
    any other tool, one line naming the plugin's way; ``--display_file``, a note of where
    the trials are shown instead of RecBole's plotly figure."""
    if str(args.tool).lower() != "ray":
        raise UsageError(
            f"--tool {args.tool}: the plugin searches with Ray Tune only; for hyperopt's "
            "TPE give --search hyperopt (or optuna)"
        )
    if args.display_file:
        print(
            f"note: --display_file {args.display_file}: no plotly figure is drawn; the ranked "
            "trials are written to trials.md and trials.csv in the search's folder (and to "
            "--output_file)",
            file=sys.stderr,
        )


def _resume_argv(argv: list[str], name: str) -> list[str]:
    """The same command with ``--resume --name <name>`` (the name the search used)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--resume",):
            continue
        if arg == "--name":
            skip = True
            continue
        if arg.startswith("--name="):
            continue
        kept.append(arg)
    return [*kept, "--resume", "--name", name]


def cli(argv: list[str]) -> int:
    """``run_recbole_freq.py --hyper_file ...``: run a search, print the ranked trials."""
    parser = build_parser()
    args, overrides = parse_job_args(parser, argv)
    # Only now: the search loads torch, RecBole and Ray.
    from recbole_freq.jobs.tune import (
        SearchNotStarted,
        SearchOptions,
        TrialsFailedError,
        default_search_name,
        tune_model,
    )

    # Named here, so that an interrupt can name the search to resume.
    name = args.name or default_search_name(args.model, args.dataset)
    try:
        _recbole_run_hyper_flags(args)
        if args.output_file:
            check_output_file(args.output_file, "--output_file")  # not after the search
        summary = tune_model(
            args.model,
            args.dataset,
            args.hyper_file,
            config_files=split_config_files(args.config_files),
            cmd_overrides=overrides,
            paper=args.paper,
            options=SearchOptions(
                search=args.search,
                num_samples=args.num_samples,
                scheduler=args.scheduler,
                grace_period=args.grace_period,
                max_concurrent=args.max_concurrent,
                cpus_per_trial=args.cpus_per_trial,
                gpus_per_trial=args.gpus_per_trial,
                ray_address=args.ray_address,
                num_cpus=args.num_cpus,
                fixed_first=args.fixed_first,
            ),
            storage_path=args.storage_path,
            name=name,
            resume=args.resume,
            verbose=args.verbose,
            trial_store=args.trial_store,
        )
    except (*EXPECTED_ERRORS, TrialsFailedError) as error:
        code = report_error(error)
        return 1 if isinstance(error, TrialsFailedError) else code
    except SearchNotStarted as interrupt:
        again = f". Start it with the same command: {invoked_command()} {shlex.join(argv)}"
        raise RunInterrupted(f"{interrupt}{again if interrupt.restartable else ''}") from interrupt
    except KeyboardInterrupt as interrupt:
        raise RunInterrupted(
            f"{interrupt if isinstance(interrupt, RunInterrupted) else 'the search stopped'}. "
            f"Continue with: {invoked_command()} " + shlex.join(_resume_argv(argv, name))
        ) from interrupt
    report = (
        f"{summary['table']}\n\nbest configuration: {summary['best_yaml']}\n"
        f"all trials:         {summary['trials_csv']}"
    )
    print(report)
    if args.output_file:
        try:
            write_atomic(args.output_file, report + "\n")
        except OutputWriteError as error:
            return report_error(error)
    return 0
