"""Tests for dataset_prep: one-line raw files -> RecBole atomic files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dataset_prep
import dataset_prep.atomic
import dataset_prep.pipeline
from dataset_prep import (
    KNOWN_DATASETS,
    ExpectedStats,
    RawFormatError,
    RawInputError,
    StatsMismatchError,
    UsageError,
    convert,
    convert_one_line,
    prepare_command,
)
from dataset_prep.cli import main

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_S3REC = REPO_ROOT.parent / "shared" / "data" / "s3rec"
HEADER = "user_id:token\titem_id:token\ttimestamp:float\n"


def write_raw(directory: Path, text: str, name: str = "raw.txt") -> Path:
    path = directory / name
    path.write_bytes(text.encode("utf-8"))
    return path


def raw_text(sequences: list[tuple[int, list[int]]]) -> str:
    return "".join(f"{u} {' '.join(map(str, items))}\n" for u, items in sequences)


def read_sequences(inter_path: Path) -> list[tuple[str, list[str]]]:
    """Users in order of first appearance, items ordered by timestamp."""
    lines = inter_path.read_text().splitlines()
    assert lines[0] + "\n" == HEADER
    rows = [line.split("\t") for line in lines[1:]]
    rows.sort(key=lambda r: float(r[2]))
    out: dict[str, list[str]] = {}
    for user, item, _ in rows:
        out.setdefault(user, []).append(item)
    return list(out.items())


def as_tokens(sequences: list[tuple[int, list[int]]]) -> list[tuple[str, list[str]]]:
    return [(str(u), [str(i) for i in items]) for u, items in sequences]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dataset_prep", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*")) if root.exists() else []


# --- output format -----------------------------------------------------------


def test_exact_output_for_small_file(tmp_path):
    raw = write_raw(tmp_path, "3 10 20 30\n1 5\r\n2 7 7\t8\n\n  \n")
    stats = convert_one_line(raw, tmp_path / "out", "toy", show_progress=False)

    inter = tmp_path / "out" / "toy" / "toy.inter"
    assert inter.read_text() == (
        HEADER + "3\t10\t0\n3\t20\t1\n3\t30\t2\n1\t5\t3\n2\t7\t4\n2\t7\t5\n2\t8\t6\n"
    )
    assert (stats.users, stats.items, stats.interactions) == (3, 6, 7)
    assert (stats.min_seq_len, stats.max_seq_len) == (1, 3)
    assert stats.avg_seq_len == pytest.approx(7 / 3)
    assert stats.sparsity == pytest.approx(1 - 7 / 18)

    summary = json.loads((tmp_path / "out" / "toy" / "toy.stats.json").read_text())
    assert summary["dataset"] == "toy"
    assert summary["format"] == "one-line"
    assert summary["source"]["file"] == "raw.txt"
    assert summary["source"]["size"] == raw.stat().st_size
    assert summary["stats"]["users"] == 3
    assert summary["expected"] is None and summary["matches_expected"] is None
    assert sorted(p.name for p in all_files(tmp_path / "out")) == [
        "toy",
        "toy.inter",
        "toy.stats.json",
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.integers(1, 10**12),
            st.lists(st.integers(1, 10**12) | st.integers(1, 5), min_size=1, max_size=8),
        ),
        min_size=1,
        max_size=15,
        unique_by=lambda s: s[0],
    )
)
def test_round_trip(sequences):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        raw = write_raw(tmp, raw_text(sequences))
        stats = convert_one_line(raw, tmp / "out", "rt", show_progress=False)
        inter = tmp / "out" / "rt" / "rt.inter"
        assert read_sequences(inter) == as_tokens(sequences)
        timestamps = [float(line.split("\t")[2]) for line in inter.read_text().splitlines()[1:]]
        assert timestamps == list(range(len(timestamps)))
        assert stats.interactions == sum(len(items) for _, items in sequences)
        assert stats.items == len({i for _, items in sequences for i in items})


def test_idempotent_and_independent_of_raw_location(tmp_path):
    text = "4 1 2 3\n2 3 1\n9 9 9 2\n"
    out = tmp_path / "out"
    convert_one_line(write_raw(tmp_path, text), out, "idem", show_progress=False)
    first = {p.name: p.read_bytes() for p in all_files(out / "idem")}
    convert_one_line(write_raw(tmp_path, text), out, "idem", show_progress=False)
    (tmp_path / "elsewhere").mkdir()
    convert_one_line(write_raw(tmp_path / "elsewhere", text), out, "idem", show_progress=False)
    assert {p.name: p.read_bytes() for p in all_files(out / "idem")} == first


# --- RecBole ---------------------------------------------------------------


def test_recbole_pipeline_reads_same_sequences(tmp_path, monkeypatch):
    import recbole_freq  # noqa: F401  (RecBole 1.2.1 needs its numpy 2 fixes)

    # Config reads sys.argv and sets CUDA_VISIBLE_DEVICES; keep both local to this test.
    monkeypatch.setattr(sys, "argv", ["x"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    monkeypatch.chdir(tmp_path)  # RecBole may write logs/checkpoints under the cwd
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation

    # File order differs from numeric order; repeats; one history longer than 50.
    sequences = [
        (50, [7, 3, 9, 3]),
        (2, [1, 2, 3, 4, 5]),
        (17, [9, 8, 7]),
        (3, [(i * 37) % 23 + 1 for i in range(60)]),
        (100, [4, 4, 4]),
    ]
    out = tmp_path / "data"
    convert_one_line(write_raw(tmp_path, raw_text(sequences)), out, "rbtoy", show_progress=False)

    config = Config(
        model="SASRec",
        dataset="rbtoy",
        config_dict={
            "data_path": str(out),
            "load_col": {"inter": ["user_id", "item_id", "timestamp"]},
            "eval_args": {
                "split": {"LS": "valid_and_test"},
                "order": "TO",
                "mode": "full",
                "group_by": "user",
            },
            "train_neg_sample_args": None,
            "loss_type": "CE",
            "MAX_ITEM_LIST_LENGTH": 50,
            "show_progress": False,
        },
    )
    dataset = create_dataset(config)
    n_items = len({i for _, items in sequences for i in items})
    assert dataset.user_num == len(sequences) + 1  # + padding id
    assert dataset.item_num == n_items + 1
    assert dataset.inter_num == sum(len(items) for _, items in sequences)

    feat = dataset.inter_feat
    users = dataset.id2token("user_id", np.asarray(feat["user_id"]))
    items = dataset.id2token("item_id", np.asarray(feat["item_id"]))
    times = np.asarray(feat["timestamp"])
    loaded: dict[str, list[tuple[float, str]]] = {}
    for user, item, time in zip(users, items, times, strict=True):
        loaded.setdefault(str(user), []).append((float(time), str(item)))
    expected = dict(as_tokens(sequences))
    assert {u: [i for _, i in sorted(rows)] for u, rows in loaded.items()} == expected

    # Test split: each user's last item is the target, the rest its history.
    _, _, test_data = data_preparation(config, dataset)
    test = test_data.dataset.inter_feat
    got = {}
    for k in range(len(test)):
        user = str(dataset.id2token("user_id", int(test["user_id"][k])))
        length = int(test["item_length"][k])
        history = dataset.id2token("item_id", test["item_id_list"][k][:length].numpy())
        target = str(dataset.id2token("item_id", int(test["item_id"][k])))
        got[user] = ([str(i) for i in history], target)
    assert got == {u: (its[:-1][-50:], its[-1]) for u, its in expected.items()}


# --- malformed input ---------------------------------------------------------

MALFORMED = [
    ("1 2 3\n2 x 4\n", 2, "item #1 'x' is not a positive integer"),
    ("1 2 3\n2 4 0\n", 2, "item #2 '0' is not positive"),
    ("1 2\n2 -3\n", 2, "'-3' is not a positive integer"),
    ("1 2\n2 1.5\n", 2, "'1.5' is not a positive integer"),
    ("1 2\n2 03\n", 2, "leading zeros"),
    ("1 2\n2 \uff13\n", 2, "is not a positive integer"),  # full-width digit
    ("1 2\nu7 3\n", 2, "user id 'u7' is not a positive integer"),
    ("1 2\n0 3\n", 2, "user id '0' is not positive"),
    ("1 2\n3\n", 2, "user 3 has no items"),
    ("1 2\n2 3\n3 4\n1 5\n", 4, "user 1 already appeared on line 1"),
    ("1 2\n\n2 3\n", 2, "blank line between user lines"),
    ("", None, "file is empty"),
    ("\n \n\n", None, "only blank lines"),
]


@pytest.mark.parametrize(("text", "line", "problem"), MALFORMED)
def test_malformed_input_names_line_and_writes_nothing(tmp_path, text, line, problem):
    raw = write_raw(tmp_path, text, name="bad.txt")
    out = tmp_path / "out"
    with pytest.raises(RawFormatError) as info:
        convert_one_line(raw, out, "bad", show_progress=False)
    message = str(info.value)
    assert info.value.line == line
    assert "bad.txt" in message and problem in message
    if line is not None:
        assert f"line {line}:" in message
    assert not out.exists()


def test_failed_conversion_leaves_existing_output_untouched(tmp_path):
    out = tmp_path / "out"
    convert_one_line(write_raw(tmp_path, "1 2 3\n"), out, "keep", show_progress=False)
    before = {p: p.read_bytes() for p in all_files(out) if p.is_file()}
    with pytest.raises(RawFormatError):
        convert_one_line(write_raw(tmp_path, "1 2 3\n1 4\n"), out, "keep", show_progress=False)
    assert {p: p.read_bytes() for p in all_files(out) if p.is_file()} == before


def test_missing_raw_file(tmp_path):
    with pytest.raises(RawInputError, match="raw file not found: .*nope.txt"):
        convert_one_line(tmp_path / "nope.txt", tmp_path / "out", "x", show_progress=False)
    with pytest.raises(RawInputError, match="is a directory"):
        convert_one_line(tmp_path, tmp_path / "out", "x", show_progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "-x", "a b", "é"])
def test_invalid_names_rejected(tmp_path, name):
    raw = write_raw(tmp_path, "1 2\n")
    with pytest.raises(UsageError, match="invalid dataset name"):
        convert_one_line(raw, tmp_path / "out", name, show_progress=False)
    assert not (tmp_path / "out").exists()


def test_unknown_format_rejected(tmp_path):
    with pytest.raises(UsageError, match="unknown raw format 'xml'.*one-line"):
        convert(write_raw(tmp_path, "1 2\n"), tmp_path / "out", "x", fmt="xml")


# --- statistics checks -------------------------------------------------------


def test_known_name_with_wrong_statistics_fails_and_writes_nothing(tmp_path):
    raw = write_raw(tmp_path, "1 1 2 3\n2 2 3\n", name="LastFM.txt")
    out = tmp_path / "out"
    with pytest.raises(StatsMismatchError) as info:
        convert_one_line(raw, out, "lastfm", show_progress=False)
    message = str(info.value)
    assert [m[0] for m in info.value.mismatches] == ["users", "items", "interactions"]
    assert "users 2 (expected 1,090)" in message
    assert "wrong raw file" in message and "nothing was written" in message
    assert not out.exists()


def test_no_check_writes_and_records_mismatch(tmp_path):
    raw = write_raw(tmp_path, "1 1 2 3\n2 2 3\n")
    result = convert(
        raw, tmp_path / "out", "lastfm", fmt="one-line", check=False, show_progress=False
    )
    assert [m[0] for m in result.mismatches] == ["users", "items", "interactions"]
    summary = json.loads(result.stats_path.read_text())
    assert summary["matches_expected"] is False
    assert summary["expected"] == {"users": 1090, "items": 3646, "interactions": 52551}


def test_explicit_expected_statistics(tmp_path):
    raw = write_raw(tmp_path, "1 1 2 3\n2 2 3\n")
    ok = ExpectedStats(users=2, items=3, interactions=5)
    convert_one_line(raw, tmp_path / "out", "custom", expected=ok, show_progress=False)
    bad = ExpectedStats(users=2, items=3, interactions=6)
    with pytest.raises(StatsMismatchError, match="interactions 5 \\(expected 6\\)"):
        convert_one_line(raw, tmp_path / "out2", "custom", expected=bad, show_progress=False)
    assert not (tmp_path / "out2").exists()


# --- atomic writes -----------------------------------------------------------


def _fail_replace(*args, **kwargs):
    raise OSError(28, "No space left on device")


def _fail_write(fh, sequences, times=None):
    fh.write(b"half a fi")
    raise KeyboardInterrupt


@pytest.mark.parametrize("pre_existing", [False, True])
@pytest.mark.parametrize(
    ("target", "attr", "replacement", "exc"),
    [
        (dataset_prep.atomic.os, "replace", _fail_replace, OSError),
        (dataset_prep.pipeline, "write_inter", _fail_write, KeyboardInterrupt),
    ],
)
def test_write_failure_leaves_no_trace(
    tmp_path, monkeypatch, pre_existing, target, attr, replacement, exc
):
    out = tmp_path / "out"
    if pre_existing:
        (out / "atom").mkdir(parents=True)
        (out / "atom" / "other.txt").write_text("keep")
    before = {p: p.read_bytes() for p in all_files(out) if p.is_file()}
    monkeypatch.setattr(target, attr, replacement)
    with pytest.raises(exc):
        convert_one_line(write_raw(tmp_path, "1 2 3\n"), out, "atom", show_progress=False)
    monkeypatch.undo()
    if pre_existing:
        assert {p: p.read_bytes() for p in all_files(out) if p.is_file()} == before
        assert [p.name for p in all_files(out)] == ["atom", "other.txt"]
    else:
        assert not out.exists()


def test_output_path_that_is_a_file(tmp_path):
    (tmp_path / "out").write_text("not a dir")
    with pytest.raises(UsageError, match="is not a directory"):
        convert_one_line(write_raw(tmp_path, "1 2\n"), tmp_path / "out", "x", show_progress=False)


# --- registry ----------------------------------------------------------------


def test_registry_matches_published_statistics():
    table = {
        "amazon-beauty": ("Beauty.txt", 22_363, 12_101, 198_502),
        "amazon-sports-outdoors": ("Sports_and_Outdoors.txt", 35_598, 18_357, 296_337),
        "amazon-toys-games": ("Toys_and_Games.txt", 19_412, 11_924, 167_597),
        "yelp": ("Yelp.txt", 30_431, 20_033, 316_354),
        "lastfm": ("LastFM.txt", 1_090, 3_646, 52_551),
        "ml-1m": ("ml-1m.txt", 6_040, 3_416, 999_611),
    }
    got = {
        name: (d.one_line_file, d.expected.users, d.expected.items, d.expected.interactions)
        for name, d in KNOWN_DATASETS.items()
    }
    assert got == table
    raw_sources = {
        "amazon-beauty": ("reviews_Beauty_5.json.gz", "amazon-2014"),
        "amazon-sports-outdoors": ("reviews_Sports_and_Outdoors_5.json.gz", "amazon-2014"),
        "amazon-toys-games": ("reviews_Toys_and_Games_5.json.gz", "amazon-2014"),
        "yelp": ("yelp_academic_dataset_review.json", "yelp"),
        "lastfm": ("user_taggedartists-timestamps.dat", "lastfm-hetrec"),
        "ml-1m": ("ratings.dat", "movielens-dat"),
    }
    assert {n: (d.raw_file, d.format) for n, d in KNOWN_DATASETS.items()} == raw_sources
    assert all(d.format in dataset_prep.FORMATS for d in KNOWN_DATASETS.values())
    with pytest.raises(TypeError):
        KNOWN_DATASETS["new"] = None  # read-only: add entries in registry.py


def test_prepare_command():
    assert prepare_command("amazon-beauty", "dataset", alternative=False) == (
        "python -m dataset_prep amazon-beauty --raw <path to reviews_Beauty_5.json.gz> "
        "--out dataset"
    )
    first, second = prepare_command("amazon-beauty", "dataset").split("\n")
    assert first == prepare_command("amazon-beauty", "dataset", alternative=False)
    assert second.endswith(
        "python -m dataset_prep amazon-beauty --raw <path to Beauty.txt> --out dataset "
        "--format one-line"
    )
    assert (
        prepare_command("lastfm", Path("my data"), raw_path="raw files/LastFM.txt", fmt="one-line")
        == "python -m dataset_prep lastfm --raw 'raw files/LastFM.txt' --out 'my data' "
        "--format one-line"
    )
    assert prepare_command("ml-1m", "d", raw_path="ratings.dat") == (
        "python -m dataset_prep ml-1m --raw ratings.dat --out d"
    )
    assert prepare_command("mine", "d", fmt="csv") == (
        "python -m dataset_prep mine --raw <path to CSV/TSV log> --out d --format csv"
    )
    with pytest.raises(UsageError, match="unknown raw format"):
        prepare_command("mine", "d", fmt="xml")
    assert prepare_command("custom", "d").startswith("python -m dataset_prep custom --raw <")
    with pytest.raises(UsageError):
        prepare_command("../evil", "d")


# --- CLI -----------------------------------------------------------------------


def test_cli_list():
    result = run_cli("--list")
    assert result.returncode == 0, result.stderr
    for name, d in KNOWN_DATASETS.items():
        row = next(line for line in result.stdout.splitlines() if line.startswith(name + " "))
        assert d.raw_file in row
        assert f"{d.expected.users:,}" in row and f"{d.expected.interactions:,}" in row
        assert d.one_line_file in result.stdout and d.source in result.stdout
    assert "padding id" in result.stdout
    assert "6,041 users / 3,417 items" in result.stdout  # the BSARec table's ML-1M counts
    assert "github.com/RUCAIBox/CIKM2020-S3Rec" in result.stdout


def test_cli_converts(tmp_path):
    raw = write_raw(tmp_path, "5 1 2 3\n6 3 4\n")
    result = run_cli("toy", "--raw", str(raw), "--out", str(tmp_path / "out"), "--quiet")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "users" in result.stdout and "not checked" in result.stdout
    assert read_sequences(tmp_path / "out" / "toy" / "toy.inter") == [
        ("5", ["1", "2", "3"]),
        ("6", ["3", "4"]),
    ]


def test_cli_bad_input_exit_code_and_message(tmp_path):
    raw = write_raw(tmp_path, "1 2\n1 3\n", name="dup.txt")
    result = run_cli("toy", "--raw", str(raw), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "dup.txt, line 2: user 1 already appeared on line 1" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["toy", "--raw", "RAW", "--out", "OUT", "--format", "xml"], "invalid choice: 'xml'"),
        (["toy", "--out", "OUT"], "missing --raw"),
        (["--raw", "RAW", "--out", "OUT"], "missing NAME"),
        (["--list", "toy"], "--list takes no other arguments"),
        (["../x", "--raw", "RAW", "--out", "OUT"], "invalid dataset name"),
        (["toy", "--raw", "MISSING", "--out", "OUT"], "raw file not found"),
        (["lastfm", "--raw", "RAW", "--out", "OUT", "--format", "one-line"], "--no-check"),
        (["lastfm", "--raw", "RAW", "--out", "OUT"], "add --format one-line"),
        (["toy", "--raw", "RAW", "--out", "OUT", "--core", "3"], "--core applies to raw logs"),
        (["toy", "--raw", "RAW", "--out", "OUT", "--user-col", "u"], "apply to --format csv"),
    ],
)
def test_cli_usage_errors(tmp_path, capsys, args, fragment):
    raw = write_raw(tmp_path, "1 2\n")
    subst = {"RAW": str(raw), "OUT": str(tmp_path / "out"), "MISSING": str(tmp_path / "m")}
    with pytest.raises(SystemExit) as info:
        sys.exit(main([subst.get(a, a) for a in args]))
    assert info.value.code == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_no_check_and_progress_bar(tmp_path, capsys):
    # Just over 1 MiB so the progress bar is enabled.
    lines = [f"{u} " + " ".join(str(u % 97 + k) for k in range(1, 21)) for u in range(1, 20001)]
    raw = write_raw(tmp_path, "\n".join(lines) + "\n")
    assert raw.stat().st_size > 1 << 20
    args = ["--raw", str(raw), "--out", str(tmp_path / "out"), "--format", "one-line"]
    assert main(["lastfm", *args, "--no-check"]) == 0
    captured = capsys.readouterr()
    assert "MISMATCH" in captured.out and "warning" in captured.err
    assert "reading raw.txt" in captured.err
    assert main(["big", "--raw", str(raw), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""

    # An error half-way through a large file: the bar is cleared before the message.
    bad = write_raw(tmp_path, "\n".join(lines) + "\n20001 1 x\n", name="bad.txt")
    assert main(["big2", "--raw", str(bad), "--out", str(tmp_path / "out")]) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("python -m dataset_prep: error: ") and "line 20001:" in last
    assert not (tmp_path / "out" / "big2").exists()


# --- published files -----------------------------------------------------------


@pytest.mark.skipif(
    not (SHARED_S3REC / "Beauty.txt").exists(), reason="shared S3-Rec data not available"
)
@pytest.mark.parametrize(
    ("name", "file"), [("amazon-beauty", "Beauty.txt"), ("lastfm", "LastFM.txt")]
)
def test_published_files_match_expected_statistics(tmp_path, name, file):
    result = convert(SHARED_S3REC / file, tmp_path, name, fmt="one-line", show_progress=False)
    expected = KNOWN_DATASETS[name].expected
    assert result.mismatches == []
    assert (result.stats.users, result.stats.items, result.stats.interactions) == (
        expected.users,
        expected.items,
        expected.interactions,
    )
    assert json.loads(result.stats_path.read_text())["matches_expected"] is True
