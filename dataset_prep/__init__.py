"""Prepare raw recommendation datasets as RecBole atomic files.

CLI: ``python -m dataset_prep NAME --raw PATH --out DATA_DIR`` (see ``--list``), or
``NAME --download --out DATA_DIR`` for a known dataset (`download`).
Each raw format is a reader module registered in `registry.FORMATS`; raw logs
go through the S3-Rec procedure in `procedure`. Datasets with published
statistics are in `registry.KNOWN_DATASETS`.
"""

from .errors import (
    DatasetPrepError,
    RawFormatError,
    RawInputError,
    StatsMismatchError,
    UsageError,
)
from .pipeline import ConversionResult, convert, convert_one_line
from .registry import (
    FORMATS,
    KNOWN_DATASETS,
    KnownDataset,
    RawFormat,
    download_command,
    prepare_command,
)
from .stats import ExpectedStats, Stats
from .tabular import TableOptions

__all__ = [
    "FORMATS",
    "KNOWN_DATASETS",
    "ConversionResult",
    "DatasetPrepError",
    "ExpectedStats",
    "KnownDataset",
    "RawFormat",
    "RawFormatError",
    "RawInputError",
    "Stats",
    "StatsMismatchError",
    "TableOptions",
    "UsageError",
    "convert",
    "convert_one_line",
    "download_command",
    "prepare_command",
]
