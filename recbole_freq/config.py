"""RecBole ``Config`` that knows the plugin's models and property files.

Priority, lowest first: RecBole's own defaults and built-in model yaml, then
``properties/overall.yaml`` (the shared evaluation protocol), the plugin model's yaml,
``properties/dataset/<dataset>.yaml``, the user's ``config_files`` in order, the
``config_dict`` and finally the command-line overrides.  Unlike RecBole's ``Config``,
command-line overrides are passed in explicitly and ``sys.argv`` is never read, so flags
of other programs (Ray workers, pytest) cannot leak into a configuration.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from recbole.config import Config

from recbole_freq.model import MODELS


class UnknownModelError(ValueError):
    pass


def properties_dir() -> Path:
    """The installed property files (``properties/`` of the source tree)."""
    return Path(str(resources.files("recbole_freq.properties")))


RECBOLE_MODEL_PACKAGES = (
    "sequential_recommender",
    "general_recommender",
    "context_aware_recommender",
    "knowledge_aware_recommender",
)


def _recbole_has_model(name: str) -> bool:
    # Looks up module names without importing recbole.model.exlib_recommender, whose
    # import needs the optional xgboost and lightgbm.
    import importlib
    import pkgutil

    for package in RECBOLE_MODEL_PACKAGES:
        module = importlib.import_module(f"recbole.model.{package}")
        if any(info.name == name.lower() for info in pkgutil.iter_modules(module.__path__)):
            return True
    return False


def get_model_class(name):
    """Plugin model class by name, else RecBole's built-in of that name."""
    if not isinstance(name, str):
        return name
    if name in MODELS:
        return MODELS[name]
    if _recbole_has_model(name):
        from recbole.utils import get_model

        try:
            return get_model(name)
        except AttributeError:  # module exists, class spelled differently
            pass
    raise UnknownModelError(
        f"unknown model {name!r}. Plugin models: {', '.join(sorted(MODELS))}; or any "
        "RecBole built-in, e.g. SASRec, BERT4Rec, GRU4Rec, Caser, FEARec, DuoRec "
        "(names are case-sensitive)"
    )


def property_files(model_name: str, dataset: str | None, paper: bool = False) -> list[str]:
    """Plugin property files that apply to this model and dataset, lowest priority first."""
    root = properties_dir()
    candidates = [root / "overall.yaml", root / "model" / f"{model_name}.yaml"]
    if dataset:
        candidates.append(root / "dataset" / f"{dataset}.yaml")
    files = [str(path) for path in candidates if path.is_file()]
    if paper:
        paper_file = root / "paper" / model_name / f"{dataset}.yaml"
        if not paper_file.is_file():
            available = sorted(p.stem for p in (root / "paper" / model_name).glob("*.yaml"))
            raise ValueError(
                f"no paper settings for {model_name} on {dataset!r}; available: "
                f"{', '.join(available) or 'none'}"
            )
        files.append(str(paper_file))
    return files


class FreqConfig(Config):
    """``recbole.config.Config`` plus the plugin's models and property files."""

    def __init__(
        self,
        model=None,
        dataset=None,
        config_file_list=None,
        config_dict=None,
        cmd_overrides=None,
        paper=False,
    ):
        self._cmd_overrides = dict(cmd_overrides or {})
        model_class = get_model_class(model)
        files = property_files(model_class.__name__, dataset, paper)
        for path in config_file_list or []:
            if not Path(path).is_file():
                raise FileNotFoundError(f"config file {path!r} does not exist")
            files.append(str(path))
        super().__init__(
            model=model_class, dataset=dataset, config_file_list=files, config_dict=config_dict
        )

    def _load_cmd_line(self):
        return self._convert_config_dict(dict(self._cmd_overrides))
