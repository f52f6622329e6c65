"""RecBole ``Config`` that knows the plugin's models and property files.

Priority, lowest first: RecBole's own defaults and built-in model yaml, then
``properties/overall.yaml``, the protocol's file ``properties/protocol/<protocol>.yaml``
(``recbole_freq.protocol``; the protocol is the last one named by the sources below, in
their priority), the plugin model's yaml,
``properties/dataset/<dataset>.yaml``, the user's ``config_files`` in order, the
``config_dict`` and finally the command-line overrides.  Unlike RecBole's ``Config``,
command-line overrides are passed in explicitly and ``sys.argv`` is never read, so flags
of other programs (Ray workers, pytest) cannot leak into a configuration.

Every key the user gives must be one that something reads, with a value of the right type
(``recbole_freq.config.settings``).  yaml files are read with a safe loader (RecBole's own is
``FullLoader``, which resolves ``!!python/name`` tags to live objects), and a file that is
malformed, not a mapping or unreadable is one clear error naming the file.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from recbole.config import Config
from recbole.utils import ModelType

from dataset_prep.registry import MAX_NAME_BYTES
from recbole_freq.config.user_models import (
    USER_MODELS,
    is_user_model,
    user_model_path,
    user_property_file,
)
from recbole_freq.model import MODELS
from recbole_freq.protocol import DEFAULT_PROTOCOL, protocol_file, protocol_settings
from recbole_freq.utils.property_files import (
    ConfigFileError,
    SafeConfigLoader,
    find_config_file,
    properties_dir,
    read_config_file,
)


class UnknownModelError(ValueError):
    pass


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


def import_user_model(path: str) -> type:
    """The class ``package.module:Class`` names, imported from ``PYTHONPATH`` (the
    current folder last: it never shadows an installed package), registered by its
    class name (``USER_MODELS``); ``UnknownModelError`` in one line otherwise.  Importing
    runs the module's code: only a module named on the command line or in the Python
    call is imported, never one a file names."""
    import importlib
    import re

    module_name, _, class_name = path.partition(":")
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", module_name) or not re.fullmatch(
        r"[A-Za-z_]\w*", class_name
    ):
        raise UnknownModelError(
            f"model {path!r}: name your own model as package.module:Class (e.g. "
            "mymodels.lowpass:LowPassSASRec)"
        )
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 (any failure of the user's module: one line)
        raise UnknownModelError(
            f"model {path!r}: cannot import {module_name} ({type(error).__name__}: {error}); "
            "is its folder on PYTHONPATH or the current folder?"
        ) from None
    model_class = getattr(module, class_name, None)
    if model_class is None:
        raise UnknownModelError(f"model {path!r}: {module_name} has no {class_name}")
    return register_user_model(model_class, path)


def register_user_model(model_class, path: str | None = None) -> type:
    """Register a researcher's own sequential recommender under its class name."""
    from recbole.model.abstract_recommender import SequentialRecommender

    path = path or user_model_path(model_class)
    if not (isinstance(model_class, type) and issubclass(model_class, SequentialRecommender)):
        raise UnknownModelError(
            f"model {path!r} is not a sequential recommender: subclass RecBole's "
            "SequentialRecommender, or the plugin's TransformerRecommender (docs/models.md, "
            "'Your own model')"
        )
    name = model_class.__name__
    if name in MODELS or _recbole_has_model(name):
        raise UnknownModelError(
            f"model {path!r} is named like the {'plugin' if name in MODELS else 'RecBole'} "
            f"model {name}: runs, checkpoints and tables name a model by its class name, so "
            "give your class another name"
        )
    known = USER_MODELS.get(name)
    if known is not None and known is not model_class and user_model_path(known) != path:
        raise UnknownModelError(
            f"model {path!r}: {user_model_path(known)} is already the model {name}; give "
            "one of the classes another name"
        )
    USER_MODELS[name] = model_class
    return model_class


