"""Dataset guard: a dataset is used only where it was prepared, never downloaded.

A missing dataset is an error that names the command preparing it (``check_prepared``;
RecBole's own download is replaced by the same error in ``compat``, fix 9), and every
run records a fingerprint of the atomic files it read (``dataset_fingerprint``).
"""

from __future__ import annotations

import os


class DatasetNotPreparedError(FileNotFoundError):
    pass


def _prepare_hint(dataset: str, data_root: str) -> str:
    from dataset_prep import DatasetPrepError, prepare_command

    try:
        return prepare_command(dataset, data_root)
    except DatasetPrepError:
        return f"python -m dataset_prep <name> --raw <raw file> --out {data_root}"


def not_prepared_error(dataset: str, dataset_dir: str) -> DatasetNotPreparedError:
    data_root = os.path.dirname(os.path.normpath(dataset_dir)) or "."
    return DatasetNotPreparedError(
        f"dataset {dataset!r} is not prepared: {os.path.join(dataset_dir, dataset + '.inter')} "
        f"does not exist. Prepare it with:\n    {_prepare_hint(dataset, data_root)}\n"
        "or point --data_path at the folder that holds it. (recbole-freq never lets "
        "RecBole download a dataset: its downloads differ from the papers' data.)"
    )


def check_prepared(config) -> str:
    """Path of the dataset's ``.inter`` file; ``DatasetNotPreparedError`` if it is absent."""
    dataset_dir = config["data_path"]
    inter_file = os.path.join(dataset_dir, f"{config['dataset']}.inter")
    if not os.path.isfile(inter_file):
        raise not_prepared_error(config["dataset"], dataset_dir)
    return inter_file


ATOMIC_SUFFIXES = ("inter", "user", "item", "kg", "link", "net")


def dataset_fingerprint(config) -> str:
    """sha256 over the dataset's atomic files (names and contents): what a model trained
    on them depends on.  Recorded in every run's config (``dataset_sha256``), and so in
    its checkpoint and summary."""
    import hashlib

    digest = hashlib.sha256()
    for suffix in ATOMIC_SUFFIXES:
        path = os.path.join(config["data_path"], f"{config['dataset']}.{suffix}")
        if not os.path.isfile(path):
            continue
        digest.update(f"{suffix}\0".encode())
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()
