"""The plugin's property files (``properties/`` of the source tree, installed as
``recbole_freq/properties``), the names the command line gives them, and the safe
reader of every yaml settings file (``read_config_file``).

Kept apart from ``config`` (which builds RecBole's ``Config`` and imports every model)
so that listing or finding a file, as ``--help`` does, loads neither torch nor RecBole.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import yaml

from recbole_freq.utils.command import invoked_command

# A checkout (``run_recbole_freq.py`` beside the package) reads its own ``properties/``:
# with another checkout installed in editable mode, the package ``recbole_freq.properties``
# is that other checkout's files (seen: a git worktree of an older commit ran with the
# main checkout's files); used without installing there is no such package at all.
_CHECKOUT = Path(__file__).resolve().parents[2]


def properties_dir() -> Path:
    """The property files: those of the checkout the package runs from, else the
    installed ones (``properties/`` of the source tree, installed as
    ``recbole_freq/properties``)."""
    if (_CHECKOUT / "run_recbole_freq.py").is_file() and (
        _CHECKOUT / "properties" / "overall.yaml"
    ).is_file():
        return _CHECKOUT / "properties"
    return Path(str(resources.files("recbole_freq.properties")))


def builtin_files(suffix: str = ".yaml") -> list[str]:
    """The plugin's property files with ``suffix`` as they can be named on the command
    line: relative to ``properties/``, without the suffix (``protocol/uni100``)."""
    root = properties_dir()
    return sorted(
        path.relative_to(root).with_suffix("").as_posix()
        for path in root.rglob(f"*{suffix}")
        if path.is_file()
    )


def find_config_file(name, suffix: str = ".yaml", what: str = "config file") -> Path:
    """The file ``name`` means: the user's file of that path if there is one, else the
    plugin's property file of that name (``protocol/uni100``, ``protocol/uni100.yaml`` or
    ``properties/protocol/uni100.yaml``, so that the README's paths also work for an
    installed copy); ``FileNotFoundError`` naming the built-in files otherwise."""
    from recbole_freq.utils.inputs import check_input_file

    path = Path(name)
    if path.exists() and not path.is_dir():
        return check_input_file(path, what)  # a pipe or device: one line, never read
    relative = path.as_posix().removeprefix("properties/")
    if not relative.endswith(suffix):
        relative += suffix
    builtin = properties_dir() / relative
    if not path.is_absolute() and builtin.is_file():
        return builtin
    import difflib

    close = difflib.get_close_matches(relative.removesuffix(suffix), builtin_files(suffix), n=3)
    hint = f"closest: {', '.join(close)}; " if close else ""
    raise FileNotFoundError(
        f"{what} {str(name)!r} does not exist, and no built-in file has that name ({hint}"
        f"{invoked_command()} --help lists them)"
    )


class ConfigFileError(ValueError):
    """A config file that cannot be read as a yaml mapping of settings."""


class SafeConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (no Python tags) with RecBole's float resolver, so that
    ``1e-3`` is a float as in RecBole's own loader, and no duplicate keys: yaml keeps the
    last of two, so a setting given twice silently lost its first value."""

    # The name configs and checkpoints have recorded it under (``yaml_loader``) since
    # 0.1.0; ``recbole_freq.config`` still offers it.
    __module__ = "recbole_freq.config"

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            lines = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = lines.get(key)
                except TypeError:  # an unhashable key: yaml's own error follows
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"{key!r} is given twice (first on line {first + 1}); yaml would keep "
                        "only the last: give each setting once",
                        key_node.start_mark,
                    )
                lines[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


# Values a config file may expand to through yaml aliases (a "billion laughs" file is a
# few lines that expand to billions).
MAX_CONFIG_VALUES = 100_000


def _expanded_size(node, path) -> int:
    """How many values ``node`` stands for once its aliases are expanded;
    ``ConfigFileError`` beyond ``MAX_CONFIG_VALUES`` or for a recursive alias."""
    sizes, on_path = {}, set()

    def size(current) -> int:
        key = id(current)
        if key in sizes:
            return sizes[key]
        if key in on_path:
            raise ConfigFileError(f"config file {path}: a yaml alias refers to itself")
        on_path.add(key)
        total = 1
        if isinstance(current, yaml.SequenceNode):
            total += sum(size(child) for child in current.value)
        elif isinstance(current, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in current.value)
        on_path.discard(key)
        if total > MAX_CONFIG_VALUES:
            raise ConfigFileError(
                f"config file {path}: its yaml aliases expand to more than "
                f"{MAX_CONFIG_VALUES:,} values; a settings file never needs that many"
            )
        sizes[key] = total
        return total

    return size(node)


SafeConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def read_config_file(path) -> dict:
    """The settings of one yaml config file; ``ConfigFileError`` in one line otherwise."""
    from recbole_freq.utils.inputs import InputFileError, read_input_text

    try:
        text = read_input_text(path, "config file")
    except InputFileError as error:
        raise ConfigFileError(str(error)) from None
    except OSError as error:
        raise ConfigFileError(
            f"config file {path}: cannot be read ({error.strerror or error})"
        ) from error
    try:
        loader = SafeConfigLoader(text)  # its reader refuses NUL and other control characters
    except yaml.YAMLError as error:
        raise ConfigFileError(
            f"config file {path}: {getattr(error, 'reason', None) or error}; it must be yaml text"
        ) from None
    try:
        node = loader.get_single_node()
        if node is not None:
            _expanded_size(node, path)
        loaded = loader.construct_document(node) if node is not None else None
    except RecursionError as error:
        raise ConfigFileError(f"config file {path}: nested too deeply to be settings") from error
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        if "python/" in str(error):
            problem = "Python tags (!!python/...) are not allowed in config files"
        raise ConfigFileError(f"config file {path}{where}: {problem}") from error
    finally:
        loader.dispose()
    if loaded is None:
        return {}
    if not isinstance(loaded, dict) or not all(isinstance(key, str) for key in loaded):
        raise ConfigFileError(
            f"config file {path} holds a {type(loaded).__name__}, not a mapping of settings "
            "(write one `key: value` per line)"
        )
    return loaded