def get_model_class(name):
    """Plugin model class by name, else a researcher's own registered one
    (``package.module:Class`` imports and registers it), else RecBole's built-in of that
    name."""
    if not isinstance(name, str):
        if isinstance(name, type) and is_user_model(name):
            return register_user_model(name)
        return name
    if name in MODELS:
        return MODELS[name]
    if ":" in name:
        return import_user_model(name)
    if name in USER_MODELS:
        return USER_MODELS[name]
    from recbole_freq.utils.command import installed_models

    installed = installed_models()
    if name in installed:
        model_class = import_user_model(installed[name])
        if model_class.__name__ != name:
            raise UnknownModelError(
                f"the installed model {name} ({installed[name]}) is a class of another name, "
                f"{model_class.__name__}: runs name a model by its class name, so its "
                "package must declare it under that name"
            )
        return model_class
    if _recbole_has_model(name):
        from recbole.utils import get_model

        try:
            return get_model(name)
        except AttributeError:  # module exists, class spelled differently
            pass
    raise UnknownModelError(
        f"unknown model {name!r}. Plugin models: {', '.join(sorted(MODELS))}; or any "
        "RecBole built-in, e.g. SASRec, BERT4Rec, GRU4Rec, Caser, FEARec "
        "(names are case-sensitive)"
    )


def property_files(
    model, dataset: str | None, paper: bool = False, variant: str | None = None
) -> list[str]:
    """Plugin property files that apply to this model (a name or class) and dataset,
    lowest priority first: ``overall.yaml``, those of the model's plugin base classes
    (``TransformerRecommender``: the shared core's settings), the model's own (for a
    researcher's own model, ``<Class>.yaml`` beside its module), the dataset's;
    ``variant``: a named row of a paper's table (``variant_file``), after the paper file."""
    root = properties_dir()
    model_class = get_model_class(model)
    model_name = model_class.__name__
    bases = [
        root / "model" / f"{klass.__name__}.yaml"
        if klass.__module__.startswith("recbole_freq.")
        else user_property_file(klass) or root / "none"
        for klass in reversed(model_class.__mro__[1:])
        if klass.__module__.startswith("recbole_freq.") or is_user_model(klass)
    ]
    own = user_property_file(model_class) if is_user_model(model_class) else None
    if is_user_model(model_class) and any(
        k.__name__ == "TransformerRecommender" for k in model_class.__mro__
    ):
        bases.insert(
            bases.index(root / "model" / "TransformerRecommender.yaml") + 1,
            root / "model" / "core_sizes.yaml",
        )
    candidates = [root / "overall.yaml", *bases, own or root / "model" / f"{model_name}.yaml"]
    if dataset:
        candidates.append(root / "dataset" / f"{dataset}.yaml")
    files = [str(path) for path in candidates if path.is_file()]
    if paper:
        if paper_file(model_name, dataset) is None:
            available = sorted(p.stem for p in (root / "paper" / model_name).glob("*.yaml"))
            raise ValueError(
                f"no paper settings for {model_name} on {dataset!r}; available: "
                f"{', '.join(available) or 'none'}"
            )
        files.append(str(paper_file(model_name, dataset)))
    if variant is not None:
        files.append(str(variant_file(model_name, variant)))
    return files


def model_variants(model_name: str) -> list[str]:
    """The named variants of a model (``properties/variant/<Model>/<name>.yaml``)."""
    folder = properties_dir() / "variant" / model_name
    return sorted(path.stem for path in folder.glob("*.yaml"))


def variant_file(model_name: str, variant) -> Path:
    """The settings of ``variant`` of ``model_name``: a row of a paper's ablation table
    (BSARec's "only A"), a fusion variant (FBSARec's thesis tables); ``ValueError``
    naming the model's variants when there is no such file."""
    known = model_variants(model_name)
    if not isinstance(variant, str) or variant not in known:
        raise ValueError(
            f"variant {variant!r} of {model_name} is not one of its named variants "
            f"(properties/variant/{model_name}/): {', '.join(known) or 'it has none'}"
        )
    return properties_dir() / "variant" / model_name / f"{variant}.yaml"


def paper_file(model_name: str, dataset: str | None) -> Path | None:
    """The paper's settings for this model and dataset (``properties/paper/``), if any."""
    path = properties_dir() / "paper" / model_name / f"{dataset}.yaml"
    return path if dataset and path.is_file() else None


# Settings of a denoiser's paper file that only the denoiser reads; its backbone alone,
# the reference of a like-for-like comparison, gets every other setting of the file.
DENOISER_ONLY_SETTINGS = (
    "backbone",
    "attention_operator",
    "estimator",
    "sparsity_beta",
    "sparsity_normalization",
    "mask_per_head",
    "mask_sampling",
    "mask_init_prob",
    "mask_learning",
    "mask_learning_rate",
    "jacobian_gamma",
    "jacobian_projections",
    "jacobian_normalization",
)


