"""Dataset guard: a dataset is used only where it was prepared, never downloaded.

A missing dataset is an error that names the command preparing it (``check_prepared``;
RecBole's own download is replaced by the same error in ``compat``, fix 9), and every
run records a fingerprint of the atomic files it read (``dataset_fingerprint``), which
whatever continues or reuses the run checks first (``check_recorded_dataset``).
"""

from __future__ import annotations

import os

from dataset_prep.atomic import file_sha256


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


def inter_header(path, separator=None) -> list[str]:
    """The fields of an atomic file's header as declared (``user_id:token``)."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.readline().rstrip("\r\n").split(separator or "\t")


def inter_columns(path, separator=None) -> list[str]:
    """The column names of an atomic file's header (``user_id:token`` -> ``user_id``)."""
    return [column.split(":")[0] for column in inter_header(path, separator)]


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
    else:
        check_files_agree(config["data_path"], config["dataset"])
    return files[0]


class DatasetInconsistentError(ValueError):
    """A prepared dataset whose files do not belong together."""


def check_files_agree(folder: str, name: str) -> None:
    """The files ``dataset_prep`` wrote together must still be the ones its manifest
    (``<name>.stats.json``, renamed into place last) records: a preparation killed
    between its renames leaves a new ``.inter`` beside the old id map, and a model
    trained on it would recommend the other log's raw ids.  A folder without a manifest
    (atomic files made by hand) has nothing to check against."""
    import json

    from recbole_freq.utils.inputs import read_input_text

    stats_path = os.path.join(folder, f"{name}.stats.json")
    if not os.path.isfile(stats_path):
        return
    try:
        stats = json.loads(read_input_text(stats_path, "manifest"))
    except (OSError, ValueError, RecursionError):
        stats = None
    if not isinstance(stats, dict) or not isinstance(stats.get("inter_sha256"), str):
        raise DatasetInconsistentError(
            f"{stats_path} is damaged or not dataset_prep's: prepare {name!r} again "
            "(python -m dataset_prep ... --force), or remove it if you made the files yourself"
        )
    problem = _disagreement(folder, name, stats)
    if problem:
        raise DatasetInconsistentError(
            f"dataset {name!r} in {folder}: {problem}; a preparation was interrupted or a file "
            "was changed by hand. Prepare it again (python -m dataset_prep ... --force), or "
            f"delete {name}.stats.json to use files you edited on purpose"
        )


def _disagreement(folder: str, name: str, stats: dict) -> str | None:
    inter = os.path.join(folder, f"{name}.inter")
    if file_sha256(inter) != stats["inter_sha256"]:
        return f"{name}.inter is not the file {name}.stats.json records"
    idmap = os.path.join(folder, f"{name}.idmap.json")
    recorded_map = stats.get("idmap_file")
    if recorded_map is None and os.path.lexists(idmap):
        return f"{name}.idmap.json is left from another preparation (its manifest names none)"
    if recorded_map is not None and not os.path.isfile(idmap):
        return f"{name}.idmap.json, which {name}.stats.json names, is missing"
    recorded_sha = stats.get("idmap_sha256")
    if recorded_map is not None and recorded_sha and file_sha256(idmap) != recorded_sha:
        return f"{name}.idmap.json is not the id map {name}.stats.json records"
    return None


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


class DatasetChangedError(ValueError):
    """Data that is not the data a checkpoint or resume state was trained on."""


TRUST_DATA_OPTION = "--trust_data"


def check_recorded_dataset(
    config,
    recorded,
    source: str,
    advice: str,
    trust_data=False,
    error=DatasetChangedError,
    trust_option: bool = True,
) -> None:
    """``recorded`` (a checkpoint's or resume state's ``dataset_sha256``) must be the
    fingerprint of the dataset ``config`` points at: same-shaped data with the items
    permuted would otherwise give other recommendations with the same scores.  A file
    that records none (written by RecBole itself, before the plugin recorded them, or
    edited) proves nothing and is refused unless ``trust_data`` (``trust_option``: whether
    the caller's command has ``--trust_data`` to advise)."""
    check_prepared(config)
    if not recorded:
        if trust_data:
            return
        way_out = (
            f"pass {TRUST_DATA_OPTION} to use it anyway"
            if trust_option
            else advice  # a job without that option (--compare): the caller's advice
        )
        raise error(
            f"{source} records no dataset fingerprint (dataset_sha256), so nothing shows "
            f"that {config['data_path']} holds the data it was trained on; {way_out}"
        )
    current = dataset_fingerprint(config)
    if current != recorded:
        raise error(
            f"{source} was trained on dataset {config['dataset']!r} with sha256 "
            f"{recorded[:16]}, but {config['data_path']} now holds sha256 {current[:16]}: the "
            f"dataset was prepared again with other content. {advice}"
        )
