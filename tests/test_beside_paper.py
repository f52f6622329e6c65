"""``benchmarks/beside_paper.py --seed_means``: the seed means, spreads, gains and paper
differences it prints are those of the stored run files, computed here independently."""

import importlib.util
import json
import re
import statistics
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
RUNS = RESULTS / "frequency-family-lastfm" / "bsarec" / "runs"


def _tool():
    spec = importlib.util.spec_from_file_location(
        "beside_paper", RESULTS.parent / "beside_paper.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _test_values(entry: str, metric: str) -> dict[int, float]:
    values = {}
    for path in RUNS.glob(f"{entry}-seed*.json"):
        seed = int(re.search(r"seed(\d+)", path.name).group(1))
        values[seed] = json.loads(path.read_text())["summary"]["test_result"][metric]
    return values


def _table(tmp_path, capsys, rows, *options) -> dict[str, list[str]]:
    paper = tmp_path / "paper.json"
    paper.write_text(json.dumps({"source": "a test", "rows": rows}))
    argv = [str(RUNS), "--paper", str(paper), "--metrics", "hit@10,ndcg@10", "--seed_means"]
    assert _tool().main(argv + list(options)) == 0
    cells = [_cells(line) for line in capsys.readouterr().out.splitlines()[2:]]
    return {row[0]: row for row in cells}


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_an_entry_row_is_the_mean_and_sample_std_over_its_seeds(tmp_path, capsys):
    rows = _table(tmp_path, capsys, {"TVRec": [0.0853, 0.0484]})
    hits = _test_values("TVRec", "hit@10")
    assert sorted(hits) == [42, 43, 44]
    mean, std = statistics.mean(hits.values()), statistics.stdev(hits.values())
    assert rows["TVRec (ours, bsarec)"][3] == f"{mean:.4f} ± {std:.4f}"
    assert rows["TVRec (ours, bsarec)"][2] == "42, 43, 44"
    difference = rows["difference from the paper (in our seed std)"][3]
    assert difference == f"{(mean - 0.0853) / 0.0853:+.1%} ({(mean - 0.0853) / std:+.1f})"
    # A count model trains nothing: the table says so instead of an epoch count.
    assert rows["TransitionCount (ours, bsarec)"][-1].startswith("no training")


def test_a_gain_is_over_the_reference_seed_by_seed_beside_the_papers(tmp_path, capsys):
    paper_rows = {"TVRec": [0.0853, 0.0484], "BSARec": [0.0807, 0.0435]}
    rows = _table(tmp_path, capsys, paper_rows, "--reference", "BSARec")
    ours, base = _test_values("TVRec", "ndcg@10"), _test_values("BSARec", "ndcg@10")
    gain = statistics.mean(ours.values()) / statistics.mean(base.values()) - 1
    spread = statistics.stdev(ours[seed] / base[seed] - 1 for seed in ours)
    shown = rows["gain of TVRec over BSARec (ours; ± its std over seeds)"][4]
    assert shown == f"{gain * 100:+.1f}% ± {spread * 100:.1f}%"
    assert rows["gain of TVRec over BSARec (paper)"][4] == f"{(0.0484 / 0.0435 - 1) * 100:+.1f}%"
    minus = rows["our gain minus the paper's, points (in the gain's seed std)"][4]
    papers = 0.0484 / 0.0435 - 1
    assert minus == f"{(gain - papers) * 100:+.1f} ({(gain - papers) / spread:+.1f})"


def test_one_seed_shows_its_value_without_a_spread(tmp_path, capsys):
    one = tmp_path / "one"
    one.mkdir()
    for path in RUNS.glob("WEARec-seed42.json"):
        (one / path.name).write_bytes(path.read_bytes())
    paper = tmp_path / "paper.json"
    paper.write_text(json.dumps({"source": "a test", "rows": {}}))
    _tool().main([str(one), "--paper", str(paper), "--metrics", "hit@10", "--seed_means"])
    row = _cells(capsys.readouterr().out.splitlines()[2])
    assert row[3] == f"{_test_values('WEARec', 'hit@10')[42]:.4f}"


def test_a_reference_without_runs_is_one_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit, match="--reference SASRec"):
        _table(tmp_path, capsys, {}, "--reference", "SASRec")


def test_a_paper_file_that_names_its_metrics_is_read_by_name(tmp_path, capsys):
    paper = tmp_path / "paper.json"
    rows = {"TVRec": [0.0484, 0.0853]}
    paper.write_text(json.dumps({"source": "t", "metrics": ["ndcg@10", "hit@10"], "rows": rows}))
    argv = [str(RUNS), "--paper", str(paper), "--metrics", "hit@5,hit@10,ndcg@10", "--seed_means"]
    assert _tool().main(argv) == 0
    table = {row[0]: row for row in map(_cells, capsys.readouterr().out.splitlines()[2:])}
    assert table["TVRec (paper)"][3:6] == ["n/a", "0.0853", "0.0484"]


def test_paper_values_that_do_not_match_the_metrics_stop_with_one_line(tmp_path):
    paper = tmp_path / "paper.json"
    paper.write_text(json.dumps({"source": "t", "rows": {"TVRec": [0.0853, 0.0484]}}))
    # Two values read against three metrics would shift every difference: refused.
    with pytest.raises(SystemExit, match="TVRec has 2 values for 3 metrics"):
        _tool().main([str(RUNS), "--paper", str(paper), "--metrics", "hit@5,hit@10,ndcg@10"])


def test_an_entry_named_in_entries_stands_beside_that_paper_row(tmp_path, capsys):
    paper = tmp_path / "paper.json"
    paper.write_text(
        json.dumps(
            {
                "source": "t",
                "metrics": ["hit@10"],
                "rows": {"Theirs": [0.08]},
                "entries": {"TVRec": "Theirs"},
            }  # fmt: skip
        )
    )
    _tool().main([str(RUNS), "--paper", str(paper), "--metrics", "hit@10", "--seed_means"])
    table = {row[0]: row for row in map(_cells, capsys.readouterr().out.splitlines()[2:])}
    assert table["TVRec (paper: Theirs)"][3] == "0.0800"
    assert "WEARec (paper: Theirs)" not in table and "WEARec (paper)" not in table