def paper_reference_settings(denoiser: str, dataset: str) -> dict:
    """The settings of ``denoiser``'s paper file for ``dataset`` (RecDenoiser,
    BERT4RecDenoiser) that its backbone model alone shares: protocol, sizes, optimiser,
    every key but the denoiser's own (``DENOISER_ONLY_SETTINGS``).  SASRec beside
    RecDenoiser gets them, so that the pair differs only in the denoiser."""
    path = paper_file(denoiser, dataset)
    if path is None:
        raise ConfigFileError(f"no paper settings for {denoiser} on {dataset!r}")
    settings = read_config_file(path)
    return {key: value for key, value in settings.items() if key not in DENOISER_ONLY_SETTINGS}


def chosen_setting(key: str, files, config_dict, cmd_overrides):
    """The value of ``key`` with the configuration's own priority (the command line,
    ``config_dict``, then the last of ``files`` that sets it), or ``None``."""
    for source in (cmd_overrides, config_dict):
        if source.get(key) is not None:
            return source[key]
    for path in reversed(files):
        value = read_config_file(path).get(key)
        if value is not None:
            return value
    return None


def chosen_protocol(files, config_dict, cmd_overrides) -> str:
    """The protocol a configuration asks for (``chosen_setting``: user files after the
    paper file, after the model and dataset files, after ``overall.yaml``)."""
    return chosen_setting("protocol", files, config_dict, cmd_overrides) or DEFAULT_PROTOCOL


def check_api_arguments(model, dataset, config_files, config_dict, cmd_overrides) -> None:
    """The Python API's arguments, checked as the command line checks its flags: one
    ``ValueError`` naming the argument, not an ``AttributeError`` from deep inside."""
    from recbole.model.abstract_recommender import AbstractRecommender

    if not (
        isinstance(model, str)
        or (isinstance(model, type) and issubclass(model, AbstractRecommender))
    ):
        raise ValueError(
            "model must be a model name such as 'BSARec' or 'SASRec', package.module:Class, "
            f"or a model class, got {model!r}"
        )
    if dataset is not None and not isinstance(dataset, str):
        raise ValueError(f"dataset must be a dataset name such as 'lastfm', got {dataset!r}")
    if config_files is not None and (
        isinstance(config_files, (str, bytes))
        or not isinstance(config_files, (list, tuple))
        or not all(isinstance(name, (str, os.PathLike)) for name in config_files)
    ):
        hint = f" (for one file: [{config_files!r}])" if isinstance(config_files, str) else ""
        raise ValueError(
            f"config_files must be a list of yaml file paths, got {config_files!r}{hint}"
        )
    for name, value in (("config_dict", config_dict), ("cmd_overrides", cmd_overrides)):
        if value is not None and (
            not isinstance(value, dict) or not all(isinstance(key, str) for key in value)
        ):
            raise ValueError(
                f"{name} must be a dict of settings such as {{'epochs': 10}}, got "
                f"{type(value).__name__} {str(value)[:60]}"
            )


def check_name_component(name, what: str) -> None:
    """``name`` becomes part of file names (checkpoints, logs, folders): it must be one
    path component, so that no file is written outside the folder it belongs to."""
    if name is None:
        return
    text = str(name)
    if not text or text in (".", "..") or "/" in text or "\\" in text or "\0" in text:
        raise ValueError(
            f"{what} {text!r} must be a plain name (no '/', '\\', '.' or '..'): it names "
            "files and folders"
        )
    size = len(text.encode("utf-8", "surrogateescape"))
    if size > MAX_NAME_BYTES:
        raise ValueError(
            f"{what} {text[:40]!r}... has {size} "
            f"bytes: it names files and folders (with the model and date added to some), so "
            f"it may have at most {MAX_NAME_BYTES}"
        )


def parse_device(value, where: str = "--device"):
    """``torch.device`` for ``value`` (cpu, cuda, cuda:N ...); ``ValueError`` in one line
    for a name torch does not know or a device this machine does not have."""
    import torch

    try:
        device = torch.device(str(value))
    except (RuntimeError, ValueError) as error:
        raise ValueError(f"{where}={value!r} is not a device: use cpu, cuda or cuda:N") from error
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"{where}={value!r}: torch sees no CUDA device on this machine; use cpu"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"{where}={value!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    elif device.type != "cpu" and not getattr(torch, device.type, None):
        raise ValueError(f"{where}={value!r}: torch has no {device.type} backend here")
    return device


