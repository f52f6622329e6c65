"""The command line: ``run_recbole_freq.py``, ``python -m recbole_freq`` and the installed
``recbole-freq`` command all call ``main``.

``main`` picks the job from its flag, imports that job's command-line module (each a thin
layer over the job's Python API, which never imports the command line) and applies one
rule to every failure (``common.exit_code``) and interrupt (exit code 130; SIGTERM is
handled as Ctrl-C, exit code 143).
"""

from __future__ import annotations

import errno
import sys

from recbole_freq.cli.common import (
    UsageError,
    name_too_long_error,
    report_error,
    report_interrupt,
    trusted_modules,
)
from recbole_freq.utils.signals import catch_interrupts, restore_handlers

# The flag that selects a job other than training -> the job's command-line module.
JOBS = ("--hyper_file", "--compare", "--analyze", "--recommend", "--evaluate")
# RecBole's run_hyper.py flags -> the plugin's own (its --output_file is the search's too).
# RecBole's run_hyper.py and run_recbole.py flags, written as the plugin's.
RECBOLE_SYNONYMS = {"--params_file": "--hyper_file", "--group_offset": "--offset"}


def with_plugin_flags(argv: list[str]) -> list[str]:
    """``argv`` with RecBole's ``run_hyper.py`` flags written as the plugin's."""
    renamed, rest = [], iter(argv)
    for arg in rest:
        flag, equals, value = arg.partition("=")
        if flag == "--group_offset" and not equals:  # a setting: --offset=N
            equals, value = "=", next(rest, "")
        renamed.append(RECBOLE_SYNONYMS.get(flag, flag) + equals + value)
    return renamed


def selected_job(argv: list[str]) -> str | None:
    chosen = {flag for flag in JOBS for arg in argv if arg == flag or arg.startswith(flag + "=")}
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(sorted(chosen))} are separate jobs; give one")
    return chosen.pop() if chosen else None


def job_module(flag: str | None):
    """The command-line module of the job ``flag`` selects (imported only when used: the
    search pulls in Ray, the analysis matplotlib)."""
    if flag == "--hyper_file":
        from recbole_freq.cli import tune as job
    elif flag == "--compare":
        from recbole_freq.cli import compare as job
    elif flag == "--analyze":
        from recbole_freq.cli import analyze as job
    elif flag == "--recommend":
        from recbole_freq.cli import recommend as job
    elif flag == "--evaluate":
        from recbole_freq.cli import evaluate as job
    else:
        from recbole_freq.cli import train as job
    return job


def main(argv=None) -> int:
    """The entry point: every job, one rule for failures (``exit_code``) and interrupts."""
    argv = with_plugin_flags(list(sys.argv[1:] if argv is None else argv))
    previous = catch_interrupts()
    try:
        flag = selected_job(argv)
        job = job_module(flag)
        if flag and ("-h" in argv or "--help" in argv):
            job.build_parser().print_help()
            return 0
        from recbole_freq.checkpoint.schema import trusting_modules

        with trusting_modules(trusted_modules(argv)):
            return job.cli(argv)
    except KeyboardInterrupt as interrupt:
        return report_interrupt(interrupt)
    except UsageError as error:
        return report_error(error)
    except OSError as error:
        if error.errno != errno.ENAMETOOLONG:
            raise
        return report_error(name_too_long_error(error))
    finally:
        restore_handlers(previous)


__all__ = ["main", "selected_job", "job_module", "report_error"]
