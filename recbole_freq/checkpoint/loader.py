"""Load RecBole checkpoints without running code from them.

A RecBole checkpoint (``Trainer._save_checkpoint``) is ``torch.save`` of a dict with
``config`` (the run's ``recbole.config.Config``), ``epoch``, ``cur_step``,
``best_valid_score``, ``state_dict``, ``other_parameter`` and ``optimizer``.

The plugin writes it as plain data (``recbole_freq.checkpoint.schema``: the config as
its attributes, enums and classes by name, pickle protocol 2), which torch's own
``weights_only=True`` loader reads: a file whose pickle names only globals of torch's
weights-only allowlist is loaded by torch alone.

RecBole's own form pickles the ``Config`` object, so the full pickle loader would execute
whatever a crafted file asks for, and torch's weights-only loader cannot read it
(protocol 4, and a ``Config``).  Such a file is given to ``torch.load`` with a
restricted unpickler (``recbole_freq.checkpoint.safe_pickle``, through torch's documented
``pickle_module`` hook, so tensors and storages are still read by torch): a global is
resolved only if it is on an explicit allowlist, only the harmless ones among them may
be *called* (``REDUCE`` / ``NEWOBJ``), and a call may be handed no class, function or
``Config`` that is not itself callable (torch's ``_rebuild_from_type_v2`` calls its first
argument).  The allowlist is exactly what RecBole checkpoints hold:

- the globals torch's weights-only unpickler allows itself (tensor rebuild functions,
  dtypes, storages, ``OrderedDict``, ``torch.device``, ...), callable;
- RecBole's enums (``ModelType``, ``InputType``, ``EvaluatorType``, ...), numpy scalars
  and dtypes, callable (value look-ups);
- the ``Config`` classes (RecBole's and ``FreqConfig``): only rebuilt as ``NEWOBJ`` (plain
  ``object.__new__``, the constructor never runs) plus a ``__dict__`` update;
- as plain references, never called: the yaml loader class the config keeps, and the
  model class stored in ``config["model_class"]``, accepted only if it is a recommender
  class defined in ``recbole.model`` or ``recbole_freq.model`` (installed code).

Whichever loader read it, every value is then checked against the shape its writer gives
it (``checkpoint_schema.checked``), and the config is rebuilt from plain values.

Before anything is unpickled, the file's pickle stream is scanned (parsed, not run) for
the globals it names; a checkpoint naming anything else is refused with
``UntrustedCheckpointError`` and is never unpickled.  No checkpoint is ever unpickled
in full, not even one this process wrote: RecBole's trainer loads through this module too
(``recbole_freq.compat``, fix 2), because a file is trusted by its content, never by its
path.

Rebuilding a checkpoint's dataset (``restore_model``) reads only the atomic files: RecBole's
pickled dataset and dataloader caches are never read (``recbole_freq.compat``, fix 8), and
cache paths named in the checkpoint's config are dropped with a warning.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from recbole_freq.checkpoint.safe_pickle import (
    allowed_globals,
    pickled_globals,
    restricted_pickle_module,
    torch_weights_only_globals,
)
from recbole_freq.checkpoint.schema import CheckpointError, checked
from recbole_freq.compat import UntrustedCheckpointError

__all__ = [
    "CheckpointError",
    "UntrustedCheckpointError",
    "load_checkpoint",
    "describe_checkpoint",
    "restore_model",
    "verify_archive",
    "weights_fingerprint",
    "pickled_globals",
    "allowed_globals",
]


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict:
    """Load a RecBole checkpoint safely (see the module docstring) onto ``map_location``.

    Raises ``FileNotFoundError`` for a missing file, ``CheckpointError`` for a file that
    is not a RecBole checkpoint and ``UntrustedCheckpointError`` for one that names
    anything outside the allowlist.
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint {str(path)!r} does not exist (RecBole writes them to "
            "checkpoint_dir, saved/ by default)"
        )
    verify_archive(path)
    names = pickled_globals(path)
    if all(f"{module}.{name}" in torch_weights_only_globals() for module, name in names):
        # The plugin's plain form: torch's own weights-only loader, nothing of ours.
        loader = {"weights_only": True}
    else:
        # RecBole's own form (a pickled Config): the restricted unpickler, whose first
        # refusal point is the globals the stream names, found without unpickling.
        loader = {"pickle_module": restricted_pickle_module(allowed_globals(names))}
        loader["weights_only"] = False  # only because a pickle_module is given
    try:
        raw = torch.load(path, map_location=map_location, **loader)
    except UntrustedCheckpointError:
        raise
    except Exception as error:
        raise CheckpointError(f"cannot read checkpoint {str(path)!r}: {error}") from error
    checkpoint = checked(raw, path)
    state = checkpoint["state_dict"]
    broken = [
        name
        for name, value in state.items()
        if value.is_floating_point() and not bool(torch.isfinite(value).all())
    ]
    if broken:
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds non-finite weights (NaN or infinity) in "
            f"{', '.join(broken[:5])}{' ...' if len(broken) > 5 else ''}: the training run "
            "diverged or the file was damaged; use another checkpoint"
        )
    return checkpoint


