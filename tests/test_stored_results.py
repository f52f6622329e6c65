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


def test_the_indexs_coverage_table_is_what_the_run_files_give():
    """benchmarks/results/README.md's coverage of the papers' tables is derived from the
    stored run files (benchmarks/coverage.py); a run stored or removed without
    regenerating it makes the index wrong."""
    import importlib.util

    script = RESULTS.parent / "coverage.py"
    spec = importlib.util.spec_from_file_location("coverage_table", script)
    coverage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(coverage)
    block = coverage.readme_block((RESULTS / "README.md").read_text(encoding="utf-8"))
    assert block == coverage.coverage_markdown(), "run: python benchmarks/coverage.py --write"
    # docs/models.md's "Should I trust model X?" lines come from the same files.
    assert coverage.main(["--check"]) == 0


def test_a_run_from_before_a_default_changed_is_labelled_with_what_it_ran():
    """PolyRec's stored Beauty run predates ``trc_skip`` and ran the reading ``truncated``,
    today a variant: the index must not present it as today's ``--paper`` PolyRec."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("coverage_table", RESULTS.parent / "coverage.py")
    coverage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(coverage)
    rows = [
        line for line in coverage.coverage_markdown().splitlines() if "| PolyRec | 1 (42)" in line
    ]
    assert rows and all("yes (of its day: trc_skip truncated)" in row for row in rows)
