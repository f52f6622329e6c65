"""Tests for dataset_prep's raw-source formats and the shared S3-Rec procedure.

Every raw file is built here, small and synthetic, in the format of the
public release it imitates.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import random
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataset_prep import (
    KNOWN_DATASETS,
    RawFormatError,
    RawInputError,
    UsageError,
    convert,
)
from dataset_prep.cli import main
from dataset_prep.procedure import kcore
from dataset_prep.registry import FORMATS
from dataset_prep.tabular import TableOptions

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_S3REC = REPO_ROOT.parent / "shared" / "data" / "s3rec"
HEADER = "user_id:token\titem_id:token\ttimestamp:float\treal_time:float"
LASTFM_HEADER = "userID\tartistID\ttagID\ttimestamp\n"


# --- helpers -----------------------------------------------------------------


def write(path: Path, text: str, *, gz: bool = False) -> Path:
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


def amazon_line(user: str, item: str, time, *, literal: bool, **extra) -> str:
    review = {"reviewerID": user, "asin": item, "unixReviewTime": time, **extra}
    # The 2014 release writes Python dict literals; strict JSON also occurs.
    return (repr(review) if literal else json.dumps(review)) + "\n"


def yelp_line(user: str, item: str, date: str, **extra) -> str:
    review = {"review_id": f"r{user}{item}", "user_id": user, "business_id": item}
    return json.dumps({**review, "stars": 4.0, "date": date, **extra}) + "\n"


def inter_rows(out: Path, name: str) -> list[tuple[str, str]]:
    """(user, item) rows of the .inter file, checking the header and the time counter."""
    lines = (out / name / f"{name}.inter").read_text().splitlines()
    assert lines[0] == HEADER
    rows = [line.split("\t") for line in lines[1:]]
    assert [float(r[2]) for r in rows] == list(range(len(rows)))
    return [(u, i) for u, i, _, _ in rows]


def without_real_time(inter: Path) -> bytes:
    """The .inter file's bytes without its real_time column (the one-line format's)."""
    lines = inter.read_bytes().splitlines(keepends=True)
    return b"".join(b"\t".join(line.rstrip(b"\n").split(b"\t")[:3]) + b"\n" for line in lines)


def real_times(out: Path, name: str) -> dict[str, list[float]]:
    """Each user's real times (seconds) in the .inter file's order."""
    lines = (out / name / f"{name}.inter").read_text().splitlines()
    times: dict[str, list[float]] = {}
    for user, _item, _order, seconds in (line.split("\t") for line in lines[1:]):
        times.setdefault(user, []).append(float(seconds))
    return times


def sequences(out: Path, name: str) -> dict[str, list[str]]:
    seqs: dict[str, list[str]] = {}
    for user, item in inter_rows(out, name):
        seqs.setdefault(user, []).append(item)
    return seqs


def idmap(out: Path, name: str) -> dict:
    return json.loads((out / name / f"{name}.idmap.json").read_text())


def snapshot(root: Path) -> dict[str, bytes]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def quiet(**kwargs):
    return {"show_progress": False, **kwargs}


# --- Amazon 2014 ---------------------------------------------------------------

# (user, item, unixReviewTime) in file order. U1's I2 and I3 tie at 20 (file order
# decides); U2 reviews I1 twice (both kept); U3 and I9 are below a 2-core; dropping
# I3 and I4 then leaves U4 with one review, removed only in a second pass.
AMAZON_ROWS = [
    ("U1", "I1", 30),
    ("U2", "I1", 10),
    ("U1", "I2", 20),
    ("U1", "I3", 20),
    ("U2", "I2", 10),
    ("U3", "I9", 5),
    ("U2", "I1", 40),
    ("U4", "I4", 1),
    ("U4", "I1", 2),
]


@pytest.mark.parametrize(("literal", "gz"), [(True, True), (False, False), (True, False)])
def test_amazon_exact_output(tmp_path, literal, gz):
    text = "".join(
        amazon_line(u, i, t, literal=literal, reviewText='It\'s "great" ü', overall=5.0)
        for u, i, t in AMAZON_ROWS
    )
    raw = write(tmp_path / "reviews_Toy_5.json.gz", text + "\n", gz=gz)
    out = tmp_path / "out"
    result = convert(raw, out, "toy", fmt="amazon-2014", core=2, **quiet())

    # U1: I2, I3 (tie, file order), I1 -> I3 filtered; U2: I1, I2 (tie), I1.
    # Ids from 1 by first appearance in these final sequences: I2 -> 1, I1 -> 2.
    assert inter_rows(out, "toy") == [("1", "1"), ("1", "2"), ("2", "2"), ("2", "1"), ("2", "2")]
    assert idmap(out, "toy") == {
        "schema": 1,
        "dataset": "toy",
        "user": ["U1", "U2"],
        "item": ["I2", "I1"],
    }
    assert (result.stats.users, result.stats.items, result.stats.interactions) == (2, 2, 5)
    details = result.details
    assert details["rows_read"] == 9 and details["interactions_collected"] == 9
    assert details["before_core"] == {"users": 4, "items": 5, "interactions": 9}
    assert details["removed_by_core"] == {"users": 2, "items": 3, "interactions": 4}
    assert details["core"] == {"user": 2, "item": 2, "passes": 3}
    summary = json.loads(result.stats_path.read_text())
    assert summary["format"] == "amazon-2014" and summary["idmap_file"] == "toy.idmap.json"
    assert summary["preparation"] == details
    assert summary["source"]["size"] == raw.stat().st_size
    assert summary["source"]["sha256"] == hashlib.sha256(raw.read_bytes()).hexdigest()


def test_amazon_string_timestamps_and_default_core(tmp_path):
    # 5 users x 5 items, all reviewed: the 5-core keeps everything but U6 / I6.
    rng = random.Random(3)
    rows = [(f"U{u}", f"I{i}", rng.randint(1, 3)) for u in range(5) for i in range(5)]
    rows += [("U6", "I0", 1), ("U0", "I6", 1)]
    rng.shuffle(rows)
    text = "".join(amazon_line(u, i, str(t), literal=True) for u, i, t in rows)
    raw = write(tmp_path / "r.json.gz", text, gz=True)
    result = convert(raw, tmp_path / "out", "toy5", fmt="amazon-2014", **quiet())
    assert (result.stats.users, result.stats.items, result.stats.interactions) == (5, 5, 25)
    assert result.details["core"]["user"] == 5


# --- Yelp ------------------------------------------------------------------------


def test_yelp_window_edges_and_repeats(tmp_path):
    lines = [
        yelp_line("ua", "b1", "2018-12-31 23:59:59"),  # before the window
        yelp_line("ua", "b1", "2019-01-01 00:00:00"),  # first second: kept
        yelp_line("ub", "b2", "2019-06-01 12:00:00"),
        yelp_line("ua", "b2", "2019-12-31 00:00:00"),  # the upper bound itself: kept
        yelp_line("ua", "b3", "2019-12-31 00:00:01"),  # one second later: dropped
        yelp_line("ub", "b1", "2020-01-01 00:00:00"),  # after
        yelp_line("ub", "b1", "2019-03-03 10:00:00"),
        yelp_line("ua", "b1", "2019-05-05 05:05:05"),  # repeated review of b1: kept
        yelp_line("ub", "b2", "2019-06-01 12:00:00"),  # repeat with equal time: kept
        yelp_line("uc", "b3", "2019-02-02 02:02:02"),  # uc is alone with b3
    ]
    raw = write(tmp_path / "yelp_academic_dataset_review.json", "".join(lines))
    out = tmp_path / "out"
    result = convert(raw, out, "yelp-toy", fmt="yelp", core=2, **quiet())
    # ua: b1 (01-01), b1 (05-05), b2 (12-31); ub: b1 (03-03), b2, b2 (ties, file order).
    assert sequences(out, "yelp-toy") == {"1": ["1", "1", "2"], "2": ["1", "2", "2"]}
    assert idmap(out, "yelp-toy")["item"] == ["b1", "b2"]
    assert idmap(out, "yelp-toy")["user"] == ["ua", "ub"]
    assert result.details["rows_skipped"] == {"outside the 2019 date window": 3}
    assert result.details["removed_by_core"] == {"users": 1, "items": 1, "interactions": 1}


# --- LastFM ----------------------------------------------------------------------


def test_lastfm_repeated_tags_keep_first_row(tmp_path):
    text = LASTFM_HEADER + (
        "2\t51\t13\t1238536800000\r\n"
        "2\t51\t15\t1236117600000\n"  # another tag of (2, 51), earlier: ignored
        "2\t52\t13\t1238536800000\n"  # ties with (2, 51): after it, in file order
        "2\t53\t1\t1230000000000\n"
        "3\t51\t7\t1240000000000\n"
        "3\t53\t7\t1240000000000\n"
        "3\t51\t9\t1100000000000\n"  # another tag of (3, 51), earlier: ignored
        "3\t53\t9\t1300000000000\n"
    )
    raw = write(tmp_path / "user_taggedartists-timestamps.dat", text)
    out = tmp_path / "out"
    result = convert(raw, out, "fm", fmt="lastfm-hetrec", core=1, **quiet())
    # user 2: 53, 51, 52; user 3: 51, 53.  Items: 53 -> 1, 51 -> 2, 52 -> 3.
    assert sequences(out, "fm") == {"1": ["1", "2", "3"], "2": ["2", "1"]}
    assert idmap(out, "fm")["user"] == ["2", "3"]
    assert idmap(out, "fm")["item"] == ["53", "51", "52"]
    assert result.details["rows_skipped"] == {"repeated (user, item) after its first row": 3}

    # A 2-core drops artist 52, seen by one user only.
    convert(raw, out, "fm2", fmt="lastfm-hetrec", core=2, **quiet())
    assert sequences(out, "fm2") == {"1": ["1", "2"], "2": ["2", "1"]}


# --- MovieLens 1M ---------------------------------------------------------------


def test_movielens_every_rating_counts(tmp_path):
    # Six users rate movies 10..14 at times that reverse the file order for even
    # users; ratings of 1 count like 5. User 7 has four ratings and movie 99 four
    # raters: both are below the 5-core.
    lines = []
    for user in range(1, 7):
        for k, movie in enumerate(range(10, 15)):
            time = 1000 - k if user % 2 == 0 else 1000 + k
            lines.append(f"{user}::{movie}::{1 + (user + k) % 5}::{time}")
    lines += [f"7::{m}::3::5" for m in (10, 11, 12, 13)]
    lines += [f"{u}::99::2::2000" for u in (1, 2, 3, 4)]
    lines.insert(3, "02::15::1::1")  # '02' is user 2, as pandas reads it
    raw = write(tmp_path / "ratings.dat", "\n".join(lines) + "\n")
    out = tmp_path / "out"
    result = convert(raw, out, "ml", fmt="movielens-dat", **quiet())

    # Movie 15 has one rating and 99 four: both go; user 7 goes.
    assert (result.stats.users, result.stats.items, result.stats.interactions) == (6, 5, 30)
    seqs = sequences(out, "ml")
    assert seqs["1"] == ["1", "2", "3", "4", "5"]  # user 1 first: movies 10..14 in time order
    assert seqs["2"] == ["5", "4", "3", "2", "1"]  # even users in reverse
    assert idmap(out, "ml")["item"] == ["10", "11", "12", "13", "14"]
    assert idmap(out, "ml")["user"] == ["1", "2", "3", "4", "5", "6"]


# --- generic CSV / TSV -----------------------------------------------------------


def test_csv_with_named_columns_and_quoting(tmp_path):
    text = (
        "\ufeffwhen,who,note,what\n"
        '3,alice,"hello, world",apple\n'
        "1,alice,,banana\n"
        '2,bob,"x",apple\n'
        "1,alice,,apple\n"  # ties with banana: after it
        "\n"
        "5,bob,,banana\n"
    )
    raw = write(tmp_path / "log.csv", text)
    out = tmp_path / "out"
    table = TableOptions(user_col="who", item_col="what", time_col="when")
    convert(raw, out, "mine", fmt="csv", core=1, table=table, **quiet())
    # alice: banana, apple, apple; bob: apple, banana.
    assert sequences(out, "mine") == {"1": ["1", "2", "2"], "2": ["2", "1"]}
    assert idmap(out, "mine")["item"] == ["banana", "apple"]

    first = TableOptions(user_col="who", item_col="what", time_col="when", keep_first_per_pair=True)
    convert(raw, out, "first", fmt="csv", core=1, table=first, **quiet())
    assert sequences(out, "first") == {"1": ["1", "2"], "2": ["2", "1"]}


def test_tsv_recbole_header_and_iso_dates(tmp_path):
    text = (
        "user_id:token\titem_id:token\ttimestamp:float\n"
        "u1\ti1\t2020-01-02T00:00:00\n"
        "u1\ti2\t2020-01-01\n"
        'u2\t"i1\t2019-05-05 10:00:00\n'  # tab-separated: no quoting, '"i1' is an id
    )
    raw = write(tmp_path / "log.tsv.gz", text, gz=True)
    out = tmp_path / "out"
    convert(raw, out, "tsv", fmt="csv", core=1, **quiet())
    assert sequences(out, "tsv") == {"1": ["1", "2"], "2": ["3"]}
    assert idmap(out, "tsv")["item"] == ["i2", "i1", '"i1']

    custom = write(
        tmp_path / "d.csv", "user_id;item_id;timestamp\nu;a;02/01/2020\nu;b;01/02/2020\n"
    )
    for time_format, order in (("%d/%m/%Y", ["a", "b"]), ("%m/%d/%Y", ["b", "a"])):
        table = TableOptions(sep=";", time_format=time_format)
        convert(custom, out, "fmt", fmt="csv", core=1, table=table, **quiet())
        assert idmap(out, "fmt")["item"] == order


# --- the S3-Rec procedure against references -------------------------------------


def brute_force_core(seqs: list[list[int]], user_core: int, item_core: int) -> dict:
    """The largest sub-log (by users x items kept) in which every kept user and item
    has enough interactions, found by trying every subset."""
    users = [u for u, items in enumerate(seqs) if items]
    items = sorted({i for s in seqs for i in s})
    best: dict = {}
    best_size = 0
    for nu in range(len(users), 0, -1):
        for kept_users in itertools.combinations(users, nu):
            for ni in range(len(items), 0, -1):
                for kept_items in itertools.combinations(items, ni):
                    allowed = set(kept_items)
                    sub = {u: [i for i in seqs[u] if i in allowed] for u in kept_users}
                    counts = Counter(i for s in sub.values() for i in s)
                    if all(len(s) >= user_core for s in sub.values()) and all(
                        counts[i] >= item_core for i in allowed
                    ):
                        size = sum(len(s) for s in sub.values())
                        if size > best_size:
                            best, best_size = sub, size
    return best


logs = st.lists(
    st.lists(st.integers(0, 4), max_size=6),
    min_size=1,
    max_size=5,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs, st.integers(1, 4), st.integers(1, 4))
def test_kcore_matches_brute_force(seqs, user_core, item_core):
    kept, passes = kcore(seqs, user_core, item_core)
    assert kept == brute_force_core(seqs, user_core, item_core)
    assert passes >= 1


def reference_prepare(rows: list[tuple[str, str, int]], core: int) -> list[tuple[str, list[str]]]:
    """S3-Rec's steps written out plainly: group, stable sort, k-core, re-map."""
    grouped: dict[str, list[tuple[str, int]]] = {}
    for user, item, time in rows:
        grouped.setdefault(user, []).append((item, time))
    seqs = {u: [i for i, _ in sorted(its, key=lambda x: x[1])] for u, its in grouped.items()}
    users = list(seqs)
    names = sorted({i for s in seqs.values() for i in s})
    coded = [[names.index(i) for i in seqs[u]] for u in users]
    kept = brute_force_core(coded, core, core)
    out, item_ids = [], {}
    for u in sorted(kept):
        out.append(
            (
                str(len(out) + 1),
                [item_ids.setdefault(names[i], str(len(item_ids) + 1)) for i in kept[u]],
            )
        )
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from("pqrst"), st.sampled_from("abcde"), st.integers(0, 3)),
        max_size=25,
    ),
    st.integers(1, 3),
)
def test_pipeline_matches_reference_procedure(rows, core):
    expected = reference_prepare(rows, core)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        text = "user_id,item_id,timestamp\n" + "".join(f"{u},{i},{t}\n" for u, i, t in rows)
        raw = write(tmp / "log.csv", text)
        if not expected:
            with pytest.raises(RawFormatError) as info:
                convert(raw, tmp / "out", "p", fmt="csv", core=core, **quiet())
            assert "log.csv" in str(info.value)
            assert not (tmp / "out").exists()
            return
        convert(raw, tmp / "out", "p", fmt="csv", core=core, **quiet())
        assert list(sequences(tmp / "out", "p").items()) == expected


