"""RecBole 1.2.1 on numpy 2, pandas 2, torch >= 2.6 and a current Ray, and the one
RecBole release it runs on.

1. numpy 2 removed the aliases ``np.float_``, ``np.complex_`` and ``np.unicode_``.
   ``recbole.config.Config.compatibility_settings`` reads them (and then re-creates
   ``np.float``, ``np.int``, ``np.bool`` ... for RecBole's evaluators, which use
   ``np.float`` in ``recbole/evaluator/metrics.py``).  We restore exactly the types the
   old aliases named (float64, complex128, str_), and the others too so that RecBole
   code running before any ``Config`` exists works.  RecBole issues #1604, #1714, #2155,
   #2215.  Test: ``test_compat.test_numpy_aliases_name_the_old_types``,
   ``test_recbole_metrics_give_textbook_values``.

3. pandas 3 breaks RecBole silently (chained ``fillna(..., inplace=True)`` fills nothing
   under copy-on-write) and loudly (id remapping on datasets with ``.user``/``.item``
   files).  There is no safe patch for a silent change, so we require pandas < 3 and say
   so at import time.  pandas 2.x's ``FutureWarning`` about exactly these calls, printed
   several times per dataset load, is then only noise and is silenced for RecBole's
   dataset module alone.  No RecBole issue found (searched 2026-11-23).  Tests:
   ``test_pandas_3_is_refused_with_the_fix``, ``test_loading_a_dataset_shows_no_pandas_*``.

4. Importing RecBole's sequential models runs ``sine.py``, which calls
   ``torch.autograd.set_detect_anomaly(True)`` for the whole process: every later
   backward pass of every model is checked and traced, several times slower, with
   identical results.  We import that package once here and restore the anomaly setting
   the caller had.  No RecBole issue found.  Test:
   ``test_recbole_builtins_leave_autograd_anomaly_detection_off``.

5. RecBole's wheel pins ``ray<=2.6.3``, which cannot import on numpy 2.  RecBole itself
   never imports Ray outside its own ``run_hyper`` path, so the plugin installs RecBole
   with ``--no-deps`` next to a current Ray (docs/stack.md); nothing to patch here.
   RecBole issue #2215 (Ray 2.6.3's ``np.bool8`` on numpy 2).

13. pip cannot install RecBole 1.2.1 next to this stack (fix 5), so ``pip install
    recbole-freq`` leaves it out, and a missing or other RecBole ended in a raw
    ``ModuleNotFoundError`` traceback.  ``require_recbole`` (run first on import) raises
    ``RecBoleMissingError`` naming the one command that installs it; uncaught, it prints
    that one line (no traceback) and Python exits with 1.  Test:
    ``test_packaging.test_a_fresh_environment_*``.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np

from recbole_freq.compat.import_hooks import when_imported

_NUMPY_ALIASES = {
    "float_": np.float64,
    "complex_": np.complex128,
    "unicode_": np.str_,
    "bool": np.bool_,
    "int": np.int_,
    "float": np.float64,
    "complex": np.complex128,
    "object": np.object_,
    "str": np.str_,
    "long": np.int_,
}


RECBOLE_VERSION = "1.2.1"


RECBOLE_INSTALL = f"pip install --no-deps recbole=={RECBOLE_VERSION}"


class RecBoleMissingError(ImportError):
    """RecBole is not installed, or not the release the plugin is built on (fix 13)."""


def require_recbole() -> None:
    """``RecBoleMissingError`` unless RecBole 1.2.1 is installed (fix 13)."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("recbole") is None:
        found = "it is not installed"
    else:
        try:
            version = importlib.metadata.version("recbole")
        except importlib.metadata.PackageNotFoundError:
            return  # a source checkout of RecBole on the path: trust it
        if version == RECBOLE_VERSION:
            return
        found = f"found RecBole {version}"
    _print_uncaught_as_one_line(RecBoleMissingError)
    raise RecBoleMissingError(
        f"recbole-freq needs RecBole {RECBOLE_VERSION} ({found}); pip leaves it out because "
        "its metadata pins ray<=2.6.3, which cannot run on numpy 2. Install it with: "
        f"{RECBOLE_INSTALL}",
        name="recbole",
    )


def _print_uncaught_as_one_line(error_type: type[BaseException]) -> None:
    """An uncaught ``error_type`` prints ``error: <message>`` instead of a traceback;
    every other exception is left to the previous hook."""
    previous = sys.excepthook

    def excepthook(kind, value, traceback):
        if isinstance(value, error_type):
            print(f"error: {value}", file=sys.stderr)
        else:
            previous(kind, value, traceback)

    sys.excepthook = excepthook


def restore_numpy_aliases() -> None:
    for name, value in _NUMPY_ALIASES.items():
        if name not in np.__dict__:
            setattr(np, name, value)


def require_pandas_below_3() -> None:
    import importlib.metadata

    try:  # the installed version: importing pandas here would cost every start-up
        version = importlib.metadata.version("pandas")
    except importlib.metadata.PackageNotFoundError:
        return  # RecBole's own import then names what is missing
    major = int(version.split(".")[0])
    if major >= 3:
        raise ImportError(
            f"recbole-freq needs pandas < 3 (found {version}): RecBole 1.2.1 "
            "silently fills no missing values under pandas 3's copy-on-write and fails "
            "to remap ids. Install a supported version: pip install 'pandas>=2.2,<3'"
        )


def silence_pandas_chained_assignment_notice() -> None:
    # Only RecBole's dataset module: the same notice from user code still shows (fix 3).
    warnings.filterwarnings(
        "ignore",
        message="A value is trying to be set on a copy of a DataFrame or Series through "
        "chained assignment",
        category=FutureWarning,
        module=r"recbole\.data\.dataset\.dataset",
    )


def contain_sine_anomaly_detection() -> None:
    import_state = {}

    def before(_name):
        import torch

        import_state["enabled"] = torch.is_anomaly_enabled()

    def after(_module):
        import torch

        torch.autograd.set_detect_anomaly(import_state.get("enabled", False))

    when_imported("recbole.model.sequential_recommender.sine", after, before=before)
