"""The main job: train and test one model (``run_recbole_freq.py --model ... --dataset ...``)
or continue an interrupted run (``--resume``)."""

from __future__ import annotations

import argparse

from recbole_freq.cli.common import (
    EXPECTED_ERRORS,
    CommandLineParser,
    UsageError,
    add_trust_data_option,
    parse_job_args,
    report_error,
    split_config_files,
)
from recbole_freq.utils.command import (
    DEFAULT_DATASET,
    DEFAULT_MODEL,
    PLUGIN_MODEL_NAMES,
    invoked_command,
)

MODES_HELP = """\
jobs (one per call):
  (default)                 train and test one model: --model, --dataset, overrides
  --compare M1,M2 ...       train several models x seeds, tabulate them side by side
                            (run the same command again to continue an interrupted one)
  --hyper_file FILE         Ray Tune search over FILE's space (--resume --name to continue)
  --analyze CKPT ...        frequency analysis of trained checkpoints
  --recommend CKPT          top-k recommendations of a trained checkpoint
  --evaluate CKPT --under V test a checkpoint under other evaluation protocols
  --resume FILE.resume.pth  continue an interrupted training run from its last epoch
                            (--trust_data: one that records no dataset fingerprint)
Each job has its own --help (e.g. --compare --help).

{models}

common overrides (any RecBole or model setting, as --key=value):
  --epochs=N --learning_rate=X --train_batch_size=N --MAX_ITEM_LIST_LENGTH=N
  --hidden_size=N --n_layers=N --n_heads=N --seed=N --data_path=DIR
  --checkpoint_dir=DIR --device=cpu|cuda --extra_test_modes="['uni100']"
  --protocol=recbole|bsarec|fmlprec|sasrec|uni100 (docs/protocols.md), or its pieces:
  --history_mask=none|zero|exclude --train_rows=all_prefixes|window|last_n_all_positions
  --train_loss=model|bce|bpr --eval_negatives=target_only|unseen --stopping_rule=recbole|strict
  --sequence_layout=right|left
  --nproc=N (data-parallel training in N processes; also for --compare), --world_size,
  --ip, --port, --offset (RecBole's run_recbole.py: --group_offset) across machines
An unknown or misspelled key is an error; list your own keys under accept_unknown_keys.

exit codes: 0 done, 1 the environment failed (an output could not be written, memory
ran out, RecBole is missing), 2 bad usage or input,
130 interrupted (the message says what was kept and how to continue).
RECBOLE_FREQ_DEBUG=1 shows tracebacks.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = CommandLineParser(
        prog=invoked_command(),
        # Prefix matching would read BSARec's --c=5 as --config_files.
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train and evaluate a recbole-freq or RecBole model. Any other "
        "--key=value is a RecBole config override, as in RecBole's run_recbole.py.",
        epilog=MODES_HELP.format(models=models_help()) + builtin_files_help(),
    )
    # None marks "not given": only a command naming none of them runs the default job.
    parser.add_argument("--model", "-m", default=None, help="model name (default BSARec)")
    parser.add_argument(
        "--dataset",
        "-d",
        default=None,
        help="dataset name (default ml-100k, bundled with RecBole)",
    )
    parser.add_argument(
        "--config_files",
        nargs="+",
        default=None,
        help="yaml files, later ones win (also one space-separated string, as in RecBole)",
    )
    parser.add_argument(
        "--paper",
        action="store_true",
        help="add the paper's best settings for this model and dataset (BSARec Table 6)",
    )
    parser.add_argument(
        "--resume",
        metavar="FILE",
        default=None,
        help="continue the interrupted run whose resume state is FILE (<checkpoint>.resume.pth)",
    )
    add_trust_data_option(parser, "resume state (--resume)")
    return parser


def models_help() -> str:
    import textwrap

    from recbole_freq.utils.command import installed_models

    installed = sorted(installed_models())
    return textwrap.fill(
        f"models (--model): {', '.join(PLUGIN_MODEL_NAMES)}; "
        + (f"installed: {', '.join(installed)}; " if installed else "")
        + "or any RecBole built-in, e.g. SASRec, BERT4Rec, GRU4Rec, Caser, FEARec; or your "
        "own as package.module:Class",
        width=88, subsequent_indent="  ",
    )  # fmt: skip


def builtin_files_help() -> str:
    """The property files that ship with the plugin, as ``--config_files`` and
    ``--hyper_file`` name them (no path: they work for an installed copy too)."""
    import textwrap

    from recbole_freq.utils.property_files import builtin_files

    def listed(names):
        return textwrap.fill(
            " ".join(names), width=88, initial_indent="  ", subsequent_indent="  ",
            break_on_hyphens=False, break_long_words=False,
        )  # fmt: skip

    return (
        "\nbuilt-in config files (--config_files NAME; a file of yours at that path wins):\n"
        + listed(builtin_files(".yaml"))
        + "\nbuilt-in search spaces (--hyper_file NAME):\n"
        + listed(builtin_files(".hyper"))
        + "\n"
    )


def _default_job_files(args) -> list[str]:
    """With no model, dataset or config given, run the README's default job (its short
    budget); naming any of them, even the default ones, runs with the full budget."""
    from recbole_freq.utils.property_files import properties_dir

    if args.model is None and args.dataset is None and not args.config_files:
        return [str(properties_dir() / "default_job.yaml")]
    return args.config_files


def format_summary(summary: dict) -> str:
    """Readable end-of-run report: the run and its protocol label first, then the metrics
    table, epochs, time, files."""
    valid, test = summary["best_valid_result"], summary["test_result"]
    # Every metric the run's config asked for (metrics x topk), in RecBole's order.
    metrics = list(test)
    width = max([len("metric"), *map(len, metrics)]) + 2
    minutes, seconds = divmod(summary["total_seconds"], 60)
    stop = "early stopping" if summary["stopped_early"] else "epoch budget reached"
    if summary.get("learns_by_gradient") is False:
        stop = "nothing to train: counted from the training rows"
    protocol = (summary.get("protocol") or {}).get("label", "not recorded")
    lines = [
        "=" * 60,
        f"recbole-freq  {summary['model']} on {summary['dataset']}  protocol {protocol}  "
        f"(seed {summary['seed']}, {summary['device']})",
        f"data: {summary['config'].get('data_path')} (sha256 "
        f"{str(summary.get('dataset_sha256'))[:16]})",
        f"epochs run: {summary['epochs_run']} ({stop}); best epoch: {summary['best_epoch']} "
        f"by valid {summary['valid_metric']}",
        f"time: {int(minutes)} min {seconds:.0f} s total, "
        f"{summary['train_seconds_per_epoch']:.1f} s per training epoch; "
        f"{summary['parameters']:,} parameters",
        "",
        f"{'metric':<{width}}{'valid (best)':>14}{'test':>10}",
    ]
    for metric in metrics:
        valid_value = valid.get(metric)
        valid_text = f"{valid_value:.4f}" if valid_value is not None else "-"
        lines.append(f"{metric:<{width}}{valid_text:>14}{test[metric]:>10.4f}")
    lines.append("")
    lines.append(f"checkpoint: {summary['checkpoint']}")
    if summary.get("summary_file"):
        lines.append(f"summary:    {summary['summary_file']}")
    if summary.get("log_file"):
        lines.append(f"log:        {summary['log_file']}")
    lines.append("=" * 60)
    return "\n".join(lines)


def cli(argv: list[str]) -> int:
    """Train and test one model, or ``--resume`` one; print the summary."""
    parser = build_parser()
    if any(arg.partition("=")[0] == "--output_file" for arg in argv):
        return report_error(
            UsageError(
                "--output_file writes a search's results (RecBole's run_hyper.py): give it "
                "with --hyper_file (or --params_file); a training run writes its summary to "
                "<checkpoint>.json"
            )
        )
    args, overrides = parse_job_args(parser, argv)
    from recbole_freq.quick_start.quick_start import SummaryNotWrittenError, resume_run, run

    try:
        if args.resume:
            if overrides or args.config_files or args.paper:
                raise UsageError(
                    "--resume continues a run with its own settings; give no other settings"
                )
            summary = resume_run(args.resume, trust_data=args.trust_data)
        else:
            if args.trust_data or args.trust_module:
                flag = "--trust_data" if args.trust_data else "--trust_module"
                raise UsageError(f"{flag} goes with --resume (or --recommend, --evaluate)")
            summary = run(
                model=args.model or DEFAULT_MODEL,
                dataset=args.dataset or DEFAULT_DATASET,
                config_files=split_config_files(_default_job_files(args)),
                cmd_overrides=overrides,
                paper=args.paper,
            )
    except SummaryNotWrittenError as error:
        print(format_summary(error.summary))
        return report_error(error)
    except EXPECTED_ERRORS as error:
        return report_error(error)
    if summary is None:
        # A machine of a multi-machine data-parallel run without global rank 0.
        print(
            "this machine's processes of the data-parallel run finished; the machine with "
            "offset 0 writes its log, checkpoint and summary"
        )
        return 0
    print(format_summary(summary))
    return 0