# --- idempotence ---------------------------------------------------------------


def test_idempotent_and_independent_of_raw_location(tmp_path):
    text = "".join(amazon_line(u, i, t, literal=True) for u, i, t in AMAZON_ROWS)
    out = tmp_path / "out"
    convert(write(tmp_path / "a.json.gz", text, gz=True), out, "idem", fmt="amazon-2014", core=2)
    first = snapshot(out)
    assert sorted(first) == ["idem/idem.idmap.json", "idem/idem.inter", "idem/idem.stats.json"]
    convert(write(tmp_path / "a.json.gz", text, gz=True), out, "idem", fmt="amazon-2014", core=2)
    (tmp_path / "elsewhere").mkdir()
    moved = write(tmp_path / "elsewhere" / "a.json.gz", text, gz=True)
    convert(moved, out, "idem", fmt="amazon-2014", core=2, **quiet())
    assert snapshot(out) == first

    # The same data as a one-line file: ids are kept as given, so no map applies
    # and the one from the raw run is removed with the rest replaced.
    one_line = write(tmp_path / "idem.txt", "1 1 2\n2 2 1 2\n")
    convert(one_line, out, "idem", fmt="one-line", **quiet())
    assert sorted(snapshot(out)) == ["idem/idem.inter", "idem/idem.stats.json"]
    raw_run = tmp_path / "raw-run.inter"
    raw_run.write_bytes(first["idem/idem.inter"])
    assert (out / "idem" / "idem.inter").read_bytes() == without_real_time(raw_run)