def _stderr_is_a_terminal() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


class FreqConfig(Config):
    """``recbole.config.Config`` plus the plugin's models and property files."""

    __module__ = "recbole_freq.config"  # its pickled name since 0.1.0 (package re-export)

    def __init__(
        self,
        model=None,
        dataset=None,
        config_file_list=None,
        config_dict=None,
        cmd_overrides=None,
        paper=False,
        shared_with=(),
    ):
        """``shared_with``: names of other models given the same settings (a comparison):
        a setting that one of them reads is accepted for this one too."""
        check_api_arguments(model, dataset, config_file_list, config_dict, cmd_overrides)
        self._cmd_overrides = dict(cmd_overrides or {})
        check_name_component(dataset, "dataset name")
        self._shared_with = tuple(get_model_class(name) for name in shared_with)
        model_class = get_model_class(model)
        user_files = [str(find_config_file(path)) for path in config_file_list or []]
        given_dict = dict(config_dict or {})
        variant = chosen_setting("variant", user_files, given_dict, self._cmd_overrides)
        files = property_files(model_class, dataset, paper, variant)
        protocol = chosen_protocol(files + user_files, given_dict, self._cmd_overrides)
        files.insert(1, protocol_file(protocol))
        self._property_file_count = len(files)
        self._user_file_keys: dict[str, str] = {}
        files += user_files
        super().__init__(
            model=model_class, dataset=dataset, config_file_list=files, config_dict=config_dict
        )
        self._check_user_settings(model_class, given_dict)
        # RecBole leaves use_gpu True on a CPU (the printed config said so); it only
        # decides progress display and the GPU line of the environment table.
        device = self.final_config_dict["device"]
        self.final_config_dict["use_gpu"] = getattr(device, "type", str(device)) == "cuda"

    def protocol_piece(self, piece: str) -> str:
        """The run's value of protocol ``piece`` (``train_loss``, ``train_rows`` ...),
        its protocol's default when unset; ``ProtocolError`` for an unknown value.  The
        models ask the config, so that they need not import the protocol layer above
        them."""
        return protocol_settings(self)[piece]

    def _build_yaml_loader(self):
        return SafeConfigLoader

    def _set_default_parameters(self):
        from recbole_freq.config.settings import metrics_problem

        # RecBole's own checks of these end in a NotImplementedError or a KeyError.
        problem = metrics_problem(self.final_config_dict)
        if problem:
            raise ValueError(problem)
        super()._set_default_parameters()

    def _load_config_files(self, file_list):
        merged = {}
        for index, path in enumerate(file_list or []):
            values = read_config_file(path)
            merged.update(values)
            if index >= self._property_file_count:
                self._user_file_keys.update({key: str(path) for key in values})
        return merged

    def _load_cmd_line(self):
        return self._convert_config_dict(dict(self._cmd_overrides))

    # RecBole's own default for models trained on (positive, negative) pairs.
    PAIRWISE_NEGATIVES = {
        "distribution": "uniform",
        "sample_num": 1,
        "alpha": 1.0,
        "dynamic": False,
        "candidate_num": 0,
    }

    def _sample_negatives_for_pairwise_losses(self, given: dict) -> None:
        """The shared protocol samples no training negatives (``train_neg_sample_args:
        ~``, right for CE); a pairwise model (BPR, FPMC, TransRec, ``loss_type: BPR``)
        then failed with ``KeyError: 'neg_item_id'``.  It gets RecBole's own default (one
        uniform negative) unless the user asked for none, which is refused."""
        from recbole.utils import InputType

        sampled = self.final_config_dict["train_neg_sample_args"]["distribution"] != "none"
        pairwise = self.final_config_dict.get("MODEL_INPUT_TYPE") == InputType.PAIRWISE
        # A CE loss scores all items and reads no negatives, whatever the input type.
        if not pairwise or sampled or self.final_config_dict.get("loss_type") == "CE":
            return
        if "train_neg_sample_args" in given:
            raise ValueError(
                f"{self.model} trains on (positive, negative) pairs, but "
                f"train_neg_sample_args ({given['train_neg_sample_args'][0]}) samples no "
                "negatives; give e.g. train_neg_sample_args: {distribution: uniform, "
                "sample_num: 1}"
            )
        self.final_config_dict["train_neg_sample_args"] = dict(self.PAIRWISE_NEGATIVES)

    def _read_pre_split_files(self, given: dict) -> None:
        """``benchmark_filename`` (RecBole's pre-split dataset: one file per part, for a
        sequential model one row per prefix) needs every column of those files, not the
        plugin's ``load_col`` for plain interactions, and the input lists' items in the
        targets' id space (``alias_of_item_id``), else RecBole numbers them apart and
        every input is another item.  Both unless the user set them."""
        parts = self.final_config_dict.get("benchmark_filename")
        if not parts:
            return
        if isinstance(parts, str) or len(parts) != 3:
            raise ValueError(
                f"benchmark_filename {parts!r}: give the three parts in order, e.g. "
                "[train, valid, test] for <dataset>.train.inter, .valid.inter, .test.inter"
            )
        if "load_col" not in given:
            self.final_config_dict["load_col"] = None  # every column of the files
        list_field = self.final_config_dict["ITEM_ID_FIELD"] + self.final_config_dict["LIST_SUFFIX"]
        sequential = self.final_config_dict["MODEL_TYPE"] == ModelType.SEQUENTIAL
        if sequential and "alias_of_item_id" not in given:
            self.final_config_dict["alias_of_item_id"] = [list_field]

    def _load_real_times(self, given: dict) -> None:
        """A model with time intervals reads the source's real times
        (``REAL_TIME_FIELD``, the ``real_time`` column of dataset_prep's raw logs) when
        the interaction file has them: the column joins ``load_col``, the user's too (a
        RecBole user's yaml names the columns out of habit, and TiSASRec then silently
        took its intervals from the order counter); the run's log says it was added."""
        settings = self.final_config_dict
        field, load_col = settings.get("REAL_TIME_FIELD"), settings.get("load_col")
        if settings.get("time_intervals") is not True or not field:
            return
        if not isinstance(load_col, dict) or not isinstance(load_col.get("inter"), list):
            return
        if field in load_col["inter"]:
            return
        from recbole_freq.data.guard import inter_columns, inter_files

        try:
            columns = inter_columns(inter_files(self)[0], settings.get("field_separator"))
        except OSError:
            return  # not prepared: the run stops at its dataset check
        if field in columns:
            settings["load_col"] = dict(load_col, inter=[*load_col["inter"], field])
            if "load_col" in given:
                settings["real_time_added_to_load_col"] = True

    def _check_user_settings(self, model_class, given_dict: dict) -> None:
        """Every key the user gave is read by something and has the right type; a
        ``model:`` or ``dataset:`` that disagrees with the chosen one is refused."""
        from recbole_freq.config.settings import IDENTITY_KEYS, check_user_settings

        given = {
            key: (f"config file {path}", self.file_config_dict[key])
            for key, path in self._user_file_keys.items()
        }
        given.update({key: ("config_dict", self.variable_config_dict[key]) for key in given_dict})
        given.update(
            {key: ("command line", self.cmd_config_dict[key]) for key in self._cmd_overrides}
        )
        for key in IDENTITY_KEYS:
            if key in given and given[key][1] != self.final_config_dict[key]:
                where, value = given[key]
                chosen = model_class.__name__ if key == "model" else self.dataset
                raise ValueError(
                    f"{where} sets {key}: {value} but this run's {key} is {chosen}; give the "
                    f"{key} in one place (--{key}={value} on the command line)"
                )
        # Named in the run's log (quick_start), not an error: see check_user_settings.
        self.unused_settings = check_user_settings(model_class, given, self._shared_with)
        self._sample_negatives_for_pairwise_losses(given)
        self._read_pre_split_files(given)
        if "data_path" in given and self.dataset == "ml-100k":
            # RecBole points ml-100k at its bundled copy whatever data_path says; a
            # user's own prepared ml-100k must win.
            self.final_config_dict["data_path"] = os.path.join(
                str(given["data_path"][1]), self.dataset
            )
        self._load_real_times(given)
        if "show_progress" not in given:
            # Progress bars redraw a terminal line; in a log file or a pipe each redraw is
            # a line of its own (hundreds per epoch).
            self.final_config_dict["show_progress"] = _stderr_is_a_terminal()
        if "device" in given:
            # RecBole derives the device from gpu_id alone and drops a given one.
            where, value = given["device"]
            self.final_config_dict["device"] = parse_device(value, f"device ({where})")
