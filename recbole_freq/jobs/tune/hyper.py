"""RecBole hyper files as search spaces: ``choice``, ``uniform``, ``quniform`` and
``loguniform`` lines with RecBole's meaning (``parse_hyper_lines``).  Parsing needs no
Ray; the search (``recbole_freq.jobs.tune.search``) turns a space into Ray Tune's."""

from __future__ import annotations

import ast
import math
import random
import re
import sys
from dataclasses import dataclass

HYPER_TYPES = ("choice", "uniform", "quniform", "loguniform")
# Values one quniform line may stand for: each is listed for grid and distinct-random
# search (a range of 1e12 values filled the memory, MemoryError).
MAX_GRID_VALUES = 100_000


class HyperFileError(ValueError):
    """A hyper file that cannot be read as a search space."""


@dataclass(frozen=True)
class HyperParam:
    """One line of a hyper file.

    ``choice`` keeps ``values``; ``uniform``, ``loguniform`` and ``quniform`` keep
    ``low``/``high`` as written (natural-log bounds for ``loguniform``, as RecBole
    passes them to ``hyperopt.hp.loguniform``) and ``q`` for ``quniform``.
    ``integer``: a ``quniform`` whose bounds and step are all written as integers draws
    ints (hyperopt would give floats such as ``64.0``, which layer sizes reject).
    """

    name: str
    kind: str
    values: tuple = ()
    low: float | None = None
    high: float | None = None
    q: float | None = None
    integer: bool = False
    line: int = 0

    def grid_values(self) -> list | None:
        """Every value of a discrete parameter, ``None`` for a continuous one."""
        if self.kind == "choice":
            return list(self.values)
        if self.kind == "quniform":
            first, last = math.ceil(self.low / self.q - 1e-9), math.floor(self.high / self.q + 1e-9)
            values = [k * self.q for k in range(first, last + 1)]
            return [int(round(v)) for v in values] if self.integer else values
        return None

    def extremes(self) -> list:
        """The values a trial can be given that any check must pass: every value of a
        discrete parameter, the two bounds of a continuous one."""
        values = self.grid_values()
        if values is not None:
            return values
        if self.kind == "loguniform":
            return [math.exp(self.low), math.exp(self.high)]
        return [self.low, self.high]

    def to_tune(self):
        """The Ray Tune sampling domain with RecBole's meaning of the keyword."""
        from ray import tune

        if self.kind == "choice":
            return tune.choice(list(self.values))
        if self.kind == "uniform":
            return tune.uniform(self.low, self.high)
        if self.kind == "loguniform":
            return tune.loguniform(math.exp(self.low), math.exp(self.high))
        if self.integer:
            return tune.qrandint(int(self.low), int(self.high), int(self.q))
        return tune.quniform(self.low, self.high, self.q)

    def describe(self) -> str:
        if self.kind == "choice":
            return f"{self.name} choice {list(self.values)}"
        if self.kind == "quniform":
            return f"{self.name} quniform {self.low},{self.high},{self.q}"
        return f"{self.name} {self.kind} {self.low},{self.high}"


_INT = re.compile(r"[+-]?\d+")


def _numbers(text: str, count: int, where: str, form: str) -> tuple[list[float], bool]:
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != count or not all(parts):
        raise HyperFileError(f"{where}: expected {form}, got {text!r}")
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        raise HyperFileError(f"{where}: expected {form} (numbers), got {text!r}") from None
    if not all(math.isfinite(n) for n in numbers):
        raise HyperFileError(f"{where}: bounds must be finite numbers, got {text!r}")
    return numbers, all(_INT.fullmatch(p) for p in parts)