# --- bad input -----------------------------------------------------------------

GOOD_AMAZON = amazon_line("U1", "I1", 1, literal=False)
GOOD_YELP = yelp_line("u", "b", "2019-05-05 00:00:00")

# (format, file name, content, line, fragment of the message)
BAD_INPUTS = [
    ("amazon-2014", "r.json", GOOD_AMAZON + "1::2::3::4\n", 2, "not a JSON object or Python"),
    ("amazon-2014", "r.json", GOOD_AMAZON + "__import__('os')\n", 2, "not a JSON object"),
    ("amazon-2014", "r.json", GOOD_AMAZON + "[1, 2]\n", 2, "expected an object"),
    ("amazon-2014", "r.json", '{"asin": "I", "unixReviewTime": 1}\n', 1, "missing field"),
    ("amazon-2014", "r.json", '{"user_id": "u", "parent_asin": "p"}\n', 1, "2023 Amazon release"),
    ("amazon-2014", "r.json", '{"asin": "I", "title": "t"}\n', 1, "metadata file"),
    ("amazon-2014", "r.json", GOOD_AMAZON.replace(": 1", ': "soon"'), 1, "unparsable timestamp"),
    ("amazon-2014", "r.json", GOOD_AMAZON.replace(": 1", ": 1.5"), 1, "unparsable timestamp"),
    ("amazon-2014", "r.json", GOOD_AMAZON.replace('"U1"', '""'), 1, "'reviewerID' is not a"),
    ("yelp", "y.json", GOOD_YELP + "{'user_id': 1}\n", 2, "not valid JSON"),
    ("yelp", "y.json", '{"business_id": "b", "name": "x"}\n', 1, "looks like the business"),
    ("yelp", "y.json", GOOD_YELP.replace("2019-05-05 00:00:00", "2019-05-05"), 1, "unparsable"),
    ("yelp", "y.json", GOOD_YELP.replace("2019-05-05", "2019-13-05"), 1, "unparsable date"),
    ("yelp", "y.json", GOOD_YELP.replace("2019-05-05", "2015-05-05"), None, "2019 date window"),
    ("lastfm-hetrec", "t.dat", "userID\tartistID\ttagID\tday\tmonth\tyear\n", 1, "the header"),
    ("lastfm-hetrec", "t.dat", LASTFM_HEADER + "2\t51\t13\n", 2, "expected 4 tab-separated"),
    ("lastfm-hetrec", "t.dat", LASTFM_HEADER + "2\t51\t13\tnow\n", 2, "unparsable timestamp"),
    ("lastfm-hetrec", "t.dat", LASTFM_HEADER + "x\t51\t13\t1\n", 2, "userID 'x' is not an int"),
    ("lastfm-hetrec", "t.dat", "", None, "file is empty"),
    ("lastfm-hetrec", "t.dat", LASTFM_HEADER, None, "no interactions found"),
    ("movielens-dat", "m.dat", "1::Toy Story (1995)::Animation\n", 1, "movies.dat or users.dat"),
    ("movielens-dat", "m.dat", "1::2::5::12:00\n", 1, "unparsable timestamp '12:00'"),
    ("movielens-dat", "m.dat", "1::2::five::1\n", 1, "Rating 'five' is not a number"),
    ("movielens-dat", "m.dat", "1::2::5::1\nu::2::5::1\n", 2, "UserID 'u' is not an integer"),
    ("movielens-dat", "m.dat", "1::2::5::1\n\xff\n", 2, "not valid UTF-8"),
    ("csv", "l.csv", "user_id,item,timestamp\n1,2,3\n", 1, "missing column 'item_id'"),
    ("csv", "l.csv", "user_id,item_id,timestamp\n1,2\n", 2, "expected 3 fields, found 2"),
    ("csv", "l.csv", "user_id,item_id,timestamp\n1,2,yesterday\n", 2, "unparsable timestamp"),
    ("csv", "l.csv", "user_id,item_id,timestamp\n1,2,nan\n", 2, "unparsable timestamp"),
    ("csv", "l.csv", "user_id,item_id,timestamp\n1,2,3\n1,3,2020-01-01\n", 3, "one kind"),
    ("csv", "l.csv", "user_id,item_id,timestamp\n,2,3\n", 2, "empty 'user_id'"),
    ("csv", "l.csv", "user_id,item_id,timestamp,user_id\n", 1, "appears 2 times"),
    ("csv", "l.csv", "", None, "file is empty"),
    # Tracebacks before: numbers of hundreds or thousands of digits (OverflowError in
    # float(), ValueError past int()'s 4,300 digits) and JSON nested 200,000 deep.
    ("movielens-dat", "m.dat", f"1::2::5::{'9' * 400}\n", 1, "at most 30 digits"),
    ("movielens-dat", "m.dat", f"{'7' * 5000}::2::5::1\n", 1, "is not an integer (of at most"),
    ("lastfm-hetrec", "t.dat", LASTFM_HEADER + f"2\t51\t13\t{'9' * 5000}\n", 2, "at most 30"),
    ("lastfm-hetrec", "t.dat", LASTFM_HEADER + f"2\t51\t13\t{'9' * 400}\n", 2, "at most 30"),
    ("amazon-2014", "r.json", GOOD_AMAZON.replace(": 1", f": {'9' * 400}"), 1, "at most 30"),
    ("amazon-2014", "r.json", GOOD_AMAZON.replace(": 1", f": {'9' * 5000}"), 1, "not a JSON"),
    ("amazon-2014", "r.json", "[" * 200_000 + "]" * 200_000 + "\n", 1, "not a JSON object"),
    ("yelp", "y.json", "[" * 200_000 + "]" * 200_000 + "\n", 1, "values nested too deeply"),
    ("csv", "l.csv", f"user_id,item_id,timestamp\n1,2,{'9' * 5000}\n", 2, "out of range"),
    ("csv", "l.csv", f"user_id,item_id,timestamp\n1,2,{'9' * 400}\n", 2, "out of range"),
    ("csv", "l.csv", f"user_id,item_id,timestamp\n1,2,{'9' * 400}.5\n", 2, "out of range"),
]


