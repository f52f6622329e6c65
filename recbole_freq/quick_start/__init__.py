"""The Python API: ``run`` (the plugin's ``run_recbole``), ``run_config``,
``resume_run``, ``prepare_run`` and ``restore_model``, with the pieces they are built
of (``quick_start``: the run sequence; ``preflight``: the checks before it; ``memory``,
``resume``, ``distributed``, ``restore``).  The API loads on first use,
so a light module of this package (the memory guard) does not import torch."""

__all__ = [
    "load_splits",
    "new_model",
    "prepare_run",
    "restore_model",
    "resume_run",
    "run",
    "run_config",
]


def __getattr__(name):
    if name == "restore_model":
        from recbole_freq.quick_start.restore import restore_model

        return restore_model
    if name in __all__:
        from recbole_freq.quick_start import quick_start

        return getattr(quick_start, name)
    raise AttributeError(f"module 'recbole_freq.quick_start' has no attribute {name!r}")