def parse_hyper_lines(lines, source: str = "<hyper>") -> dict[str, HyperParam]:
    """Parse RecBole hyper-file lines, ``<name> <type> <values>``, into a search space.

    Types, with RecBole's semantics (``recbole.trainer.hyper_tuning``):

    - ``choice [v1, v2, ...]``: one of the listed Python literals;
    - ``uniform low,high``: a float uniformly in ``[low, high]``;
    - ``loguniform low,high``: ``exp(u)`` with ``u`` uniform in ``[low, high]``, i.e.
      the bounds are natural logs (``-8,0`` spans ``3.4e-4 .. 1``);
    - ``quniform low,high,q``: a multiple of ``q`` in ``[low, high]``.

    Blank lines and lines starting with ``#`` are skipped.  Unlike RecBole, which skips
    any line with fewer than three fields and ``eval``-uates choices, a malformed line is
    an error naming the line, and choices are read as literals only.
    """
    space: dict[str, HyperParam] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}, line {number} ({line!r})"
        fields = line.split(None, 2)
        if len(fields) < 3:
            raise HyperFileError(
                f"{where}: expected '<name> <type> <values>', e.g. "
                "'learning_rate loguniform -8,0' or 'alpha choice [0.1,0.5]'"
            )
        name, kind, text = fields
        if kind not in HYPER_TYPES:
            raise HyperFileError(
                f"{where}: unknown type {kind!r}; use one of {', '.join(HYPER_TYPES)}"
            )
        if name in space:
            raise HyperFileError(f"{where}: {name!r} is already defined on line {space[name].line}")
        if kind == "choice":
            try:
                values = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                raise HyperFileError(
                    f"{where}: choice values must be a Python list literal such as "
                    "[0.1,0.3] or ['CE','BPR']"
                ) from None
            if not isinstance(values, (list, tuple)) or not values:
                raise HyperFileError(f"{where}: choice needs a non-empty list, e.g. [1,2,3]")
            param = HyperParam(name, kind, values=tuple(values), line=number)
        elif kind == "quniform":
            (low, high, q), integer = _numbers(text, 3, where, "'low,high,q'")
            if q <= 0:
                raise HyperFileError(f"{where}: the step q must be positive")
            if not (math.isfinite(low / q) and math.isfinite(high / q)):
                raise HyperFileError(f"{where}: the step q={q} is too small for [{low}, {high}]")
            if low > high:
                raise HyperFileError(f"{where}: low {low} is above high {high}")
            param = HyperParam(name, kind, low=low, high=high, q=q, integer=integer, line=number)
            count = math.floor(high / q + 1e-9) - math.ceil(low / q - 1e-9) + 1
            if count > MAX_GRID_VALUES:
                raise HyperFileError(
                    f"{where}: quniform {low},{high},{q} has {count:,} values, more than the "
                    f"{MAX_GRID_VALUES:,} a search space may list; raise the step q or narrow "
                    "the range (or use uniform for a continuous one)"
                )
            if not param.grid_values():
                raise HyperFileError(f"{where}: no multiple of q={q} lies in [{low}, {high}]")
        else:
            (low, high), _ = _numbers(text, 2, where, "'low,high'")
            if low >= high:
                raise HyperFileError(f"{where}: low {low} must be below high {high}")
            if kind == "loguniform" and high > math.log(sys.float_info.max):
                meant = f"loguniform {math.log(low):.4g},{math.log(high):.4g}" if low > 0 else ""
                raise HyperFileError(
                    f"{where}: loguniform bounds are natural logs (RecBole's meaning), and "
                    f"exp({high:g}) overflows"
                    + (f"; for values from {low:g} to {high:g} write {meant}" if meant else "")
                )
            param = HyperParam(name, kind, low=low, high=high, line=number)
        space[name] = param
    return space


def parse_hyper_file(path) -> dict[str, HyperParam]:
    """The search space of a hyper file (the user's path, or a built-in name such as
    ``hyper/BSARec``); see :func:`parse_hyper_lines`."""
    from recbole_freq.utils.inputs import read_input_text
    from recbole_freq.utils.property_files import find_config_file

    path = find_config_file(path, suffix=".hyper", what="hyper file")
    space = parse_hyper_lines(read_input_text(path, "hyper file").splitlines(), source=str(path))
    if not space:
        raise HyperFileError(
            f"{path}: the search space is empty; add lines like 'learning_rate choice "
            "[0.001,0.0005]'"
        )
    return space


def grid_size(space: dict[str, HyperParam]) -> int | None:
    """Number of combinations of a discrete space, ``None`` if a parameter is continuous."""
    grids = [param.grid_values() for param in space.values()]
    if any(grid is None for grid in grids):
        return None
    return math.prod(len(grid) for grid in grids)


def distinct_combinations(space: dict[str, HyperParam], count: int, seed: int) -> list[dict]:
    """``count`` different combinations of a discrete space, drawn uniformly."""
    names = list(space)
    grids = [space[name].grid_values() for name in names]
    total = math.prod(len(grid) for grid in grids)
    picks = random.Random(seed).sample(range(total), count)
    combinations = []
    for index in picks:
        combination = {}
        for name, grid in zip(reversed(names), reversed(grids)):
            index, position = divmod(index, len(grid))
            combination[name] = grid[position]
        combinations.append({name: combination[name] for name in names})
    return combinations