@pytest.mark.parametrize(
    ("fmt", "filename", "text", "line", "fragment"),
    BAD_INPUTS,
    ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_INPUTS)],
)
def test_bad_input_names_file_and_line_and_writes_nothing(
    tmp_path, fmt, filename, text, line, fragment
):
    raw = tmp_path / filename
    # "\xff" in a text stands for the invalid UTF-8 byte 0xFF.
    raw.write_bytes(text.encode("utf-8").replace("\xff".encode(), b"\xff"))
    out = tmp_path / "out"
    with pytest.raises(RawFormatError) as info:
        convert(raw, out, "bad", fmt=fmt, core=1, **quiet())
    message = str(info.value)
    assert info.value.line == line
    assert message.startswith(str(raw)) and fragment in message
    if line is not None:
        assert f"line {line}:" in message
    assert not out.exists()


def test_empty_result_after_core_filter(tmp_path):
    raw = write(tmp_path / "ratings.dat", "1::2::5::1\n1::3::5::2\n2::2::4::3\n")
    with pytest.raises(RawFormatError, match=r"ratings.dat: no interactions left after the 5-core"):
        convert(raw, tmp_path / "out", "ml", fmt="movielens-dat", **quiet())
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("cut", [0.5, -4])
def test_truncated_gzip(tmp_path, cut):
    text = "".join(
        amazon_line(f"U{k % 50}", f"I{k % 70}", k, literal=True, reviewText=f"review {k}" * 20)
        for k in range(3000)
    )
    data = gzip.compress(text.encode(), mtime=0)
    end = int(len(data) * cut) if cut > 0 else len(data) + cut
    raw = tmp_path / "reviews_Beauty_5.json.gz"
    raw.write_bytes(data[:end])
    out = tmp_path / "out"
    with pytest.raises(RawFormatError, match="truncated") as info:
        convert(raw, out, "amazon-beauty", **quiet())
    assert str(info.value).startswith(f"{raw}, line {info.value.line}:")
    assert info.value.line > 1
    assert not out.exists()


