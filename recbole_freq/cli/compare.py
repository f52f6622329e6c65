"""``run_recbole_freq.py --compare M1,M2``: models x seeds side by side
(``recbole_freq.jobs.compare``)."""

from __future__ import annotations

import argparse
import shlex

from recbole_freq.cli.common import (
    EXPECTED_ERRORS,
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
        description="Compare models over several seeds on one dataset and protocol. Any "
        "other --key=value is a RecBole config override applied to every run.",
    )
    parser.add_argument(
        "--compare",
        required=True,
        help="models, comma-separated; Model@train_loss=model|bce|bpr adds that model once "
        "more with another loss (e.g. SASRec,SASRec@train_loss=model,BSARec --paper: "
        "SASRec with the paper's BCE and with its own CE, BSARec's gain over each)",
    )
    parser.add_argument("--dataset", "-d", default=DEFAULT_DATASET)
    parser.add_argument(
        "--seeds",
        default=",".join(map(str, DEFAULT_SEEDS)),
        help="comma-separated seeds (default 2024,2025,2026)",
    )
    parser.add_argument("--config_files", nargs="+", default=None, help="yaml files for every run")
    parser.add_argument("--out", default=None, help="output folder (default comparisons/<dataset>)")
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
    parser.add_argument("--ray", action="store_true", help="run the trials as parallel Ray tasks")
    parser.add_argument("--cpus_per_run", type=float, default=1.0, help="Ray CPUs per run")
    parser.add_argument("--gpus_per_run", type=float, default=0.0, help="Ray GPUs per run")
    parser.add_argument(
        "--ray_address", default=None, help="Ray cluster to join (default RAY_ADDRESS or local)"
    )
    return parser


def cli(argv: list[str]) -> int:
    parser = build_parser()
    args, overrides = parse_job_args(parser, argv)
    from recbole_freq.jobs.compare import compare  # only now: it loads torch and RecBole

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
            use_ray=args.ray,
            protocols=args.protocols,
            mixed_protocols=args.mixed_protocols,
            paper=args.paper,
            correction=args.correction,
            cpus_per_run=args.cpus_per_run,
            gpus_per_run=args.gpus_per_run,
            ray_address=args.ray_address,
        )
    except EXPECTED_ERRORS as error:
        return report_error(error)
    except RunInterrupted as interrupt:
        raise RunInterrupted(
            f"{interrupt}. Continue with the same command (stored runs are skipped): "
            f"{invoked_command()} {shlex.join(argv)}"
        ) from interrupt
    labels = ", ".join(dict.fromkeys(row["protocol"] for row in result["rows"]))
    print(f"Protocol{'s' if ',' in labels else ''}: {labels}\n")
    print(result["markdown"])
    for name, path in result["files"].items():
        print(f"{name:<9} {path}")
    return 0
