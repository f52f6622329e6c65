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


def _coverage_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("coverage_table", RESULTS.parent / "coverage.py")
    coverage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(coverage)
    return coverage


def test_the_indexs_coverage_table_is_what_the_run_files_give():
    """benchmarks/results/README.md's coverage of the papers' tables is derived from the
    stored run files (benchmarks/coverage.py); a run stored or removed without
    regenerating it makes the index wrong."""
    coverage = _coverage_module()
    block = coverage.readme_block((RESULTS / "README.md").read_text(encoding="utf-8"))
    assert block == coverage.coverage_markdown(), "run: python benchmarks/coverage.py --write"
    # docs/models.md's "Should I trust model X?" lines come from the same files.
    assert coverage.main(["--check"]) == 0


def test_a_published_cells_mean_takes_the_seeds_of_one_folder():
    """Two folders holding the same row under different code: the cell's mean is the
    folder with more seeds, never seed 42 of one beside seeds 43-44 of the other."""
    coverage = _coverage_module()
    cell = {"dataset": "lastfm", "row": "BSARec", "protocol": "bsarec"}

    def run(folder, seed, dataset="lastfm"):
        return {
            "dataset": dataset,
            "row": "BSARec",
            "protocol": "bsarec",
            "seed": seed,
            "folder": folder,
        }

    runs = [
        run("a-newer", 42),
        run("b-older", 42),
        run("b-older", 43),
        run("b-older", 44),
        run("a-newer", 43),
        run("c-other", 45, dataset="yelp"),
    ]
    chosen = coverage.cell_runs(cell, runs)
    assert {(r["folder"], r["seed"]) for r in chosen} == {("b-older", s) for s in (42, 43, 44)}
    # a tie goes to the first folder by name, with each seed once
    tied = coverage.cell_runs(cell, runs[:2] + [run("a-newer", 42)])
    assert [(r["folder"], r["seed"]) for r in tied] == [("a-newer", 42)]
    assert coverage.cell_runs(cell, [run("c-other", 45, dataset="yelp")]) == []


def test_a_run_from_before_a_default_changed_is_labelled_with_what_it_ran():
    """PolyRec's stored Beauty run predates ``trc_skip`` and ran the reading ``truncated``,
    today a variant: the index must not present it as today's ``--paper`` PolyRec."""
    coverage = _coverage_module()
    rows = [
        line for line in coverage.coverage_markdown().splitlines() if "| PolyRec | 1 (42)" in line
    ]
    assert rows and all("yes (of its day: trc_skip truncated)" in row for row in rows)


def test_each_rows_departures_from_its_paper_row_are_named():
    """Each folder README's rows block says whether a row was trained as today's --paper
    file trains that paper row, and names every way it was not: a protocol piece (right
    padding), a setting of the file (loss, dropout), an epoch cap that ended it early."""
    import copy
    import json

    coverage = _coverage_module()
    path = RESULTS / "like-with-like-lastfm" / "sasrec-bce" / "runs" / "SASRec-seed42.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    assert coverage.paper_deviations(record) == []
    assert coverage.todays_paper_settings(record)[1] == "properties/paper/SASRec/lastfm.yaml"

    changed = copy.deepcopy(record)
    summary = changed["summary"]
    summary["protocol"]["label"] += "+sequence_layout=right"
    summary["protocol"]["train_loss"] = "model"
    summary["config"]["hidden_dropout_prob"] = 0.2
    summary["config"]["epochs"] = summary["epochs_run"] = summary["best_epoch"] + 1
    assert coverage.paper_deviations(changed) == [
        "protocol bsarec+sequence_layout=right (paper bsarec)",
        "train_loss model (paper bce)",
        "hidden_dropout_prob 0.2 (paper 0.5)",
        f"capped at {summary['epochs_run']} epochs, before its patience ended it",
    ]

    # Under Rec-Denoiser's protocol SASRec's paper row is RecDenoiser's backbone.
    path = RESULTS / "recdenoiser-paper-lastfm" / "runs" / "SASRec-seed2020.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    settings, source = coverage.todays_paper_settings(record)
    assert source == "properties/paper/RecDenoiser/lastfm.yaml (RecDenoiser's backbone)"
    assert "jacobian_gamma" not in settings
    assert coverage.paper_deviations(record) == [
        "protocol sasrec+sequence_layout=right (paper sasrec)"
    ]


def test_every_folder_with_runs_has_its_rows_block():
    coverage = _coverage_module()
    blocks = coverage.folder_row_blocks()
    for runs in RESULTS.glob("**/runs"):
        folder = runs.parent.relative_to(RESULTS).as_posix()
        readme = coverage.readme_of(folder)
        assert f"`{folder}`" in blocks[readme]
        assert f"`{folder}`" in blocks[RESULTS / "README.md"]
        text = readme.read_text(encoding="utf-8")
        assert coverage.readme_block(text, coverage.ROWS_START, coverage.ROWS_END) == blocks[readme]
