"""A paper's table in one command: ``--compare`` over several datasets, its runs packed
onto the machine (``--parallel``), stopped at a time limit and continued, and the models
x datasets table beside the published figures.  Real runs on the tiny datasets."""

import csv
import json
from pathlib import Path

import pytest

from recbole_freq.cli import main
from recbole_freq.cli.common import TIME_LIMIT_EXIT
from recbole_freq.jobs.compare import Execution, compare
from recbole_freq.jobs.compare.grid import grid_csv_text, grid_markdown


def overrides_of(small_config, **changes):
    return {key: value for key, value in {**small_config, **changes}.items() if key != "seed"}


def cli_args(config: dict) -> list[str]:
    return [f"--{key}={value}" for key, value in config.items()]


def grid_rows(out: Path) -> list[dict]:
    with open(out / "grid.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def test_packed_grid_gives_the_numbers_of_one_run_after_another(small_config, tmp_path, capsys):
    """Two models x two datasets packed two at a time, one thread each, against the same
    grid trained one after another in this process with one thread: every metric equal,
    each dataset's own table written, the grid holding each dataset as a column."""
    overrides = overrides_of(small_config, epochs=1)
    grid = ["--compare", "SASRec,BSARec", "--dataset=tiny,wide", "--seeds", "3"]
    packed = [*grid, "--out", str(tmp_path / "packed"), "--parallel", "2"]
    assert main([*packed, "--threads_per_run", "1", *cli_args(overrides)]) == 0
    printed = capsys.readouterr().out
    in_order = [*grid, "--out", str(tmp_path / "in-order"), "--torch_threads=1"]
    assert main([*in_order, *cli_args(overrides)]) == 0

    assert "4 run(s), 2 at once, 1 thread(s) each" in printed
    for model in ("SASRec", "BSARec"):
        for dataset in ("tiny", "wide"):
            assert f"start    {model} on {dataset}, seed 3 [" in printed
            assert f"done     {model} on {dataset}, seed 3: 1 epochs, best valid" in printed
    packed_rows, in_order_rows = grid_rows(tmp_path / "packed"), grid_rows(tmp_path / "in-order")
    assert len(packed_rows) == 2 * 2 * 6 and packed_rows == in_order_rows
    for dataset in ("tiny", "wide"):
        runs = {
            folder: json.loads(
                (tmp_path / folder / dataset / "runs" / "BSARec-seed3.json").read_text()
            )["summary"]
            for folder in ("packed", "in-order")
        }
        assert runs["packed"]["test_result"] == runs["in-order"]["test_result"]
        packed = runs["packed"]["environment"]
        assert (
            packed["torch_threads"] == 1 and packed["torch_threads_set_by"] == "--threads_per_run"
        )
        # Spawned workers inherit the passive OpenMP wait policy (utils/threads.py).
        assert packed["omp_wait_policy"] == runs["in-order"]["environment"]["omp_wait_policy"]
        assert (
            packed["omp_wait_policy_set_by"]
            == runs["in-order"]["environment"]["omp_wait_policy_set_by"]
        )
        assert (tmp_path / "packed" / dataset / "comparison.md").is_file()
    table = (tmp_path / "packed" / "grid.md").read_text()
    assert "| model | tiny | wide |" in table and table in printed
    mean = float(next(r["mean"] for r in packed_rows if r["model"] == "SASRec"))
    assert f"| SASRec | {mean:.4f} |" in table  # one seed: no ± part


def test_time_limit_stops_runs_and_the_same_command_continues_them_exactly(
    small_config, tmp_path, capsys
):
    """Under a time limit the run stops at an epoch boundary with its resume state and
    the one after it waits (exit code 3, the command to continue); the same command
    without the limit then ends both runs with the metrics of an uninterrupted grid."""
    # 60 tiny epochs, each with its validation, take seconds on any machine: the 2 s
    # limit stops the first run (or comes before it starts), the second waits
    overrides = overrides_of(small_config, epochs=60, stopping_step=1000)
    grid = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "4,5"]
    args = [*grid, "--out", str(tmp_path / "limited"), *cli_args(overrides)]
    assert main([*args, "--time_limit", "2s"]) == TIME_LIMIT_EXIT
    captured = capsys.readouterr()
    assert "stopped  SASRec on tiny, seed 4 at the time limit" in captured.out or (
        "waiting  SASRec on tiny, seed 4: not started, the time limit came first" in captured.out
    )
    # once a run has stopped at the limit, the next does not start (its first epoch
    # would most likely end after the limit too)
    assert "waiting  SASRec on tiny, seed 5: not started, the time limit came first" in (
        captured.out
    )
    assert "Continue with:" in captured.err and "--time_limit" in captured.err
    assert not list((tmp_path / "limited" / "runs").glob("*.json"))
    unfinished = (tmp_path / "limited" / "unfinished.md").read_text()
    assert "Not started: " in unfinished and "SASRec, seed 5" in unfinished

    assert main(args) == 0
    assert not (tmp_path / "limited" / "unfinished.md").exists()
    continued = capsys.readouterr().out
    assert "stopped" not in captured.out or (
        "start    SASRec on tiny, seed 4 (continues at epoch " in continued
    )
    assert not list((tmp_path / "limited" / "partial").glob("*.resume.pth"))
    # the run that was stopped and continued ends as an uninterrupted one (seed 5 began
    # only after the limit was lifted)
    compare("SASRec", "tiny", seeds="4", overrides=overrides, out=tmp_path / "whole", log=print)
    runs = [
        json.loads((tmp_path / f / "runs" / "SASRec-seed4.json").read_text())["summary"]
        for f in ("limited", "whole")
    ]
    assert runs[0]["test_result"] == runs[1]["test_result"]
    assert runs[0]["epochs_run"] == runs[1]["epochs_run"] == 60
    assert (tmp_path / "limited" / "runs" / "SASRec-seed5.json").is_file()


