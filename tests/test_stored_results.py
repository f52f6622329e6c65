"""The run files published under ``benchmarks/results/`` stay readable by the comparison
that made them: each is whole (its digest matches), holds metrics that can be
measurements, and records the run its name says."""

import re
from pathlib import Path

import pytest

from recbole_freq.jobs.compare.runs import load_run

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
RUN_FILES = sorted(RESULTS.glob("**/runs/*.json"))


def test_results_hold_run_files():
    assert len(RUN_FILES) >= 77


@pytest.mark.parametrize("path", RUN_FILES, ids=lambda p: str(p.relative_to(RESULTS)))
def test_a_stored_run_file_is_whole_and_records_its_place(path):
    entry, seed = re.fullmatch(r"(.+)-seed(-?\d+)\.json", path.name).groups()
    record = load_run(path, entry, int(seed))
    assert record["digest"]
