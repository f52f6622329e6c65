"""Which settings exist, and what type each takes: derived, never hand-kept.

A misspelled setting (``--epoch=3``, ``hiden_size: 64``, ``--learning-rate=0.01``) would
otherwise be stored in the config and read by nobody: the run trains with the default
and reports success.  Every key a user gives (command line, ``--config_files``, a
``config_dict``) must be one that something reads:

- RecBole: the keys of all its property files (``overall.yaml``, ``dataset/*.yaml``,
  ``quick_start_config/*.yaml``) and the keys its code outside ``recbole/model`` reads
  (``config["..."]`` in the dataset loader, samplers, trainers, evaluators, ``Config``);
- the chosen model: its RecBole or plugin property file, the keys its class and base
  classes read in their source, and, for plugin models, the keys of every registered
  encoder component (any attention operator or residual path is one config line away);
- the plugin: the keys of all its property files (``properties/``).

A user's own extension keys are listed under ``accept_unknown_keys``.

Types come from the defaults in all those property files: a key whose defaults are all
integers takes an integer, one with a real-valued default takes a finite number, and a
boolean default takes ``True`` / ``False``.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import re
from pathlib import Path

import yaml

ESCAPE_HATCH = "accept_unknown_keys"
# Keys that say which model and dataset a config is for: checked by FreqConfig itself.
IDENTITY_KEYS = ("model", "dataset")
_READS = re.compile(
    r"""(?:config|final_config_dict|config_dict)\[\s*["']([A-Za-z_][A-Za-z_0-9]*)["']\s*\]"""
    r"""|setting\(\s*config\s*,\s*["']([A-Za-z_][A-Za-z_0-9]*)["']"""
)


class UnknownSettingError(ValueError):
    """A setting nothing reads, or a value of the wrong type."""


def _recbole_root() -> Path:
    import recbole

    return Path(recbole.__file__).parent


def _plugin_properties() -> Path:
    from recbole_freq.utils.property_files import properties_dir

    return properties_dir()


def _yaml_mapping(path: Path) -> dict:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _keys_read_in(source: str) -> set[str]:
    return {a or b for a, b in _READS.findall(source)}


@functools.lru_cache(maxsize=1)
def _property_files() -> tuple[tuple[Path, str], ...]:
    """``(path, owner)`` of every property file; owner is ``"common"`` or a model name."""
    recbole_props = _recbole_root() / "properties"
    plugin_props = _plugin_properties()
    files = [(recbole_props / "overall.yaml", "common")]
    files += [(p, "common") for p in sorted((recbole_props / "dataset").glob("*.yaml"))]
    files += [(p, "common") for p in sorted((recbole_props / "quick_start_config").glob("*.yaml"))]
    files += [(p, p.stem) for p in sorted((recbole_props / "model").glob("*.yaml"))]
    for path in sorted(plugin_props.rglob("*.yaml")):
        relative = path.relative_to(plugin_props).parts
        if relative[0] == "model":
            files.append((path, path.stem))
        elif relative[0] in ("paper", "variant") and len(relative) == 3:
            files.append((path, relative[1]))
        else:
            files.append((path, "common"))
    return tuple(files)


@functools.lru_cache(maxsize=1)
def common_keys() -> frozenset[str]:
    """Keys every run may set: RecBole's and the plugin's shared property files, and what
    RecBole reads outside its models."""
    keys = {ESCAPE_HATCH}
    for path, owner in _property_files():
        if owner == "common":
            keys |= set(_yaml_mapping(path))
    root = _recbole_root()
    for source in root.rglob("*.py"):
        if "model" not in source.relative_to(root).parts[:1]:
            keys |= _keys_read_in(source.read_text(encoding="utf-8"))
    return frozenset(keys)


@functools.lru_cache(maxsize=1)
def keys_by_model() -> dict[str, frozenset[str]]:
    """Model name -> the keys of its property files."""
    found: dict[str, set[str]] = {}
    for path, owner in _property_files():
        if owner != "common":
            found.setdefault(owner, set()).update(_yaml_mapping(path))
    return {name: frozenset(keys) for name, keys in found.items()}


def _on_the_core(model_class: type) -> bool:
    """A model built on the plugin's core: the plugin's, or a researcher's own subclass."""
    return any(
        klass.__module__.startswith("recbole_freq.") for klass in inspect.getmro(model_class)
    )


@functools.cache
def _keys_in_source(model_class: type) -> frozenset[str]:
    """Keys the source of ``model_class`` and of its bases reads: RecBole's, the plugin's
    and a researcher's own modules alike (judged by what they read, not where they
    live); Python's and torch's own classes are not read."""
    keys = set()
    for klass in inspect.getmro(model_class):
        module = inspect.getmodule(klass)
        if module is None or module.__name__.split(".")[0] in ("builtins", "torch", "typing"):
            continue
        try:
            keys |= _keys_read_in(inspect.getsource(module))
        except (OSError, TypeError):
            continue
    if _on_the_core(model_class):
        from recbole_freq.model import (
            denoising,
            encoder,
            frequency,
            layers,
            objectives,
            personal,
            polynomial,
            temporal,
        )

        for core in (
            layers,
            encoder,
            frequency,
            polynomial,
            denoising,
            objectives,
            personal,
            temporal,
        ):
            keys |= _keys_read_in(inspect.getsource(core))
    return frozenset(keys)


def model_keys(model_class: type) -> frozenset[str]:
    """Keys ``model_class`` reads: its property files, its and its bases' source, and for
    plugin models every encoder component registered now."""
    keys = set(keys_by_model().get(model_class.__name__, ())) | _keys_in_source(model_class)
    from recbole_freq.config.user_models import is_user_model, user_property_file

    own = user_property_file(model_class) if is_user_model(model_class) else None
    if own is not None:
        keys |= set(_yaml_mapping(own))
    if _on_the_core(model_class):
        from recbole_freq.model import encoder

        for registry in (encoder.ATTENTION_OPERATORS, encoder.RESIDUAL_PATHS):
            for component in registry.values():
                keys |= set(component.config_keys)
    return frozenset(keys)


@functools.lru_cache(maxsize=1)
def setting_types() -> dict[str, str]:
    """Key -> ``"integer"``, ``"number"`` or ``"boolean"``, from every default in the
    property files (a key with mixed or non-numeric defaults is not typed)."""
    seen: dict[str, set[str]] = {}
    for path, _ in _property_files():
        for key, value in _yaml_mapping(path).items():
            if isinstance(value, bool):
                kind = "boolean"
            elif isinstance(value, int):
                kind = "integer"
            elif isinstance(value, float):
                kind = "number"
            else:
                kind = "other" if value is not None else None
            if kind:
                seen.setdefault(key, set()).add(kind)
    types = {}
    for key, kinds in seen.items():
        if kinds == {"boolean"}:
            types[key] = "boolean"
        elif kinds == {"integer"}:
            types[key] = "integer"
        elif kinds <= {"integer", "number"}:
            types[key] = "number"
    return types


# Ranges of the common numeric settings: (low, low included, high, high included); None
# is unbounded.  Types come from the property files; ranges cannot, so they are kept here,
# each with the reason a value outside it fails or means nothing.
BOUNDS = {
    # sizes and counts: 0 builds an empty layer or batch (a crash deep in torch)
    "hidden_size": (1, True, None, False),
    "inner_size": (1, True, None, False),
    "embedding_size": (1, True, None, False),
    "n_layers": (1, True, None, False),
    "num_layers": (1, True, None, False),
    "n_heads": (1, True, None, False),
    "MAX_ITEM_LIST_LENGTH": (1, True, None, False),
    "train_batch_size": (1, True, None, False),
    "eval_batch_size": (1, True, None, False),
    "stopping_step": (1, True, None, False),
    # probabilities: a dropout of 1 zeroes every activation
    "hidden_dropout_prob": (0, True, 1, False),
    "attn_dropout_prob": (0, True, 1, False),
    "dropout_prob": (0, True, 1, False),
    # optimisation
    "learning_rate": (0, False, None, False),
    "weight_decay": (0, True, None, False),
    "layer_norm_eps": (0, False, None, False),
    "initializer_range": (0, False, None, False),
    # RecBole's cloze transform (BERT4Rec): share of items masked, share of batches
    # masking only the last item
    "mask_ratio": (0, False, 1, False),
    "ft_ratio": (0, True, 1, True),
}


def range_problem(key: str, value) -> str | None:
    """Why ``value`` lies outside ``key``'s range (``BOUNDS``), or None.  The plugin
    models check their own settings' ranges when they are built, with the paper's
    equation in the message."""
    if key not in BOUNDS or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    low, low_in, high, high_in = BOUNDS[key]
    if low is not None and (value < low or (value == low and not low_in)):
        return f"must be {'>=' if low_in else '>'} {low}"
    if high is not None and (value > high or (value == high and not high_in)):
        return f"must be {'<=' if high_in else '<'} {high}"
    return None


def type_problem(key: str, value) -> str | None:
    """Why ``value`` does not fit ``key``'s type, or None."""
    expected = setting_types().get(key)
    if expected is None or value is None:
        return None
    if expected == "boolean":
        return None if isinstance(value, bool) else "must be True or False"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "must be an integer" if expected == "integer" else "must be a number"
    if expected == "integer" and not isinstance(value, int):
        return "must be an integer"
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    return None


def evaluation_mode_problem(mode, sequential: bool = True) -> str | None:
    """Why ``mode`` is not an evaluation mode a run can use, or None: ``full``, ``uni<N>``
    or ``pop<N>`` with N >= 1 (``uni0`` ranks each target alone, so every metric would be
    1.0); ``labeled`` only for models that score labelled interactions, never a
    sequential one."""
    if mode == "full" or (mode == "labeled" and not sequential):
        return None
    if isinstance(mode, str) and mode[:3] in ("uni", "pop") and mode[3:].isdigit():
        if int(mode[3:]) >= 1:
            return None
        return (
            f"{mode!r} ranks each target against no sampled item, so every metric would be "
            f"1.0; use {mode[:3]}100 (or another count >= 1) or full"
        )
    if mode == "labeled":
        return (
            "'labeled' scores labelled interactions of a context-aware dataset; a sequential "
            "model ranks items: use full, uni<N> or pop<N>"
        )
    return f"{mode!r} is not a RecBole evaluation mode: use full, uni<N> or pop<N> (e.g. uni100)"


def metrics_problem(config) -> str | None:
    """Why the ``metrics``, ``topk`` or ``valid_metric`` of ``config`` (a ``Config`` or its
    settings dict) cannot be computed, or None: RecBole fails on them in its ``Config``
    with a traceback, or after a whole training epoch."""
    from recbole.evaluator.base_metric import TopkMetric
    from recbole.evaluator.register import metrics_dict

    def setting(key):
        return config[key] if key in config else None

    metrics, topk = setting("metrics"), setting("topk")
    metrics = [metrics] if isinstance(metrics, str) else metrics
    if not isinstance(metrics, (list, tuple)) or not metrics:
        return f"metrics={metrics!r}: give at least one metric, e.g. ['Hit', 'NDCG']"
    unknown = [m for m in metrics if not isinstance(m, str) or m.lower() not in metrics_dict]
    if unknown:
        known = sorted(cls.__name__ for cls in set(metrics_dict.values()))
        return f"metrics: {unknown[0]!r} is not a RecBole metric (known: {', '.join(known)})"
    ranked = any(issubclass(metrics_dict[m.lower()], TopkMetric) for m in metrics)
    topk = [topk] if isinstance(topk, int) and not isinstance(topk, bool) else topk
    if ranked and (
        not isinstance(topk, (list, tuple))
        or not topk
        or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in topk)
    ):
        return f"topk={setting('topk')!r}: give at least one cut-off >= 1, e.g. [10, 20]"
    if setting("valid_metric") is None:
        return None
    metric = str(setting("valid_metric"))
    name, at, k = metric.partition("@")
    chosen = metrics_dict.get(name.lower())
    if chosen is not None and issubclass(chosen, TopkMetric) and not at:
        return (
            f"valid_metric={metric} needs a cut-off: {name} is computed at topk "
            f"{list(topk)} (e.g. valid_metric={name}@{list(topk)[-1]})"
        )
    return None


