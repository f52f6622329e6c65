"""RecBole's log folders, log files and TensorBoard writers, one per run.

6. ``recbole.utils.ensure_dir`` checks ``os.path.exists`` and then calls ``os.makedirs``,
   so two runs starting together (parallel Ray trials, comparison workers) crash with
   ``FileExistsError`` on ``log/<model>``.  Every module that imported it gets a version
   that creates the folder with ``exist_ok=True``.  No RecBole issue found.  Test:
   ``test_recbole_ensure_dir_tolerates_a_folder_created_meanwhile``.

7. ``recbole.utils.init_logger`` ends with ``logging.basicConfig(handlers=[stream, file])``,
   which does nothing once the root logger has handlers.  Every later run in the same
   process (a comparison, a reused Ray worker, a test session) wrote into the first run's
   log file, with the first run's level, and left its own log file empty.  The replacement
   swaps the handlers of the previous run (closing its file) for the new run's, and keeps
   handlers that others installed (pytest, Ray).  The log file's name holds the time to
   the second and a hash of the config, so two identical runs started together (repeated
   trials, parallel comparison workers) shared one log file and one TensorBoard folder
   (named after it); the time in the name gets a random suffix.  No RecBole issue found.
   Tests: ``test_each_run_in_one_process_writes_its_own_log``,
   ``test_untrusted_files.test_two_identical_runs_started_together_write_separate_logs``.

17. No RecBole trainer closes its TensorBoard writer.  The writer appends each event on
    a thread of its own, re-opening its file by a path relative to the working directory,
    and nothing waited for that thread: events still queued when a run returned were lost
    if the process ended, or went to another folder (or failed) if the working directory
    changed meanwhile (the test suite, which changes directory per test, saw that
    ``FileNotFoundError`` on such a thread), and each run in a long-lived process
    (``--compare``, a test session) left a thread and an open writer behind.  A trainer
    that only evaluates (``--evaluate``, a Ray trial's test) opened one as well, leaving
    an empty ``log_tensorboard`` folder.  ``Trainer.fit`` now closes the writer when it
    returns or raises, and the close waits until every event is on disk (RecBole writes
    to it only during ``fit``); the writer is opened at the trainer's first event, so a
    trainer that writes none leaves no folder and no thread.  No RecBole issue found.
    Tests: ``test_compat.test_a_run_leaves_its_tensorboard_scalars_on_disk_and_no_writer_open``,
    ``test_an_evaluation_opens_no_tensorboard_writer``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys

from recbole_freq.compat.import_hooks import when_imported
from recbole_freq.utils.process_group import writing_rank


def ensure_dir_race_free(dir_path: str) -> None:
    """RecBole's ``ensure_dir`` without the check-then-create race (fix 6)."""
    os.makedirs(dir_path, exist_ok=True)


def make_ensure_dir_race_free() -> None:
    def patch(module):
        if hasattr(module, "ensure_dir"):
            module.ensure_dir = ensure_dir_race_free

    for name in (
        "recbole.utils.utils",
        "recbole.utils",
        "recbole.utils.logger",
        "recbole.trainer.trainer",
        "recbole.data.dataset.dataset",
        "recbole.data.utils",
    ):
        when_imported(name, patch)


# Marks the root-logger handlers that a run's ``init_logger`` installed (fix 7).
_RUN_HANDLER_FLAG = "_recbole_freq_run_handler"


# Set while a comparison trains (``console_warnings_only``).
_quiet_console = False


@contextlib.contextmanager
def console_warnings_only():
    """Runs inside this block log everything to their files and only warnings and errors
    to the terminal: a comparison of four one-epoch runs printed 747 lines, each run's
    whole config among them."""
    global _quiet_console
    before, _quiet_console = _quiet_console, True
    try:
        yield
    finally:
        _quiet_console = before


def _init_logger_per_run(original):
    def init_logger(config):
        root = logging.getLogger()
        installed_by_others = [h for h in root.handlers if not hasattr(h, _RUN_HANDLER_FLAG)]
        for handler in list(root.handlers):
            root.removeHandler(handler)
            if hasattr(handler, _RUN_HANDLER_FLAG):
                handler.close()
        try:
            if writing_rank(config):
                original(config)  # basicConfig installs this run's stream and file handlers
                for handler in root.handlers if _quiet_console else ():
                    if not isinstance(handler, logging.FileHandler):
                        handler.setLevel(max(handler.level, logging.WARNING))
            else:
                # A quiet process of a data-parallel run (fix 14): errors only, no file.
                quiet = logging.StreamHandler()
                quiet.setLevel(logging.ERROR)
                root.addHandler(quiet)
        finally:
            for handler in root.handlers:
                setattr(handler, _RUN_HANDLER_FLAG, True)
            for handler in installed_by_others:
                root.addHandler(handler)

    init_logger.__wrapped__ = original
    return init_logger


