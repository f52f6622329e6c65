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
    from dataset_prep import KNOWN_DATASETS, DatasetPrepError, download_command, prepare_command

    try:
        if dataset in KNOWN_DATASETS:
            return (
                f"{download_command(dataset, data_root)}\n    or, from a file you "
                f"have: {prepare_command(dataset, data_root, alternative=False)}"
            )
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


def inter_files(config) -> list[str]:
    """The interaction files a run reads: ``<dataset>.inter``, or with
    ``benchmark_filename`` (a pre-split dataset) ``<dataset>.<part>.inter`` per part."""
    parts = config["benchmark_filename"]
    names = [f"{config['dataset']}.{part}.inter" for part in parts] if parts else None
    return [
        os.path.join(config["data_path"], name) for name in names or [f"{config['dataset']}.inter"]
    ]


def inter_columns(path, separator=None) -> list[str]:
    """The column names of an atomic file's header (``user_id:token`` -> ``user_id``)."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        header = handle.readline().rstrip("\r\n").split(separator or "\t")
    return [column.split(":")[0] for column in header]


def check_prepared(config) -> str:
    """Path of the dataset's (first) interaction file; ``DatasetNotPreparedError`` if one
    is absent."""
    files = inter_files(config)
    if config["benchmark_filename"]:
        missing = [path for path in files if not os.path.isfile(path)]
        if missing:
            raise DatasetNotPreparedError(
                f"benchmark_filename {list(config['benchmark_filename'])}: {missing[0]} does "
                f"not exist; a pre-split dataset needs one file per part in {config['data_path']}"
            )
    elif not os.path.isfile(files[0]):
        raise not_prepared_error(config["dataset"], config["data_path"])
    return files[0]


ATOMIC_SUFFIXES = ("inter", "user", "item", "kg", "link", "net")


def dataset_fingerprint(config) -> str:
    """sha256 over the dataset's atomic files (names and contents): what a model trained
    on them depends on.  Recorded in every run's config (``dataset_sha256``), and so in
    its checkpoint and summary."""
    import hashlib

    digest = hashlib.sha256()
    folder, name = config["data_path"], config["dataset"]
    files = [(suffix, os.path.join(folder, f"{name}.{suffix}")) for suffix in ATOMIC_SUFFIXES]
    if config["benchmark_filename"]:
        files[0:1] = [(os.path.basename(path), path) for path in inter_files(config)]
    for suffix, path in files:
        if not os.path.isfile(path):
            continue
        digest.update(f"{suffix}\0".encode())
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()
