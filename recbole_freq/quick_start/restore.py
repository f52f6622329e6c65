"""Rebuild a trained model and its data from a checkpoint: ``restore_model``.

The checkpoint is read by the restricted loader (``recbole_freq.checkpoint``), and its
sizes, weights and dataset are checked against what is built.  The dataset is rebuilt
from the atomic files only: RecBole's pickled dataset and dataloader caches are never
read (``recbole_freq.compat.data``, fix 8), and cache paths named in the checkpoint's
config are dropped with a warning.
"""

from __future__ import annotations

import os
from pathlib import Path

from recbole_freq.checkpoint.loader import (
    drop_pickled_cache_settings,
    in_one_process,
    load_checkpoint,
    weights_fingerprint,
)
from recbole_freq.config.configurator import parse_device
from recbole_freq.data.guard import check_recorded_dataset
from recbole_freq.protocol import protocol_label


class CheckpointMismatchError(ValueError):
    """A checkpoint whose weights do not fit the dataset it is being used with."""


def fill_core_defaults(config) -> list[str]:
    """A plugin model's configuration stored before a setting of the shared core existed
    (a checkpoint, a search trial's state): that setting at the default the model ran
    with (``TransformerRecommender.yaml``, ``core_defaults``); returns the settings filled."""
    from recbole_freq.model import MODELS
    from recbole_freq.model.abstract_recommender import core_defaults

    if config["model"] not in MODELS:
        return []
    missing = [key for key in core_defaults() if key not in config]
    for key in missing:
        config[key] = core_defaults()[key]
    return missing


def restore_model(
    path, data_path=None, device="cpu", adjust=None, trust_data=False, trust_module=None
):
    """Rebuild a trained model and its data from a checkpoint, loaded safely.

    The dataset is rebuilt from the checkpoint's own config (same dataset name, filters,
    split and ``MAX_ITEM_LIST_LENGTH``) with RecBole's ``create_dataset`` and
    ``data_preparation``; ``data_path`` (the folder that holds ``<dataset>/``) replaces
    the path recorded at training time.  Every weight of the checkpoint must fit the model
    built on that dataset (same names and shapes, e.g. as many item embeddings as the
    dataset has items), else ``CheckpointMismatchError`` says what differs.

    ``adjust(config)``: called before the data is loaded, to change how the model is
    evaluated (``recbole_freq.jobs.evaluate``).

    The dataset must be the one the checkpoint records (``dataset_sha256``); a checkpoint
    that records none is refused unless ``trust_data``.

    ``trust_module``: the module (or modules) of a researcher's own model that the
    checkpoint may name; loading imports it, running its code, so only by consent.

    Returns ``(model, config, dataset, (train_data, valid_data, test_data), checkpoint)``;
    the model is in evaluation mode on ``device``.
    """
    from recbole.data import create_dataset
    from recbole.utils import init_seed

    from recbole_freq.checkpoint.schema import trusting_modules
    from recbole_freq.quick_start.preflight import check_item_count
    from recbole_freq.quick_start.quick_start import load_splits, new_model

    modules = [trust_module] if isinstance(trust_module, str) else list(trust_module or [])
    with trusting_modules(modules):
        checkpoint = load_checkpoint(path)
    config = checkpoint["config"]
    drop_pickled_cache_settings(config, path)
    in_one_process(config)
    fill_core_defaults(config)
    _check_sizes_before_building(config, checkpoint["state_dict"], path)
    checkpoint["weights_sha256"] = weights_fingerprint(checkpoint["state_dict"])
    _compare_with_run_summary(path, checkpoint["weights_sha256"])
    if data_path is not None:
        config["data_path"] = os.path.join(str(data_path), config["dataset"])
    config["device"] = parse_device(device)
    config["show_progress"] = False
    if adjust is not None:
        adjust(config)
    check_recorded_dataset(
        config, config["dataset_sha256"], f"checkpoint {str(path)!r}",
        "Point --data_path at the data it was trained on.", trust_data, CheckpointMismatchError,
    )  # fmt: skip
    init_seed(config["seed"], config["reproducibility"])  # as load_splits seeds it
    dataset = create_dataset(config)
    check_item_count(config, dataset)  # an evaluation variant's mode: before any allocation
    dataset, loaders = load_splits(config, dataset)
    try:
        model = new_model(config, loaders[0])
    except ValueError as error:
        raise CheckpointMismatchError(
            f"checkpoint {str(path)!r}: its config cannot build the {config['model']} it "
            f"records ({error}); the file was edited or damaged"
        ) from error
    _check_state_fits(model, checkpoint["state_dict"], path, config, dataset)
    model.load_state_dict(checkpoint["state_dict"])
    model.load_other_parameter(checkpoint.get("other_parameter"))
    model.to(config["device"]).eval()
    return model, config, dataset, loaders, checkpoint