def current_log_file() -> str | None:
    """The log file of the latest run's ``init_logger`` (fix 7), if it has one."""
    for handler in logging.getLogger().handlers:
        if hasattr(handler, _RUN_HANDLER_FLAG) and hasattr(handler, "baseFilename"):
            return handler.baseFilename
    return None


def continue_log(recorded, segment: int) -> None:
    """A resumed run's segment logs into the run's first log file, after a line saying
    where it begins (each segment left a log of its own: three for a run stopped twice).
    ``recorded``: the log its resume state names, used only if it is a regular file (not
    a link) inside this folder's ``log/``, where RecBole writes them; what this segment
    logged before it knew (its settings) moves over, and its own new file goes."""
    import os
    import stat
    from pathlib import Path

    current = current_log_file()
    if not isinstance(recorded, str) or current is None:
        return
    target = Path(os.path.abspath(recorded))
    logs = Path(os.path.abspath("log"))
    try:
        mode = os.lstat(target).st_mode
    except OSError:
        return  # the first segment ran elsewhere: this one keeps its own log
    if logs not in target.parents or not stat.S_ISREG(mode) or str(target) == current:
        return
    root = logging.getLogger()
    handler = next(
        (
            h
            for h in root.handlers
            if hasattr(h, _RUN_HANDLER_FLAG) and getattr(h, "baseFilename", None) == current
        ),
        None,
    )
    if handler is None:
        return
    handler.flush()
    with open(current, encoding="utf-8") as source, open(target, "a", encoding="utf-8") as log:
        log.write(f"\n---- segment {segment} of this run (resumed) ----\n")
        log.write(source.read())
    appended = logging.FileHandler(target, mode="a", encoding="utf-8")
    appended.setLevel(handler.level)
    appended.setFormatter(handler.formatter)
    for kept in handler.filters:
        appended.addFilter(kept)
    setattr(appended, _RUN_HANDLER_FLAG, True)
    root.removeHandler(handler)
    handler.close()
    root.addHandler(appended)
    os.unlink(current)


def give_each_run_its_own_log() -> None:
    when_imported("recbole.utils.logger", _patch_logger)
    when_imported("recbole.utils", _patch_logger_export)


def _patch_logger_export(utils) -> None:
    # The package's name for it, bound when recbole.utils imported its logger module
    # (whose own hook has replaced it by then).
    utils.init_logger = sys.modules["recbole.utils.logger"].init_logger


def _patch_logger(logger_module) -> None:
    import secrets

    logger_module.init_logger = _init_logger_per_run(logger_module.init_logger)
    local_time = logger_module.get_local_time
    # Only the logger's copy: the log (and TensorBoard) names, nothing else.
    logger_module.get_local_time = lambda: f"{local_time()}-{secrets.token_hex(3)}"


def open_tensorboard_late_and_close_it_after_fit() -> None:
    when_imported("recbole.trainer.trainer", _patch_tensorboard)


def _patch_tensorboard(trainer_module) -> None:
    original_fit = trainer_module.Trainer.fit
    if hasattr(original_fit, "__wrapped__"):
        return
    open_writer = trainer_module.get_tensorboard
    trainer_module.get_tensorboard = lambda logger: _TensorBoardOnFirstEvent(
        functools.partial(open_writer, logger)
    )

    @functools.wraps(original_fit)
    def fit(self, *args, **kwargs):
        try:
            return original_fit(self, *args, **kwargs)
        finally:
            self.tensorboard.close()

    trainer_module.Trainer.fit = fit


class _TensorBoardOnFirstEvent:
    """A trainer's TensorBoard writer, opened when the trainer first writes (fix 17)."""

    def __init__(self, open_writer):
        self._open_writer = open_writer
        self._writer = None

    def close(self):
        if self._writer is not None:
            self._writer.close()

    def __getattr__(self, name):
        # Private and special names (copy's __deepcopy__, pickle's __setstate__ on a
        # half-built object) are not events: looking them up must not open the writer.
        if name.startswith("_"):
            raise AttributeError(name)
        if self._writer is None:
            self._writer = self._open_writer()
        return getattr(self._writer, name)
