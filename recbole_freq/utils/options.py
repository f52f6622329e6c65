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


def config_value(config, key, default=None):
    """``config[key]`` with a default; RecBole's ``Config`` returns None for missing keys."""
    value = config[key]
    return default if value is None else value