def test_corrupt_gzip_and_zip_archive(tmp_path):
    data = bytearray(gzip.compress(("1::2::5::1\n" * 5000).encode(), mtime=0))
    data[len(data) // 2] ^= 0xFF
    raw = tmp_path / "ratings.dat.gz"
    raw.write_bytes(bytes(data))
    with pytest.raises(RawFormatError, match="gzip data is corrupt"):
        convert(raw, tmp_path / "out", "ml", fmt="movielens-dat", **quiet())
    archive = write(tmp_path / "ml-1m.zip", "PK\x03\x04rest of a zip")
    with pytest.raises(RawInputError, match="is a zip archive: extract it"):
        convert(archive, tmp_path / "out", "ml-1m", **quiet())
    assert not (tmp_path / "out").exists()


def test_missing_file_and_bad_options(tmp_path):
    with pytest.raises(RawInputError, match="raw file not found: .*ratings.dat"):
        convert(tmp_path / "ratings.dat", tmp_path / "out", "ml-1m", **quiet())
    raw = write(tmp_path / "l.csv", "user_id,item_id,timestamp\n1,2,3\n")
    with pytest.raises(UsageError, match="invalid core 0"):
        convert(raw, tmp_path / "out", "x", fmt="csv", core=0, **quiet())
    with pytest.raises(UsageError, match="must name different columns"):
        TableOptions(user_col="a", item_col="a")
    with pytest.raises(UsageError, match="invalid --sep"):
        TableOptions(sep="ab")
    with pytest.raises(UsageError, match="apply to --format csv only"):
        convert(raw, tmp_path / "out", "x", fmt="yelp", table=TableOptions(), **quiet())
    assert not (tmp_path / "out").exists()


def test_failed_run_keeps_previous_output(tmp_path):
    out = tmp_path / "out"
    good = write(
        tmp_path / "ratings.dat", "".join(f"{u}::{m}::5::{m}\n" for u in (1, 2) for m in (1, 2))
    )
    convert(good, out, "ml", fmt="movielens-dat", core=2, **quiet())
    before = snapshot(out)
    bad = write(tmp_path / "ratings.dat", "1::2::5::1\n1::2::5\n")
    with pytest.raises(RawFormatError):
        convert(bad, out, "ml", fmt="movielens-dat", core=2, **quiet())
    assert snapshot(out) == before
    assert [p.name for p in (out / "ml").iterdir() if p.name.startswith(".")] == []


# --- known datasets through the CLI ----------------------------------------------


def small_amazon() -> str:
    return "".join(
        amazon_line(f"U{u}", f"I{i}", u + i, literal=True) for u in range(5) for i in range(5)
    )


# A 5 x 5 log in each known dataset's raw format (LastFM: two tags per artist).
SMALL_RAW = {
    "amazon-beauty": small_amazon,
    "amazon-sports-outdoors": small_amazon,
    "amazon-toys-games": small_amazon,
    "yelp": lambda: "".join(
        yelp_line(f"u{u}", f"b{i}", f"2019-0{1 + i}-0{1 + u} 00:00:00")
        for u in range(5)
        for i in range(5)
    ),
    "lastfm": lambda: (
        LASTFM_HEADER
        + "".join(
            f"{u}\t{a}\t{t}\t{1000 * t}\n" for u in range(1, 6) for a in range(1, 6) for t in (1, 2)
        )
    ),
    "ml-1m": lambda: "".join(
        f"{u}::{m}::{1 + m % 5}::{u * m}\n" for u in range(1, 6) for m in range(1, 6)
    ),
}


@pytest.mark.parametrize("name", sorted(SMALL_RAW))
def test_cli_known_dataset_uses_its_raw_format(tmp_path, capsys, name):
    known = KNOWN_DATASETS[name]
    raw = write(tmp_path / known.raw_file, SMALL_RAW[name](), gz=known.raw_file.endswith(".gz"))
    out = tmp_path / "out"
    assert main([name, "--raw", str(raw), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "does not match the published statistics" in err and "--no-check" in err
    assert not out.exists()

    assert main([name, "--raw", str(raw), "--out", str(out), "--quiet", "--no-check"]) == 0
    captured = capsys.readouterr()
    assert f"format {known.format}" in captured.out
    assert "5-core (1 pass) removed 0 users" in captured.out
    assert "MISMATCH" in captured.out and "warning" in captured.err
    assert len(inter_rows(out, name)) == 25
    summary = json.loads((out / name / f"{name}.stats.json").read_text())
    assert summary["matches_expected"] is False and summary["format"] == known.format


def test_cli_csv_flags_and_progress_bar(tmp_path, capsys):
    # A plain file over 1 MiB gets a progress bar.
    rows = [f"{m}::{u}::3::{u * 7 + m}" for u in range(1, 2001) for m in range(1, 41)]
    raw = write(tmp_path / "ratings.dat", "\n".join(rows) + "\n")
    assert raw.stat().st_size > 1 << 20
    out = tmp_path / "out"
    assert main(["big", "--raw", str(raw), "--out", str(out), "--format", "movielens-dat"]) == 0
    captured = capsys.readouterr()
    assert "reading ratings.dat" in captured.err
    assert "read 80,000 rows: 80,000 interactions" in captured.out

    log = write(tmp_path / "log.tsv", "u\ti\tt\tx\n1\t2\t3\t4\n1\t3\t2\t4\n")
    args = ["mine", "--raw", str(log), "--out", str(out), "--format", "csv", "--quiet"]
    assert (
        main([*args, "--user-col", "u", "--item-col", "i", "--time-col", "t", "--core", "1"]) == 0
    )
    assert idmap(out, "mine")["item"] == ["3", "2"]
    assert main([*args, "--user-col", "u"]) == 2
    assert "missing column 'item_id'" in capsys.readouterr().err


def test_cli_bad_raw_file_subprocess(tmp_path):
    raw = write(tmp_path / "reviews_Beauty_5.json.gz", GOOD_AMAZON + "{broken\n", gz=True)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dataset_prep",
            "amazon-beauty",
            "--raw",
            str(raw),
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert f"{raw}, line 2: not a JSON object or Python dict literal" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


# --- published files ---------------------------------------------------------------

needs_shared = pytest.mark.skipif(
    not (SHARED_S3REC / "LastFM.txt").exists(), reason="shared S3-Rec data not available"
)


@needs_shared
@pytest.mark.parametrize("file", ["Beauty.txt", "LastFM.txt"])
def test_published_files_number_ids_by_first_appearance(file):
    """The remap order we follow: users 1, 2, ... by line, and each new item the
    next id while the final sequences are read in order."""
    next_item = 1
    for number, line in enumerate((SHARED_S3REC / file).read_text().splitlines(), start=1):
        user, *items = map(int, line.split())
        assert user == number
        for item in items:
            assert item <= next_item
            next_item += item == next_item


@needs_shared
def test_raw_lastfm_rebuilt_from_published_file_gives_it_back(tmp_path):
    """LastFM.txt written back as a tag file, with rows shuffled within each user,
    repeated tags and equal timestamps; preparing it must give LastFM.txt again."""
    rng = random.Random(0)
    lines = [LASTFM_HEADER]
    for line in (SHARED_S3REC / "LastFM.txt").read_text().splitlines():
        user, *items = line.split()
        # Items 2k and 2k+1 share a timestamp and stay in sequence order (ties keep
        # file order); the pairs themselves come in random file order.
        pairs = [items[k : k + 2] for k in range(0, len(items), 2)]
        order = list(range(len(pairs)))
        rng.shuffle(order)
        for k in order:
            for item in pairs[k]:
                lines.append(f"{user}\t{item}\t1\t{1_000_000 + 10 * k}\n")
                if rng.random() < 0.2:  # a later tag of the same artist, at any time
                    lines.append(f"{user}\t{item}\t2\t{rng.randint(0, 2_000_000)}\n")
    raw = write(tmp_path / "user_taggedartists-timestamps.dat", "".join(lines))
    result = convert(raw, tmp_path / "out", "lastfm", **quiet())
    assert result.mismatches == []
    published = convert(SHARED_S3REC / "LastFM.txt", tmp_path / "one", "lastfm", fmt="one-line")
    assert without_real_time(result.inter_path) == published.inter_path.read_bytes()
    assert idmap(tmp_path / "out", "lastfm")["user"][:3] == ["1", "2", "3"]
    # Each item keeps its first tag row's time, milliseconds written as seconds.
    for user, times in real_times(tmp_path / "out", "lastfm").items():
        assert times == [(1_000_000 + 10 * (k // 2)) / 1000 for k in range(len(times))], user


@needs_shared
def test_raw_amazon_rebuilt_from_published_file_gives_it_back(tmp_path):
    """Beauty.txt written back as a 2014 review file (gzipped), rows
    interleaved across users so that file order differs from sequence order."""
    published = [line.split() for line in (SHARED_S3REC / "Beauty.txt").read_text().splitlines()]
    # Every user's k-th review comes after every user's (k-1)-th one.
    rows = sorted(
        (position, line_number, user, item)
        for line_number, (user, *items) in enumerate(published)
        for position, item in enumerate(items)
    )
    lines = []
    for position, _, user, item in rows:
        # Equal times for reviews 0 and 1: the tie keeps file order.
        time = 1_300_000_000 + 86_400 * max(position, 1)
        if len(lines) % 50 == 0:  # a few dict literals; they parse slowly
            lines.append(amazon_line(f"A{user}", f"B{item}", time, literal=True))
        else:  # strict JSON, formatted directly to keep the test fast
            lines.append(
                f'{{"reviewerID": "A{user}", "asin": "B{item}", '
                f'"unixReviewTime": {time}, "overall": 5.0}}\n'
            )
    raw = write(tmp_path / "reviews_Beauty_5.json.gz", "".join(lines), gz=True)
    result = convert(raw, tmp_path / "out", "amazon-beauty", **quiet())
    assert result.mismatches == [] and result.details["removed_by_core"]["interactions"] == 0
    one_line = convert(
        SHARED_S3REC / "Beauty.txt", tmp_path / "one", "amazon-beauty", fmt="one-line"
    )
    assert without_real_time(result.inter_path) == one_line.inter_path.read_bytes()
    for user, times in real_times(tmp_path / "out", "amazon-beauty").items():
        assert times == [1_300_000_000 + 86_400 * max(k, 1) for k in range(len(times))], user


# --- text encodings and line endings ----------------------------------------

ENCODING_INPUTS = {
    "one-line": ("s.txt", "1 2 3 4 5 6\n2 3 4 5 6 7\n3 4 5 6 7 8\n"),
    "csv": ("l.csv", "user_id,item_id,timestamp\nu1,a,1\nu1,b,2\nu2,a,3\nu2,c,4\n"),
    "movielens-dat": ("m.dat", "1::2::5::1\n1::3::5::2\n2::2::4::3\n2::4::4::4\n"),
}
LINE_ENDINGS = {
    "lf": lambda data: data,
    "crlf": lambda data: data.replace(b"\n", b"\r\n"),
    "cr": lambda data: data.replace(b"\n", b"\r"),
    "bom": lambda data: b"\xef\xbb\xbf" + data,
    "bom-crlf-no-final-newline": lambda data: b"\xef\xbb\xbf" + data.replace(b"\n", b"\r\n")[:-2],
    "gzip-cr": lambda data: gzip.compress(data.replace(b"\n", b"\r"), mtime=0),
}


@pytest.mark.parametrize("fmt", sorted(ENCODING_INPUTS))
@pytest.mark.parametrize("ending", sorted(LINE_ENDINGS))
def test_every_line_ending_and_a_byte_order_mark_read_the_same(tmp_path, fmt, ending):
    filename, text = ENCODING_INPUTS[fmt]
    reference = tmp_path / "reference" / filename
    reference.parent.mkdir()
    reference.write_bytes(text.encode())
    variant = tmp_path / "variant" / filename
    variant.parent.mkdir()
    variant.write_bytes(LINE_ENDINGS[ending](text.encode()))
    core = None if fmt == "one-line" else 1
    expected = convert(reference, tmp_path / "a", "d", fmt=fmt, core=core, **quiet())
    got = convert(variant, tmp_path / "b", "d", fmt=fmt, core=core, **quiet())
    assert got.inter_path.read_bytes() == expected.inter_path.read_bytes()
    assert got.stats == expected.stats
    assert got.stats.users == (3 if fmt == "one-line" else 2)


@pytest.mark.parametrize(
    "data,fragment",
    [
        ("1 2 3\n".encode("utf-16"), "is UTF-16 text"),
        ("1 2 3\n".encode("utf-32"), "is UTF-32 text"),
        ("1 2 3\n".encode("utf-16-le"), "NUL bytes on its first line"),
    ],
    ids=["utf-16", "utf-32", "utf-16-without-bom"],
)
def test_other_encodings_are_refused_in_one_line(tmp_path, data, fragment):
    raw = tmp_path / "s.txt"
    raw.write_bytes(data)
    with pytest.raises(RawInputError) as info:
        convert(raw, tmp_path / "out", "d", fmt="one-line", **quiet())
    assert fragment in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_latin1_csv_is_refused_with_the_conversion_to_make(tmp_path):
    raw = tmp_path / "l.csv"
    raw.write_bytes("user_id,item_id,timestamp\nJosé,a,1\n".encode("latin-1"))
    with pytest.raises(RawFormatError) as info:
        convert(raw, tmp_path / "out", "d", fmt="csv", core=1, **quiet())
    assert "line 2: not valid UTF-8 text" in str(info.value) and "iconv" in str(info.value)


def test_a_raw_path_that_is_a_device_is_one_line(tmp_path, capsys):
    from dataset_prep.cli import main as prep_main

    code = prep_main(["lastfm", "--raw", "/dev/zero", "--out", str(tmp_path), "--format=one-line"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "raw path /dev/zero is not a regular file" in err


# --- real times ----------------------------------------------------------------

# (format, file name, raw text, the real times in seconds of user 1's sequence)
REAL_TIME_INPUTS = [
    (
        "amazon-2014",
        "r.json",
        amazon_line("A", "x", 1300000000, literal=False)
        + amazon_line("A", "y", "1299913600", literal=True),
        [1299913600, 1300000000],
    ),
    (
        "lastfm-hetrec",
        "t.dat",
        LASTFM_HEADER + "7\t51\t1\t1275775200123\n7\t52\t1\t1275775200000\n7\t51\t2\t1\n",
        [1275775200.0, 1275775200.123],
    ),
    (
        "movielens-dat",
        "m.dat",
        "1::10::5::978300760\n1::11::3::978302109\n",
        [978300760, 978302109],
    ),
    (
        "yelp",
        "y.json",
        yelp_line("u", "b", "2019-05-05 10:00:00") + yelp_line("u", "c", "2019-05-05 10:00:01"),
        [1557050400, 1557050401],
    ),
    ("csv", "n.csv", "user_id,item_id,timestamp\nu,a,10.25\nu,b,3\n", [3, 10.25]),
    (
        "csv",
        "d.csv",
        "user_id,item_id,timestamp\nu,a,2020-01-01T01:00:00+01:00\nu,b,2020-01-01T00:30:00Z\n",
        [1577836800, 1577838600],
    ),
    ("csv", "z.csv", "user_id,item_id,timestamp\nu,a,2020-01-01 00:00:00\n", [1577836800]),
]


@pytest.mark.parametrize("fmt, file_name, text, expected", REAL_TIME_INPUTS)
def test_raw_logs_keep_their_real_times_in_seconds(
    tmp_path, capsys, fmt, file_name, text, expected
):
    """Every raw format writes the source's time as real_time (seconds), while
    timestamp keeps counting the order the procedure decided; the run says whence."""
    raw = write(tmp_path / file_name, text)
    out = tmp_path / "out"
    assert main(["mine", "--raw", str(raw), "--out", str(out), "--format", fmt, "--core", "1"]) == 0
    assert real_times(out, "mine")["1"] == expected
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("times:")]
    assert len(said) == 1 and f"real_time holds seconds from {FORMATS[fmt].real_time}" in said[0]
    summary = json.loads((out / "mine" / "mine.stats.json").read_text())
    assert summary["real_time"] == {
        "column": "real_time",
        "unit": "seconds",
        "from": FORMATS[fmt].real_time,
    }


def test_a_one_line_file_has_no_real_time_and_says_so_once(tmp_path, capsys):
    raw = write(tmp_path / "s.txt", "1 1 2 3\n2 2 3\n")
    assert main(["ones", "--raw", str(raw), "--out", str(tmp_path / "out")]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("times:")]
    assert len(said) == 1 and "no real_time column" in said[0] and "position" in said[0]
    header = (tmp_path / "out" / "ones" / "ones.inter").read_text().splitlines()[0]
    assert header == "user_id:token\titem_id:token\ttimestamp:float"
    assert (
        json.loads((tmp_path / "out" / "ones" / "ones.stats.json").read_text())["real_time"] is None
    )


def test_data_prepared_before_real_times_is_replaced_without_force(tmp_path):
    """An .inter written without real_time (before they were kept) holds the same
    interactions: preparing again adds the column; other interactions still need --force."""
    text = "".join(amazon_line(u, i, t, literal=True) for u, i, t in AMAZON_ROWS)
    raw = write(tmp_path / "a.json", text)
    out = tmp_path / "out"
    convert(raw, out, "old", fmt="amazon-2014", core=2, **quiet())
    inter = out / "old" / "old.inter"
    with_times = inter.read_bytes()
    inter.write_bytes(without_real_time(inter))
    convert(raw, out, "old", fmt="amazon-2014", core=2, **quiet())
    assert inter.read_bytes() == with_times
    inter.write_bytes(without_real_time(inter).replace(b"\n1\t1\t0\n", b"\n1\t2\t0\n", 1))
    with pytest.raises(UsageError, match="already holds a different"):
        convert(raw, out, "old", fmt="amazon-2014", core=2, **quiet())


def test_a_line_longer_than_any_log_line_is_one_error_not_a_memory_error(tmp_path, monkeypatch):
    # A 1.2 GB line was read whole (MemoryError); the bound is lowered here to test it.
    import dataset_prep.raw

    monkeypatch.setattr(dataset_prep.raw, "MAX_LINE_BYTES", 1000)
    raw = tmp_path / "l.csv"
    raw.write_text("user_id,item_id,timestamp\n1,2,3\n" + "x" * 5000 + "\n")
    with pytest.raises(RawFormatError, match=r"line 3: a line longer than 1,000 bytes"):
        convert(raw, tmp_path / "out", "long", fmt="csv", core=1, **quiet())
    raw.write_text("user_id,item_id,timestamp\n" + "".join(f"{u},{u},1\n" for u in range(9)))
    assert convert(raw, tmp_path / "out", "long", fmt="csv", core=1, **quiet()).stats.users == 9