def test_packed_runs_stop_at_the_time_limit_with_their_resume_states(small_config, tmp_path):
    overrides = overrides_of(small_config, epochs=400, stopping_step=1000)
    result = compare(
        "SASRec", "tiny", seeds="6,7", overrides=overrides, out=tmp_path / "cmp",
        execution=Execution(parallel=2, threads_per_run=1, time_limit=6), log=print,
    )  # fmt: skip
    assert not result["complete"] and not result["trained"]
    assert sorted(result["stopped"] + result["not_started"]) == [("SASRec", 6), ("SASRec", 7)]
    kept = sorted(p.name for p in (tmp_path / "cmp" / "partial").glob("*.resume.pth"))
    assert kept == sorted(f"SASRec-seed{seed}.resume.pth" for _, seed in result["stopped"])


def test_a_deterministic_packed_run_gets_the_threads_it_was_given(small_config, tmp_path):
    """``--threads_per_run 2`` with ``deterministic: True`` (as ``--paper`` sets): the
    run pins the 2 threads it was given, not 1 (a lent GPU's packed --paper runs
    recorded 1 thread where 2 were asked), and its file records them."""
    overrides = overrides_of(small_config, epochs=1, deterministic=True)
    compare(
        "SASRec", "tiny", seeds="4", overrides=overrides, out=tmp_path / "cmp",
        execution=Execution(parallel=1, threads_per_run=2), log=print,
    )  # fmt: skip
    summary = json.loads((tmp_path / "cmp" / "runs" / "SASRec-seed4.json").read_text())["summary"]
    assert summary["environment"]["torch_threads"] == 2
    assert summary["environment"]["deterministic_algorithms"] is True


def test_runs_stored_elsewhere_table_together_but_not_on_other_data(
    small_config, tmp_path, tiny_data
):
    """Where runs wrote their checkpoints and read their data does not decide their
    numbers: a grid continued with another checkpoint_dir or data_path keeps its stored
    runs; data that differ (another fingerprint) are refused."""
    import shutil

    from recbole_freq.jobs.compare import ComparisonError

    overrides = overrides_of(small_config, epochs=1)
    out = tmp_path / "cmp"
    compare("SASRec", "tiny", seeds="8", overrides=overrides, out=out, log=print)
    copy = tmp_path / "copy"
    shutil.copytree(tiny_data / "tiny", copy / "tiny")
    moved = dict(overrides, checkpoint_dir=str(tmp_path / "elsewhere"), data_path=str(copy))
    again = compare("SASRec", "tiny", seeds="8", overrides=moved, out=out, log=print)
    assert again["trained"] == [] and again["skipped"] == [("SASRec", 8)]
    inter = copy / "tiny" / "tiny.inter"
    lines = inter.read_text().splitlines()
    inter.write_text("\n".join(lines[:-1]) + "\n")
    (copy / "tiny" / "tiny.stats.json").unlink()
    with pytest.raises(ComparisonError, match="the data"):
        compare("SASRec", "tiny", seeds="8", overrides=moved, out=out, log=print)


def _record(label: str, results: dict) -> dict:
    return {"summary": {"protocol": {"label": label}, "test_result": results}}