def describe_checkpoint(path, config, checkpoint) -> str:
    """One line naming what ``restore_model`` loaded, for the user to check."""
    return (
        f"checkpoint {path}: {config['model']} on {config['dataset']}, epoch "
        f"{checkpoint.get('epoch')}, protocol {protocol_label(config)}, weights sha256 "
        f"{checkpoint['weights_sha256'][:16]}"
    )


def _check_sizes_before_building(config, state: dict, path) -> None:
    """The config's sizes must fit the weights *before* the dataset and model are built:
    an edited ``MAX_ITEM_LIST_LENGTH: 1000000`` would otherwise allocate tens of GB."""
    problems = []
    length = config["MAX_ITEM_LIST_LENGTH"]
    for name, tensor in state.items():
        # (L, d) in SASRec-style models, (L + 1, d) where a mask token has a position.
        if name.endswith("position_embedding.weight") and tensor.dim() == 2:
            if not isinstance(length, int) or length not in (tensor.shape[0], tensor.shape[0] - 1):
                problems.append(
                    f"MAX_ITEM_LIST_LENGTH={length!r} but {name} has {tensor.shape[0]} positions"
                )
        if name.endswith("item_embedding.weight") and tensor.dim() == 2:
            # Items are embedded at hidden_size (SASRec and the plugin's models) or at
            # embedding_size (GRU4Rec, NARM, Caser, STAMP ...: their hidden_size sizes
            # the recurrent or convolutional state).
            sizes = {
                key: config[key]
                for key in ("hidden_size", "embedding_size")
                if config[key] is not None
            }
            # SSE-PT's input: item and user embeddings side by side fill the hidden size
            user = state.get(name.replace("item_embedding", "user_embedding"))
            width = tensor.shape[1] + (user.shape[1] if user is not None and user.dim() == 2 else 0)
            if sizes and width not in sizes.values() and tensor.shape[1] not in sizes.values():
                named = ", ".join(f"{key}={value!r}" for key, value in sizes.items())
                problems.append(f"{named} but {name} is {tuple(tensor.shape)}")
    if problems:
        raise CheckpointMismatchError(
            f"checkpoint {str(path)!r}: its config does not fit its own weights "
            f"({'; '.join(problems[:3])}); the file was edited or damaged, nothing was built"
        )


def _compare_with_run_summary(path, fingerprint: str) -> None:
    """Warn when the run summary written beside the checkpoint recorded other weights."""
    import json
    import sys

    from recbole_freq.utils.inputs import read_input_text

    summary_file = Path(path).with_suffix(".json")
    try:
        recorded = json.loads(read_input_text(summary_file, "run summary")).get("weights_sha256")
    except (OSError, ValueError, AttributeError, RecursionError):
        return
    if recorded and recorded != fingerprint:
        print(
            f"warning: checkpoint {str(path)!r} holds weights {fingerprint[:16]}, but its run "
            f"summary {summary_file} recorded {recorded[:16]}: the file was replaced after "
            "the run",
            file=sys.stderr,
        )


def _check_state_fits(model, state: dict, path, config, dataset) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [
        f"{name}: checkpoint {tuple(state[name].shape)}, model {tuple(expected[name].shape)}"
        for name in expected
        if name in state and state[name].shape != expected[name].shape
    ]
    if not (missing or unexpected or shapes):
        return
    if missing or unexpected:
        # Other names, not other sizes: the weights belong to another architecture.
        raise CheckpointMismatchError(
            f"checkpoint {str(path)!r}: its weights are not those of a {config['model']} "
            f"(the model it records): {len(missing)} of the model's weights are missing "
            f"(e.g. {', '.join(missing[:2]) or '-'}) and {len(unexpected)} are unknown to it "
            f"(e.g. {', '.join(unexpected[:2]) or '-'}); the file was edited or damaged"
        )
    problems = ["shapes differ (" + "; ".join(shapes[:5]) + ")"]
    raise CheckpointMismatchError(
        f"checkpoint {str(path)!r} ({config['model']}) does not fit dataset "
        f"{config['dataset']!r} at {config['data_path']} ({dataset.user_num - 1} users, "
        f"{dataset.item_num - 1} items): {'; '.join(problems)}. It was trained on other "
        "data (or another version of it): point --data_path at the folder holding the "
        "dataset it was trained on."
    )
