"""What a checkpoint may hold, checked value by value, and the plain form it is written in.

The plugin writes every checkpoint (RecBole's trainer through ``recbole_freq.compat``,
resume states through ``recbole_freq.quick_start.resume``) as *plain data*: tensors, numbers,
strings, booleans, ``None``, lists, tuples, dicts and ``torch.device``, pickled with
protocol 2, which torch's own ``weights_only=True`` loader reads without calling
anything outside torch's tensor rebuilding.  The run's ``Config`` is written as its
attributes in that plain form (``config_to_plain``); RecBole's enums and the model class
become tagged names, looked up again on loading (``config_from_plain``) among RecBole's
enums and the recommender classes of ``recbole`` and ``recbole_freq``.

Whichever loader read a file (torch's for the plain form, the restricted unpickler of
``recbole_freq.checkpoint.safe_pickle`` for RecBole's own pickled-``Config`` form), ``checked``
then compares every value with the shape the writer gives it: the keys of a RecBole
checkpoint or of a resume state and nothing else, the type of each, only plain data
inside, tensors whose storage holds every element they claim (an expanded
200,000 x 200,000 tensor is a few bytes on disk and 160 GB once touched), and a config
rebuilt from plain data only.  Anything else is ``CheckpointError``, before any value is
used.
"""

from __future__ import annotations

import contextlib
import importlib