def test_grid_puts_the_papers_figures_and_our_difference_under_each_model():
    """The BSARec Table 2 figures of ``properties/reference/lastfm.yaml`` beside a grid
    cell made under their protocol; a dataset without figures, and a cell still
    missing seeds, say so."""
    stored = {
        "lastfm": {
            ("BSARec", 1): _record("bsarec", {"ndcg@20": 0.0500}),
            ("BSARec", 2): _record("bsarec", {"ndcg@20": 0.0540}),
            ("SASRec", 1): _record("bsarec", {"ndcg@20": 0.0430}),
        },
        "other": {("BSARec", 1): _record("bsarec", {"ndcg@20": 0.0300})},
    }
    table = grid_markdown(
        stored, ["SASRec", "BSARec"], [1, 2], ["ndcg@20"], {"lastfm": "a", "other": "b"}
    )
    assert "| BSARec | 0.0520 ± 0.0028 | 0.0300 (1 of 2 seeds) |" in table
    assert "| SASRec | 0.0430 (1 of 2 seeds) | not run yet |" in table
    assert "| BSARec, paper | 0.0526 |  |" in table
    assert f"| ours vs paper | {(0.052 - 0.0526) / 0.0526:+.1%} |  |" in table
    assert "| BSARec, authors' code here | 0.0507 |  |" in table
    # a named variant gets its own row and figures (BSARec Table 7); a model trained with
    # another loss than the paper's row gets none
    stored["lastfm"][("BSARec@variant=only-self-attention", 1)] = _record(
        "bsarec", {"hit@20": 0.09}
    )
    stored["lastfm"][("SASRec@train_loss=model", 1)] = _record("bsarec", {"hit@20": 0.10})
    entries = ["SASRec@train_loss=model", "BSARec@variant=only-self-attention"]
    table = grid_markdown(stored, entries, [1], ["hit@20"], {"lastfm": "a", "other": "b"})
    assert "| BSARec [only-self-attention] | 0.0900 | not run yet |" in table
    assert "| BSARec [only-self-attention], paper, Table 7 | 0.0899 |  |" in table
    assert "| SASRec@train_loss=model | 0.1000 | not run yet |" in table
    assert "SASRec@train_loss=model, paper" not in table
    rows = list(csv.DictReader(grid_csv_text(stored, ["BSARec"], [1, 2], ["ndcg@20"]).splitlines()))
    paper = next(r for r in rows if r["dataset"] == "lastfm" and r["source"] == "paper")
    assert float(paper["figure"]) == 0.0526 and paper["seeds"] == "2"
    assert float(paper["difference"]) == pytest.approx((0.052 - 0.0526) / 0.0526)


BAD_GRIDS = [
    (["--parallel", "0"], "--parallel 0: give 1 or more"),
    (["--parallel", "many"], "--parallel 'many': give a number"),
    (["--threads_per_run", "2"], "--threads_per_run sets the threads of --parallel runs"),
    (["--parallel", "2", "--ray"], "with --ray the cluster packs them"),
    (["--parallel", "4096", "--threads_per_run", "4096"], "the runs would fight over them"),
    (["--time_limit", "soon"], "'soon' is not a duration"),
    (["--time_limit", "0"], "give a positive duration"),
    (["--time_limit", "1h", "--nproc=2"], "--time_limit stops each run with its resume state"),
    (["--dataset=tiny,tiny"], "--dataset lists an entry twice"),
    (["--dataset=tiny,not-there"], "dataset 'not-there' is not prepared"),
]


@pytest.mark.parametrize("args,message", BAD_GRIDS, ids=[m for _, m in BAD_GRIDS])
def test_bad_grid_input_is_one_clear_line_before_training(
    small_config, tmp_path, capsys, args, message
):
    base = [] if any(a.startswith("--dataset") for a in args) else ["--dataset=tiny"]
    code = main(
        ["--compare", "SASRec", *base, *args, "--out", str(tmp_path / "cmp"),
         *cli_args(overrides_of(small_config))]
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "cmp").exists()


def test_no_run_starts_once_one_has_stopped_at_the_limit():
    """A run stops when its next epoch would end after the limit, up to an epoch before
    it: a run started in that time would train a whole first epoch past the limit."""
    import time

    from recbole_freq.jobs.compare.execution import Outcome, limit_reached

    later = time.time() + 3600
    assert not limit_reached(None, Outcome(stopped=[("SASRec", 1)]))
    assert not limit_reached(later, Outcome(trained=[("SASRec", 1)]))
    assert limit_reached(later, Outcome(stopped=[("SASRec", 1)]))
    assert limit_reached(time.time() - 1, Outcome())