def verify_archive(path: str | os.PathLike) -> None:
    """``CheckpointError`` unless every record of the ``torch.save`` archive matches the
    CRC-32 that ``torch.save`` stored for it (a flipped bit anywhere, weights included,
    is caught here; torch's own reader does not check)."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except zipfile.BadZipFile as error:
        raise CheckpointError(
            f"{str(path)!r} is not a checkpoint written by torch.save (not a zip archive: "
            f"{error}); only RecBole .pth checkpoints are accepted"
        ) from error
    except (OSError, EOFError, ValueError, RuntimeError) as error:  # zlib and read errors
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read: {error}") from error
    if damaged is not None:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is damaged: record {damaged!r} does not match its "
            "CRC-32 (corrupted on disk or in transfer); use another copy"
        )


def weights_fingerprint(state_dict: dict) -> str:
    """sha256 of a model's weights (names, dtypes, shapes and values, in name order): the
    same weights give the same fingerprint however the file around them was written."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class CheckpointMismatchError(ValueError):
    """A checkpoint whose weights do not fit the dataset it is being used with."""


def restore_model(path, data_path=None, device="cpu", adjust=None):
    """Rebuild a trained model and its data from a checkpoint, loaded safely.

    The dataset is rebuilt from the checkpoint's own config (same dataset name, filters,
    split and ``MAX_ITEM_LIST_LENGTH``) with RecBole's ``create_dataset`` and
    ``data_preparation``; ``data_path`` (the folder that holds ``<dataset>/``) replaces
    the path recorded at training time.  Every weight of the checkpoint must fit the model
    built on that dataset (same names and shapes, e.g. as many item embeddings as the
    dataset has items), else ``CheckpointMismatchError`` says what differs.

    ``adjust(config)``: called before the data is loaded, to change how the model is
    evaluated (``recbole_freq.jobs.evaluate``).

    Returns ``(model, config, dataset, (train_data, valid_data, test_data), checkpoint)``;
    the model is in evaluation mode on ``device``.
    """
    from recbole_freq.config.configurator import parse_device
    from recbole_freq.data.guard import check_prepared
    from recbole_freq.quick_start.quick_start import load_splits, new_model

    checkpoint = load_checkpoint(path)
    config = checkpoint["config"]
    _drop_pickled_cache_settings(config, path)
    in_one_process(config)
    _check_sizes_before_building(config, checkpoint["state_dict"], path)
    checkpoint["weights_sha256"] = weights_fingerprint(checkpoint["state_dict"])
    _compare_with_run_summary(path, checkpoint["weights_sha256"])
    if data_path is not None:
        config["data_path"] = os.path.join(str(data_path), config["dataset"])
    config["device"] = parse_device(device)
    config["show_progress"] = False
    if adjust is not None:
        adjust(config)
    check_prepared(config)
    _check_same_data(config, path)
    dataset, loaders = load_splits(config)
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
    from recbole_freq.protocol import protocol_label

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

    summary_file = Path(path).with_suffix(".json")
    try:
        recorded = json.loads(summary_file.read_text(encoding="utf-8")).get("weights_sha256")
    except (OSError, ValueError, AttributeError):
        return
    if recorded and recorded != fingerprint:
        print(
            f"warning: checkpoint {str(path)!r} holds weights {fingerprint[:16]}, but its run "
            f"summary {summary_file} recorded {recorded[:16]}: the file was replaced after "
            "the run",
            file=sys.stderr,
        )


def _check_same_data(config, path) -> None:
    """The dataset must be the one the checkpoint was trained on, not another one
    prepared under the same name since."""
    from recbole_freq.data.guard import dataset_fingerprint

    recorded = config["dataset_sha256"]
    if not recorded:
        return  # written before fingerprints were recorded
    current = dataset_fingerprint(config)
    if current != recorded:
        raise CheckpointMismatchError(
            f"checkpoint {str(path)!r} was trained on dataset {config['dataset']!r} with "
            f"sha256 {recorded[:16]}, but {config['data_path']} now holds sha256 "
            f"{current[:16]}: the dataset was prepared again with other content. Point "
            "--data_path at the data it was trained on."
        )


def in_one_process(config) -> None:
    """The config of a data-parallel run (``--nproc``) as one process's: the checkpoint
    is read here, with no process group, so the loaders must not be sharded."""
    if config["single_spec"] is False:
        config["single_spec"] = True
        config["local_rank"] = 0


def _drop_pickled_cache_settings(config, path) -> None:
    """A checkpoint's config may name pickles to read (``dataset_save_path``,
    ``dataloaders_save_path``): ignored, with a warning, as are its cache-saving switches."""
    import sys

    from recbole_freq.compat import PICKLED_CACHE_PATH_KEYS, PICKLED_CACHE_SAVE_KEYS

    for key in PICKLED_CACHE_PATH_KEYS:
        if config[key]:
            print(
                f"warning: checkpoint {str(path)!r} names {key}={config[key]!r}; ignored "
                "(pickled caches can run code): the dataset is rebuilt from its atomic files",
                file=sys.stderr,
            )
            config[key] = None
    for key in PICKLED_CACHE_SAVE_KEYS:
        config[key] = False


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
