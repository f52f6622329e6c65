"""A researcher's own models (``package.module:Class``): the registry by class name and
where their defaults live.  Kept out of ``configurator`` (which imports and registers
them) so that ``settings`` and the checkpoint loader ask about them without an import
cycle."""

from __future__ import annotations

from pathlib import Path

# A researcher's own models, by class name, once named as ``package.module:Class`` (or
# passed as a class to the Python API) in this process: runs, checkpoints and tables name
# a model by its class name, as they do the plugin's and RecBole's.
USER_MODELS: dict[str, type] = {}


def is_user_model(model_class: type) -> bool:
    """A model class that is neither the plugin's nor RecBole's (a researcher's own)."""
    from recbole.model.abstract_recommender import AbstractRecommender

    return (
        issubclass(model_class, AbstractRecommender)
        and model_class is not AbstractRecommender
        and not model_class.__module__.startswith(("recbole.", "recbole_freq."))
    )


def user_model_path(model_class: type) -> str:
    """``package.module:Class``, how ``--model`` names a researcher's own class."""
    return f"{model_class.__module__}:{model_class.__qualname__}"


def user_property_file(model_class: type) -> Path | None:
    """A researcher's own model's defaults: ``<Class>.yaml`` beside its module."""
    import inspect

    try:
        source = inspect.getsourcefile(model_class)
    except TypeError:  # defined outside any file (an interactive session)
        return None
    path = Path(source).parent / f"{model_class.__name__}.yaml" if source else None
    return path if path is not None and path.is_file() else None
