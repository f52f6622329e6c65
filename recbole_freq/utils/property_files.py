"""The plugin's property files (``properties/`` of the source tree, installed as
``recbole_freq/properties``) and the names the command line gives them.

Kept apart from ``config`` (which builds RecBole's ``Config`` and imports every model)
so that listing or finding a file, as ``--help`` does, loads neither torch nor RecBole.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from recbole_freq.utils.command import invoked_command


def properties_dir() -> Path:
    """The installed property files (``properties/`` of the source tree)."""
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
    path = Path(name)
    if path.is_file():
        return path
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
