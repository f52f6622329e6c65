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
it (``schema.checked``), and the config is rebuilt from plain values.

Before anything is unpickled, the file's pickle stream is scanned (parsed, not run) for
the globals it names; a checkpoint naming anything else is refused with
``UntrustedCheckpointError`` and is never unpickled.  No checkpoint is ever unpickled
in full, not even one this process wrote: RecBole's trainer loads through this module too
(``recbole_freq.compat.trainer``, fix 2), because a file is trusted by its content, never by its
path.

Rebuilding a model and its data from a checkpoint is ``recbole_freq.quick_start.restore``.
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
from recbole_freq.checkpoint.schema import CheckpointError, UntrustedCheckpointError, checked

__all__ = [
    "CheckpointError",
    "UntrustedCheckpointError",
    "load_checkpoint",
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

    from recbole_freq.utils.inputs import check_input_file

    path = Path(path)
    if path.exists():
        check_input_file(path, "checkpoint", limit=1 << 40)  # a pipe would never end
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


def in_one_process(config) -> None:
    """The config of a data-parallel run (``--nproc``) as one process's: the checkpoint
    is read here, with no process group, so the loaders must not be sharded."""
    if config["single_spec"] is False:
        config["single_spec"] = True
        config["local_rank"] = 0


def drop_pickled_cache_settings(config, path) -> None:
    """A checkpoint's config may name pickles to read (``dataset_save_path``,
    ``dataloaders_save_path``): ignored, with a warning, as are its cache-saving switches."""
    import sys

    from recbole_freq.compat.data import PICKLED_CACHE_PATH_KEYS, PICKLED_CACHE_SAVE_KEYS

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
