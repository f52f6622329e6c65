"""RecBole's datasets: built from their atomic files only, never downloaded for a plugin
run, real times kept exact.

8. RecBole's ``create_dataset`` and ``data_preparation`` ``pickle.load`` the files
   ``<checkpoint_dir>/<dataset>-<DatasetClass>.pth`` and
   ``<checkpoint_dir>/<dataset>-for-<model>-dataloader.pth`` whenever they exist, and
   whatever ``dataset_save_path`` / ``dataloaders_save_path`` name: any pickle dropped
   into ``saved/`` runs its code in the next run on that dataset.  The replacements build
   the dataset from its atomic files every time and never read a pickle.  A config that
   names a cache to read (``dataset_save_path``, ``dataloaders_save_path``) is refused with
   ``PickledCacheRefused``; ``save_dataset`` / ``save_dataloaders`` are ignored with a
   warning (a cache that is never read is only a trap for other tools).  No RecBole issue
   found.  Tests: ``test_untrusted_files.test_pickled_caches_*``, ``*_pickled_cache_*``.

9. RecBole's ``Dataset._download`` fetches its own version of any dataset whose folder is
   missing, and several of its names (``ml-1m``, ``yelp``, ``lastfm`` ...) denote data
   that differ from the papers' preprocessed sets: a silently different dataset would
   make every number wrong.  For a run of the plugin (its config a ``FreqConfig``) the
   replacement raises ``data.DatasetNotPreparedError``, which names the ``dataset_prep``
   command that prepares it; a program's own ``run_recbole`` in the same process keeps
   RecBole's download.  Tests: ``test_recbole_never_downloads_a_missing_dataset``,
   ``test_recbole_habits.test_a_programs_own_recbole_run_may_download_but_a_plugin_run_never``.

19. ``Dataset._dataframe_to_interaction`` turns every float column into a float32 tensor,
    which holds integers exactly only up to 2**24: unix seconds (about 1.7e9) come out
    rounded to multiples of 128 s, so the real times that time-aware models read their
    intervals from lost every gap under two minutes.  The column ``REAL_TIME_FIELD`` (the
    ``real_time`` seconds of ``dataset_prep``) is kept in float64; every other column,
    the time order (``TIME_FIELD``) included, is loaded as RecBole loads it, so no split
    changes.  No RecBole issue found.  Test:
    ``test_tisasrec.test_real_times_reach_tisasrec_to_the_second``.
"""

from __future__ import annotations

import functools
import logging
import sys

import numpy as np

from recbole_freq.compat.import_hooks import when_imported
from recbole_freq.compat.plugin_parts import part


class PickledCacheRefused(ValueError):
    """A config names a pickled dataset or dataloader cache to read (fix 8)."""


PICKLED_CACHE_PATH_KEYS = ("dataset_save_path", "dataloaders_save_path")


PICKLED_CACHE_SAVE_KEYS = ("save_dataset", "save_dataloaders")


def refuse_pickled_cache_paths(config) -> None:
    """``PickledCacheRefused`` if ``config`` names a pickled cache to read (fix 8)."""
    named = [key for key in PICKLED_CACHE_PATH_KEYS if config[key]]
    if named:
        raise PickledCacheRefused(
            f"{' and '.join(f'{key}={config[key]!r}' for key in named)}: recbole-freq never "
            "reads pickled dataset or dataloader caches (unpickling a file can run any code "
            "in it); remove the setting, the dataset is rebuilt from its atomic files"
        )


def _recbole_dataset_class(config):
    """The dataset class RecBole's ``create_dataset`` picks for ``config``."""
    import importlib

    from recbole.utils import ModelType

    dataset_module = importlib.import_module("recbole.data.dataset")
    if hasattr(dataset_module, config["model"] + "Dataset"):
        return getattr(dataset_module, config["model"] + "Dataset")
    by_type = {
        ModelType.GENERAL: "Dataset",
        ModelType.SEQUENTIAL: "SequentialDataset",
        ModelType.CONTEXT: "Dataset",
        ModelType.KNOWLEDGE: "KnowledgeBasedDataset",
        ModelType.TRADITIONAL: "Dataset",
        ModelType.DECISIONTREE: "Dataset",
    }
    return getattr(dataset_module, by_type[config["MODEL_TYPE"]])


def _warn_cache_not_saved(config, key: str) -> None:
    if config[key]:
        logging.getLogger().warning(
            f"{key}=True is ignored: recbole-freq never reads pickled caches (they can run "
            "code), so it does not write them either"
        )


def create_dataset_from_atomic_files(config):
    """RecBole's ``create_dataset`` without its pickled cache (fix 8)."""
    refuse_pickled_cache_paths(config)
    _warn_cache_not_saved(config, "save_dataset")
    return _recbole_dataset_class(config)(config)


def _no_pickled_dataloaders(config):
    refuse_pickled_cache_paths(config)
    return None  # data_preparation then splits the dataset itself


def _warn_dataloaders_not_saved(config, dataloaders=None):
    _warn_cache_not_saved(config, "save_dataloaders")


def never_read_pickled_caches() -> None:
    when_imported("recbole.data.utils", _patch_data_utils)


def _patch_data_utils(data_utils) -> None:
    replacements = {
        "create_dataset": create_dataset_from_atomic_files,
        "load_split_dataloaders": _no_pickled_dataloaders,
        "save_split_dataloaders": _warn_dataloaders_not_saved,
    }
    # Every module that imported one of them by name (recbole.data, its quick-start ...).
    originals = {name: getattr(data_utils, name) for name in replacements}
    for module in list(sys.modules.values()):
        for name, replacement in replacements.items():
            if getattr(module, name, None) is originals[name]:
                setattr(module, name, replacement)


def keep_real_times_in_float64() -> None:
    when_imported("recbole.data.dataset.dataset", _patch_dataframe_to_interaction)


def _patch_dataframe_to_interaction(dataset_module) -> None:
    import torch

    Dataset = dataset_module.Dataset
    original = Dataset._dataframe_to_interaction

    @functools.wraps(original)
    def _dataframe_to_interaction(self, data):
        interaction = original(self, data)
        field = self.config["REAL_TIME_FIELD"]
        if field and field in data and field in interaction.interaction:
            exact = data[field].to_numpy(dtype=np.float64)
            interaction.interaction[field] = torch.from_numpy(exact.copy())
        return interaction

    Dataset._dataframe_to_interaction = _dataframe_to_interaction


def never_download_datasets() -> None:
    when_imported("recbole.data.dataset.dataset", _patch_download)


def _patch_download(dataset_module) -> None:
    Dataset = dataset_module.Dataset
    recboles_download = Dataset._download

    def _download(dataset):
        refusal = part("download_refusal")(dataset)
        if refusal is None:
            return recboles_download(dataset)  # a program's own RecBole run: its choice
        raise refusal

    _download.__wrapped__ = recboles_download
    Dataset._download = _download
