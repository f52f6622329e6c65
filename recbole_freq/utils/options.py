"""Checks of numeric option values, shared by the models, the noise injection and the CLI.

RecBole hands option values over as parsed from yaml or the command line, so a number may
arrive as ``3``, ``3.0`` or ``"3"``, and a typo as any other string.  Every check reads the
value with ``as_number`` (NaN for what is not a number, so every range test fails) and
raises ``ValueError`` with one line naming the option, the value and the fix.
"""

from __future__ import annotations

import math


def as_number(value) -> float:
    """``float(value)``, or NaN where ``value`` is not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def integer_option(value, name: str, minimum: int, hint: str) -> int:
    """``value`` as an int >= minimum (RecBole may hand over 3.0 or "3"), else ValueError."""
    number = as_number(value)
    if (
        isinstance(value, bool)
        or not math.isfinite(number)
        or number != int(number)
        or number < minimum
    ):
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}; {hint}")
    return int(number)


def whole_number(value, name: str) -> int:
    """``value`` as an int of any sign (3.0 and "3" included), else ValueError."""
    number = as_number(value)
    if isinstance(value, bool) or not math.isfinite(number) or number != int(number):
        raise ValueError(f"{name}={value!r} must be an integer")
    return int(number)


def finite_non_negative(value, name: str, hint: str) -> float:
    """``value`` as a finite float >= 0, else ValueError ending in ``hint``."""
    number = as_number(value)
    if isinstance(value, bool) or not number >= 0.0 or number == math.inf:
        raise ValueError(f"{name}={value!r} must be a finite number >= 0; {hint}")
    return number


class MissingSettingError(ValueError):
    """A setting a model reads that its configuration does not hold."""


def setting(config, key):
    """``config[key]``, for a key that the model's property files give a default
    (``properties/model/<Model>.yaml`` and those of its plugin base classes).  RecBole's
    ``Config`` answers None for a key it does not hold; here that is one line instead
    of a silent value."""
    if key not in config:
        raise MissingSettingError(
            f"setting {key!r} is not in this configuration: every setting a plugin model "
            "reads has a default in its property files (properties/model/<Model>.yaml and "
            "TransformerRecommender.yaml); build the configuration with "
            "recbole_freq.config.FreqConfig, which loads them"
        )
    return config[key]
