"""What every job of the command line shares: one parser rule, one error reporter, one
interrupt reporter, one set of exit codes.

- ``exit_code``: 0 done, 1 an output could not be written or the device ran out of
  memory, 2 bad usage or input, 3 stopped at its time limit (``TIME_LIMIT_EXIT``: the
  same command continues), 130 interrupted (143 after SIGTERM);
- ``report_error`` / ``report_interrupt``: exactly one line on stderr
  (``RECBOLE_FREQ_DEBUG=1`` re-raises with the traceback);
- ``CommandLineParser``: argparse whose errors follow the same rule.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from recbole_freq.quick_start.memory import TrainingOutOfMemory
from recbole_freq.utils.files import OutputWriteError
from recbole_freq.utils.signals import RunInterrupted, terminated

# Usage and input errors (an unknown model, a dataset not prepared ... are ValueError or
# FileNotFoundError) and environment failures.  Nothing here imports torch or RecBole, so
# that --help answers at once.
EXPECTED_ERRORS = (
    FileNotFoundError,
    ValueError,
    OutputWriteError,
    TrainingOutOfMemory,
)


# A job that stopped at its --time_limit with its state kept: not done, not failed.
TIME_LIMIT_EXIT = 3


def exit_code(error: BaseException) -> int:
    """The one rule: an environment failure (a file or folder that cannot be written,
    a device out of memory) exits 1; usage and input errors exit 2."""
    return 1 if isinstance(error, (OutputWriteError, TrainingOutOfMemory)) else 2


def report_error(error: BaseException) -> int:
    """The command lines' answer to a failure: exactly one ``error:`` line on stderr;
    returns the exit code (``exit_code``).  With ``RECBOLE_FREQ_DEBUG=1`` the error
    propagates with its traceback instead."""
    if os.environ.get("RECBOLE_FREQ_DEBUG"):
        raise error
    print("error: " + " ".join(_shortened(word) for word in str(error).split()), file=sys.stderr)
    return exit_code(error)


def _shortened(word: str, limit: int = 200) -> str:
    """A word of a message as printed: a 100,000-character --model or path is cut (the
    line stays one readable line)."""
    if len(word) <= limit:
        return word
    return f"{word[: limit // 2]}...({len(word):,} characters)"


def name_too_long_error(error: OSError) -> UsageError:
    """The one line for a path whose folder or file name is over the file system's
    limit (255 bytes on most), whichever job opened it."""
    return UsageError(
        f"a path is too long for the file system: {error.filename!s} (each folder or file "
        "name in a path may have at most 255 bytes)"
    )


class UsageError(ValueError):
    """Bad use of the command line (exit code 2)."""


class CommandLineParser(argparse.ArgumentParser):
    """``argparse`` whose errors follow the entry point's rule: one line, exit code 2
    (argparse's own prints the usage block and exits itself)."""

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def add_trust_data_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--trust_data``: use a file that records no dataset fingerprint (one RecBole
    itself wrote) on the data it points at (``recbole_freq.data.guard``)."""
    parser.add_argument(
        "--trust_data",
        action="store_true",
        help=f"use a {what} that records no dataset fingerprint (e.g. one RecBole itself "
        "wrote) on the data found now; without it such a file is refused",
    )
    parser.add_argument(
        "--trust_module",
        action="append",
        default=[],
        metavar="MODULE",
        help=f"load a {what} of your own model, whose class is in MODULE (package.module): "
        "loading imports and runs MODULE, so only one you wrote or trust (repeatable)",
    )


def trusted_modules(argv: list[str]) -> list[str]:
    """The ``--trust_module`` values of ``argv`` (the entry point loads under them)."""
    found = []
    for index, arg in enumerate(argv):
        if arg == "--trust_module" and index + 1 < len(argv):
            found.append(argv[index + 1])
        elif arg.startswith("--trust_module="):
            found.append(arg.split("=", 1)[1])
    return found


def split_config_files(files):
    """``--config_files a.yaml b.yaml`` and RecBole's ``--config_files="a.yaml b.yaml"``;
    an entry that names a file as it stands (``"my config.yaml"``) is that one file."""
    if not files:
        return files
    return [
        name
        for entry in files
        for name in ([entry] if Path(entry).is_file() or not entry.strip() else entry.split())
    ]


def parse_job_args(parser: argparse.ArgumentParser, argv: list[str]):
    """The job's own flags, and every other ``--key=value`` as a config override."""
    args, extra = parser.parse_known_args(argv)
    return args, parse_overrides(extra, parser)


def parse_overrides(extra: list[str], parser: argparse.ArgumentParser) -> dict:
    overrides = {}
    for arg in extra:
        if not arg.startswith("--") or "=" not in arg:
            parser.error(f"unrecognized argument {arg!r}: config overrides are written --key=value")
        key, value = arg[2:].split("=", 1)
        if key in overrides and overrides[key] != value:
            parser.error(f"--{key} is given twice with different values")
        overrides[key] = value
    return overrides


def report_interrupt(error: KeyboardInterrupt) -> int:
    """Ctrl-C anywhere: one line saying what was kept and how to continue; exit 130, or
    143 after SIGTERM."""
    if os.environ.get("RECBOLE_FREQ_DEBUG"):
        raise error
    # Where the job stood is not known here: every write is atomic, so each file it
    # finished is whole and the one it was writing was not written.
    message = (
        str(error)
        if isinstance(error, RunInterrupted)
        else "stopped before the end; each file it had written is whole, the one it was "
        "writing (if any) was not written"
    )
    print("interrupted: " + " ".join(message.split()), file=sys.stderr)
    return 143 if terminated() else 130
