"""The command the user started, for usage lines and for hints that say what to run next.

An installed copy has no ``run_recbole_freq.py``: a hint naming it sends the user to a
file they do not have.  ``invoked_command`` names what was actually run: the installed
``recbole-freq`` script, ``python -m recbole_freq``, or the checkout's script as typed.
From the Python API (no command ran) it names ``python -m recbole_freq``, which works
wherever the package imports.
"""

from __future__ import annotations

import functools
import os
import shlex
import sys

# What a command naming no model or dataset runs (the README's default job), and the
# defaults and choices the jobs' parsers offer: kept here, where importing them loads
# nothing heavy, so that every --help answers at once.
DEFAULT_MODEL = "BSARec"
# recbole_freq.model.MODELS by name, for --help without importing torch (a test keeps
# the two equal).
PLUGIN_MODEL_NAMES = (
    "BERT4RecDenoiser", "BSARec", "CL4SRec", "DuoRec", "FBSARec", "FEARec", "FMLPRec",
    "MUFFIN", "PolyRec", "RecDenoiser", "SLIME4Rec", "SSEPT", "TVRec", "TiSASRec",
    "TransitionCount", "WEARec",
)  # fmt: skip
DEFAULT_DATASET = "ml-100k"
DEFAULT_SEEDS = (2024, 2025, 2026)  # --compare
SEARCHES = ("grid", "random", "optuna", "hyperopt")  # --hyper_file --search
DEFAULT_MAX_SEQUENCES = 512  # --analyze: test sequences analysed per checkpoint
RECOMMEND_CONTEXTS = ("next", "test")  # --recommend --context
RECOMMEND_FORMATS = ("csv", "json")  # --recommend --format

# The entry-point group an installed package of models declares its models in, e.g. in
# its setup.cfg: [options.entry_points] recbole_freq.models = LowPass = mypkg.lowpass:LowPass
MODEL_ENTRY_POINTS = "recbole_freq.models"


def installed_models() -> dict[str, str]:
    """Name -> ``package.module:Class`` of the models installed packages declare
    (``MODEL_ENTRY_POINTS``), read from their metadata: nothing is imported.  Read once
    per ``sys.path`` (every model lookup asks)."""
    return dict(_installed_models(tuple(sys.path)))


@functools.lru_cache(maxsize=4)
def _installed_models(path: tuple) -> tuple:
    from importlib.metadata import entry_points

    try:
        found = entry_points(group=MODEL_ENTRY_POINTS)
    except Exception:  # noqa: BLE001 (a broken distribution's metadata: none listed)
        return ()
    return tuple((point.name, point.value) for point in found)


SCRIPT = "run_recbole_freq.py"
MODULE_COMMAND = "python -m recbole_freq"


def invoked_command(argv0: str | None = None) -> str:
    """``recbole-freq``, ``python -m recbole_freq`` or ``python <path>/run_recbole_freq.py``
    for the program whose ``sys.argv[0]`` is ``argv0`` (default: this process's)."""
    if argv0 is None:
        argv0 = sys.argv[0] if sys.argv else ""
    name = os.path.basename(argv0)
    if name in ("recbole-freq", "recbole-freq.exe"):
        return "recbole-freq"
    if name == SCRIPT:
        return f"python {shlex.quote(argv0)}"
    return MODULE_COMMAND