def check_user_settings(
    model_class: type, given: dict[str, tuple[str, object]], shared_with=()
) -> list[str]:
    """``given``: key -> (where it was given, its value).  ``UnknownSettingError`` for the
    first key nothing reads or whose value has the wrong type.  ``shared_with``: other
    model classes the same settings are given to (a comparison): a key one of them reads
    is accepted.

    A key that only other models read is accepted from a config file or config_dict (one
    dataset yaml for a sweep of baselines, as RecBole users keep it: RecBole ignores
    such keys) and returned, for the run to name in its log; on the command line, typed
    for this run, it is refused."""
    extension = set()
    if ESCAPE_HATCH in given:
        where, value = given[ESCAPE_HATCH]
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise UnknownSettingError(f"{where}: {ESCAPE_HATCH} must be a list of key names")
        extension = set(names)
    known = common_keys() | model_keys(model_class) | extension | set(IDENTITY_KEYS)
    for other in shared_with:
        known |= model_keys(other)
    model = model_class.__name__
    others = set().union(*keys_by_model().values())
    unused = []
    for key, (where, value) in given.items():
        if key not in known and key in others and where != "command line":
            unused.append(key)
        elif key not in known:
            raise UnknownSettingError(_unknown_message(key, where, model, known))
        problem = type_problem(key, value) or range_problem(key, value)
        if problem:
            flag = "--" if where == "command line" else ""
            raise UnknownSettingError(f"{flag}{key} ({where}) {problem}, got {value!r}")
    return unused


def _unknown_message(key: str, where: str, model: str, known) -> str:
    flag = "--" if where == "command line" else ""
    owners = sorted(name for name, keys in keys_by_model().items() if key in keys)
    if owners:
        return (
            f"{flag}{key} ({where}) is not a setting of {model} (it is one of "
            f"{', '.join(owners[:6])}{' ...' if len(owners) > 6 else ''}) and would have no "
            f"effect; remove it, or list it under {ESCAPE_HATCH} if your code reads it"
        )
    close = difflib.get_close_matches(key.replace("-", "_"), sorted(known), n=1, cutoff=0.6)
    if not close:
        lowered = {k.lower(): k for k in known}
        close = [lowered[key.lower()]] if key.lower() in lowered else []
    hint = f"did you mean {flag}{close[0]}? " if close else ""
    return (
        f"unknown setting {flag}{key} ({where}): nothing in RecBole, {model} or recbole-freq "
        f"reads it. {hint}(A key of your own: list it under {ESCAPE_HATCH}.)"
    )
