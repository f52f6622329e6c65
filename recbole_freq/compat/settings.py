"""RecBole's setting values read as literals, never evaluated as code.

18. RecBole reads setting values with ``eval()``: ``Config._convert_config_dict`` evaluates
    every string of the command line and of ``config_dict`` (which also carries a hyper
    file's choices into a trial and a stored run's settings into a re-run),
    ``HyperTuning`` evaluates a hyper file's ``choice`` lists, and KD_DAGFM evaluates its
    ``teacher`` setting.  A value such as ``__import__('os').system(...) or 0.001`` ran
    its code.  Each now reads Python literals only (``ast.literal_eval``: numbers,
    strings, lists, tuples, dicts, booleans, ``None``), with RecBole's own fallbacks
    (``true``/``false`` in any case are booleans, anything else stays the string it
    was); KD_DAGFM's ``teacher`` must name one of that module's network classes.
    Expressions (``2**10``, ``float('inf')``) are no longer computed: they stay strings,
    which the plugin's type checks then refuse in one line.  No RecBole issue found.
    Tests: ``test_untrusted_files.test_recboles_own_config_and_hyper_tuning_run_no_code``,
    ``test_a_command_line_setting_runs_no_code``, ``test_a_config_dict_setting_runs_no_code``,
    ``test_kd_dagfm_teacher_names_only_a_network_class``.
"""

from __future__ import annotations

import ast

from recbole_freq.compat.import_hooks import when_imported


def literal_setting(text: str):
    """A setting's value from its text as ``Config._convert_config_dict`` reads it, but
    for literals only (fix 18): ``"1e-3"`` -> 0.001, ``"[64, 64]"`` -> a list,
    ``"True"``/``"true"`` -> True, ``"None"`` -> None; any other text stays a string."""
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        lowered = text.lower()
        return True if lowered == "true" else False if lowered == "false" else text
    if value is not None and not isinstance(value, (str, int, float, list, tuple, dict, bool)):
        return text  # a set, complex number or bytes: RecBole keeps those as the text too
    return value


def _convert_config_dict(self, config_dict):
    """``Config._convert_config_dict`` without ``eval()`` (fix 18)."""
    for key, value in config_dict.items():
        if isinstance(value, str):
            config_dict[key] = literal_setting(value)
    return config_dict


def _module_class_by_name(module):
    """A stand-in for ``eval`` in ``module`` that only looks up one of its network classes."""
    import torch

    def lookup(text):
        found = module.__dict__.get(str(text).strip()) if str(text).strip().isidentifier() else None
        if not (isinstance(found, type) and issubclass(found, torch.nn.Module)):
            raise ValueError(f"{text!r} does not name a network class of {module.__name__}")
        return found

    return lookup


def read_settings_as_literals() -> None:
    when_imported("recbole.config.configurator", _patch_convert_config_dict)
    _read_settings_of_hyper_tuning_and_kd_dagfm()


def _patch_convert_config_dict(configurator) -> None:
    Config = configurator.Config
    if getattr(Config._convert_config_dict, "__wrapped__", None) is None:
        _convert_config_dict.__wrapped__ = Config._convert_config_dict
        Config._convert_config_dict = _convert_config_dict


def _read_settings_of_hyper_tuning_and_kd_dagfm() -> None:
    # Module globals shadow the builtin: each module's eval reads literals or class names.
    when_imported(
        "recbole.trainer.hyper_tuning", lambda module: setattr(module, "eval", literal_setting)
    )
    when_imported(
        "recbole.model.context_aware_recommender.kd_dagfm",
        lambda module: setattr(module, "eval", _module_class_by_name(module)),
    )