FORMAT_TAG = "__recbole_freq__"
CONFIG_CLASSES = ("Config", "FreqConfig")
ENUM_NAMES = (
    "ModelType",
    "InputType",
    "EvaluatorType",
    "FeatureType",
    "FeatureSource",
    "KGDataLoaderState",
)
MAX_DEPTH = 48
MAX_NODES = 2_000_000


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable or not a RecBole checkpoint."""


class UntrustedCheckpointError(ValueError):
    """A checkpoint whose pickle names or calls something a RecBole checkpoint never holds."""


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _tensors(value) -> bool:
    import torch

    return isinstance(value, dict) and all(
        isinstance(k, str) and torch.is_tensor(v) for k, v in value.items()
    )


def _optional(check):
    return lambda value: value is None or check(value)


def _best_state(value) -> bool:
    # "file" was written by earlier versions; never used.
    return value is None or (
        isinstance(value, dict)
        and set(value) - {"file"} == {"state_dict"}
        and _tensors(value["state_dict"])
    )


# key -> (required, check of its value); every value is also plain data throughout.
RECBOLE_CHECKPOINT = {
    "config": (True, None),
    "epoch": (True, _integer),
    "cur_step": (True, _integer),
    "best_valid_score": (True, _number),
    "state_dict": (True, _tensors),
    "other_parameter": (True, lambda value: True),
    "optimizer": (True, lambda value: isinstance(value, dict)),
}
RESUME_STATE = {
    "format": (True, _integer),
    "config": (True, None),
    "state_dict": (True, _tensors),
    "optimizer": (True, lambda value: isinstance(value, dict)),
    "next_epoch": (True, _integer),
    "cur_step": (True, _integer),
    "best_valid_score": (True, _number),
    "best_valid_result": (True, lambda value: isinstance(value, dict)),
    "best_state": (True, _best_state),
    # Written by earlier versions; read, never used (outputs follow the run's config).
    "checkpoint_file": (False, lambda value: isinstance(value, str)),
    "history": (True, lambda value: isinstance(value, list)),
    "train_seconds": (True, _number),
    # Wall time of the run so far and its segment count (absent in earlier versions).
    "elapsed_seconds": (False, _optional(_number)),
    "segments": (False, _integer),
    # Each segment's environment_record so far, the last one's included (absent in
    # earlier versions).
    "environments": (
        False,
        lambda value: isinstance(value, list) and all(isinstance(entry, dict) for entry in value),
    ),
    "rng": (True, lambda value: isinstance(value, dict)),
    "loader_generators": (True, lambda value: isinstance(value, list)),
    # The run's log, which its later segments append to (absent in earlier versions).
    "log_file": (False, _optional(lambda value: isinstance(value, str))),
}


def _schema_of(checkpoint: dict) -> tuple[str, dict]:
    if "next_epoch" in checkpoint or "format" in checkpoint:
        return "resume state", RESUME_STATE
    return "RecBole checkpoint", RECBOLE_CHECKPOINT


def checked(checkpoint, path) -> dict:
    """``checkpoint`` with its config rebuilt, once every value has the shape its writer
    gives it; ``CheckpointError`` naming the first that does not."""
    where = repr(str(path))
    if not isinstance(checkpoint, dict) or "config" not in checkpoint:
        raise CheckpointError(
            f"{where} is not a RecBole checkpoint: expected a dict with a config and weights"
        )
    what, schema = _schema_of(checkpoint)
    unknown = sorted(str(key) for key in checkpoint if key not in schema)
    missing = sorted(
        key for key, (required, _) in schema.items() if required and key not in checkpoint
    )
    if unknown or missing:
        raise CheckpointError(
            f"{where} is not a {what} as RecBole or the plugin writes one: "
            + "; ".join(
                part
                for part in (
                    f"unknown entries {', '.join(unknown[:5])}" if unknown else "",
                    f"missing {', '.join(missing)}" if missing else "",
                )
                if part
            )
        )
    result = {}
    for key, value in checkpoint.items():
        check = schema[key][1]
        if key == "config":
            result[key] = config_from_plain(config_to_plain(value, where), where)
            continue
        _check_plain(value, f"{where}: its '{key}'")
        if not check(value):
            raise CheckpointError(
                f"{where}: its '{key}' is a {type(value).__name__} of the wrong shape for a "
                f"{what}; the file was edited or damaged"
            )
        result[key] = value
    return result


def _check_plain(value, where: str) -> None:
    """``CheckpointError`` unless ``value`` is plain data (see the module docstring)."""
    import torch

    count = 0
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH or count > MAX_NODES:
            raise CheckpointError(f"{where} is nested deeper or larger than a checkpoint is")
        if item is None or isinstance(item, (bool, int, float, str, torch.device)):
            continue
        if torch.is_tensor(item):
            _check_tensor(item, where)
        elif isinstance(item, (list, tuple)):
            stack.extend((element, depth + 1) for element in item)
        elif isinstance(item, dict):
            for key, element in item.items():
                if not (key is None or isinstance(key, (bool, int, float, str))):
                    raise CheckpointError(f"{where} has a {type(key).__name__} as a key")
                stack.append((element, depth + 1))
        else:
            raise CheckpointError(
                f"{where} holds a {type(item).__module__}.{type(item).__qualname__}, which a "
                "checkpoint never holds (only tensors and plain data)"
            )


def _check_tensor(tensor, where: str) -> None:
    """A tensor must own the bytes of every element: no zero or overlapping strides that
    make a few stored bytes stand for a huge tensor."""
    import torch

    if tensor.layout != torch.strided or tensor.is_quantized:
        raise CheckpointError(
            f"{where} holds a {tensor.layout} tensor; only dense ones are written"
        )
    if tensor.numel() == 0:
        return
    needed = tensor.numel() * tensor.element_size()
    stored = tensor.untyped_storage().nbytes()
    if needed > stored or any(s == 0 for s, n in zip(tensor.stride(), tensor.shape) if n > 1):
        raise CheckpointError(
            f"{where} holds a tensor of shape {tuple(tensor.shape)} backed by {stored} bytes "
            "(an expanded or overlapping view): the file was crafted or damaged"
        )


# --- the config: plain form and back ------------------------------------------------


def config_to_plain(config, where: str = "config") -> dict:
    """A RecBole ``Config`` (or its plain form, checked) as plain data: ``{"class":
    "Config" | "FreqConfig", "attributes": {...}}``, enums and classes tagged by name."""
    from recbole.config import Config

    if isinstance(config, dict) and set(config) == {FORMAT_TAG, "class", "attributes"}:
        plain = config
    elif isinstance(config, Config):
        plain = {
            FORMAT_TAG: "config",
            "class": type(config).__name__,
            "attributes": {name: _encode(value) for name, value in vars(config).items()},
        }
    else:
        raise CheckpointError(f"{where}: its 'config' is not a RecBole Config")
    _check_plain(plain, f"{where}: its config")
    return plain


def _encode(value):
    """Plain form of one config value: RecBole enums and classes become tagged dicts,
    numpy scalars Python numbers; anything else unplain is left for ``_check_plain`` to
    refuse."""
    import enum

    import numpy as np

    if isinstance(value, enum.Enum):
        return {FORMAT_TAG: "enum", "type": type(value).__name__, "name": value.name}
    if isinstance(value, type):
        return {FORMAT_TAG: "class", "module": value.__module__, "name": value.__qualname__}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {key: _encode(element) for key, element in value.items()}
    if isinstance(value, list):
        return [_encode(element) for element in value]
    if isinstance(value, tuple):
        return tuple(_encode(element) for element in value)
    return value


def config_from_plain(plain: dict, where: str = "config"):
    """The ``Config`` that ``config_to_plain`` describes, rebuilt without running any of
    its methods: a bare instance of RecBole's or the plugin's config class whose
    attributes are the decoded plain values."""
    from recbole.config import Config

    from recbole_freq.config.configurator import FreqConfig

    if plain.get(FORMAT_TAG) != "config" or plain.get("class") not in CONFIG_CLASSES:
        raise CheckpointError(f"{where}: its config is not a RecBole Config")
    attributes = plain["attributes"]
    if not isinstance(attributes, dict):
        raise CheckpointError(f"{where}: its config has no attributes")
    config_class = FreqConfig if plain["class"] == "FreqConfig" else Config
    config = object.__new__(config_class)
    for name, value in attributes.items():
        # An attribute may not shadow a method, a dunder or anything the class defines.
        if not isinstance(name, str) or not name.isidentifier() or hasattr(config_class, name):
            raise CheckpointError(f"{where}: its config sets {name!r}, which a Config never holds")
        setattr(config, name, _decode(value, where))
    final = getattr(config, "final_config_dict", None)
    if not isinstance(final, dict) or not all(isinstance(key, str) for key in final):
        raise CheckpointError(f"{where}: its config has no settings (final_config_dict)")
    for name in ("model", "dataset"):
        if not isinstance(getattr(config, name, None), str):
            raise CheckpointError(f"{where}: its config names no {name}")
    return config


def _decode(value, where: str):
    if isinstance(value, dict):
        if FORMAT_TAG in value:
            return _tagged(value, where)
        return {key: _decode(element, where) for key, element in value.items()}
    if isinstance(value, list):
        return [_decode(element, where) for element in value]
    if isinstance(value, tuple):
        return tuple(_decode(element, where) for element in value)
    return value


def _tagged(value: dict, where: str):
    from recbole.utils import enum_type

    kind = value.get(FORMAT_TAG)
    if kind == "enum" and value.get("type") in ENUM_NAMES:
        members = getattr(enum_type, value["type"]).__members__
        if value.get("name") in members:
            return members[value["name"]]
    if kind == "class":
        found = allowed_class(value.get("module"), value.get("name"))
        if found is not None:
            return found
    raise CheckpointError(
        f"{where}: its config names {value!r}, which is not one of RecBole's enums, its "
        "config loaders or a recommender class of recbole or recbole_freq"
        + (untrusted_class_hint(value.get("module")) if kind == "class" else "")
    )


def config_loaders() -> tuple:
    """The yaml loader classes a RecBole or plugin ``Config`` keeps (``yaml_loader``)."""
    import yaml

    from recbole_freq.utils.property_files import SafeConfigLoader

    return (yaml.loader.FullLoader, yaml.loader.Loader, yaml.loader.SafeLoader, SafeConfigLoader)


def allowed_class(module, name):
    """The class ``module.name`` if a config may refer to it: a recommender class of
    ``recbole.model`` / ``recbole_freq.model``, or one of the yaml loaders configs keep."""
    if not isinstance(module, str) or not isinstance(name, str):
        return None
    for loader in config_loaders():
        if (loader.__module__, loader.__qualname__) == (module, name):
            return loader
    return model_class(module, name)


def to_plain_checkpoint(state: dict) -> dict:
    """``state`` (a dict as RecBole's trainer or the resume writer builds it) with its
    config and every numpy scalar in plain form, for ``torch.save`` with protocol 2."""
    from recbole.config import Config

    return {
        key: config_to_plain(value) if isinstance(value, Config) else _encode(value)
        for key, value in state.items()
    }


# Where a checkpoint's model class may come from: installed recommender code only,
# and the modules of a researcher's own models that the user named as trusted.
MODEL_PACKAGES = ("recbole.model.", "recbole_freq.model.")
_trusted_modules: frozenset[str] = frozenset()


@contextlib.contextmanager
def trusting_modules(modules):
    """Within the block, a checkpoint, resume state or search state may name a model
    class of one of ``modules`` (a researcher's own: ``--trust_module``), which loading
    then imports, running its code: the user's consent, never a file's."""
    global _trusted_modules
    before = _trusted_modules
    _trusted_modules = before | frozenset(module for module in modules or () if module)
    try:
        yield
    finally:
        _trusted_modules = before


def untrusted_class_hint(module) -> str:
    """What to do about a class of a module that is not RecBole's or the plugin's."""
    if not isinstance(module, str) or module.startswith(MODEL_PACKAGES):
        return ""
    return (
        f". If {module} is the module of your own model, loading it imports and runs that "
        f"module: give --trust_module {module} (restore_model(..., trust_module={module!r})) "
        "if you wrote it or trust it"
    )


def model_class(module: str, name: str):
    """The recommender class ``module.name`` if it is one of RecBole's or the plugin's,
    or of a module trusted now (``trusting_modules``; registered as the user's model)."""
    from recbole_freq.config.user_models import USER_MODELS

    # A model the user named in this process (--model, --compare: package.module:Class)
    # is trusted as its module was imported then.
    from recbole_freq.utils.command import installed_models

    named = {klass.__module__ for klass in USER_MODELS.values()}
    # Installed packages' models (their entry points) are installed code, as RecBole is.
    named |= {path.partition(":")[0] for path in installed_models().values()}
    trusted = module in _trusted_modules or module in named
    if not (module.startswith(MODEL_PACKAGES) or trusted) or "." in name:
        return None
    try:
        candidate = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    from recbole.model.abstract_recommender import AbstractRecommender

    if not (isinstance(candidate, type) and issubclass(candidate, AbstractRecommender)):
        return None
    if trusted and not module.startswith(MODEL_PACKAGES):
        from recbole_freq.config.configurator import register_user_model

        register_user_model(candidate, f"{module}:{name}")
    return candidate
