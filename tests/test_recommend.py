"""Recommendations from a checkpoint (--recommend) and safe checkpoint loading."""

import csv
import io
import json
import os
from pathlib import Path

import pandas as pd
import pytest
import torch
from recbole.data.interaction import Interaction
from recbole.utils.case_study import full_sort_scores, full_sort_topk

from conftest import SMALL_MODEL, permuted_items, write_sequences
from dataset_prep import convert_one_line
from recbole_freq.checkpoint.loader import (
    CheckpointError,
    UntrustedCheckpointError,
    load_checkpoint,
)
from recbole_freq.cli import main
from recbole_freq.jobs.recommend import recommend, user_ids
from recbole_freq.quick_start.quick_start import run
from recbole_freq.quick_start.restore import CheckpointMismatchError, restore_model

K = 5


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory):
    """One SASRec trained for 1 epoch on ``tiny`` (trained once for the module)."""
    work = tmp_path_factory.mktemp("recommend")
    cwd = os.getcwd()
    os.chdir(work)  # RecBole writes log/ into the working directory
    try:
        summary = run(
            "SASRec",
            "tiny",
            config_dict=dict(
                SMALL_MODEL,
                epochs=1,
                data_path=str(tiny_data),
                checkpoint_dir=str(work / "saved"),
            ),
        )
    finally:
        os.chdir(cwd)
    return summary["checkpoint"]


@pytest.fixture(scope="module")
def restored(trained):
    return restore_model(trained)


def raw_histories(tiny_data) -> dict[str, list[str]]:
    """Each user's items in time order, read from the prepared .inter file itself."""
    frame = pd.read_csv(tiny_data / "tiny" / "tiny.inter", sep="\t", dtype=str)
    frame.columns = [c.split(":")[0] for c in frame.columns]
    frame["timestamp"] = frame["timestamp"].astype(float)
    frame = frame.sort_values(["user_id", "timestamp"], kind="stable")
    return frame.groupby("user_id")["item_id"].apply(list).to_dict()


def read_csv_output(text: str) -> dict[str, list[str]]:
    rows = list(csv.DictReader(io.StringIO(text)))
    result: dict[str, list[str]] = {}
    for row in sorted(rows, key=lambda r: (r["user"], int(r["rank"]))):
        result.setdefault(row["user"], []).append(row["item"])
    return result


def test_test_context_with_kept_history_is_recboles_full_sort_topk(trained, restored, tmp_path):
    model, _, dataset, (_, _, test_data), _ = restored
    out = tmp_path / "recs.csv"
    code = main(
        [
            "--recommend",
            trained,
            "--all_users",
            f"--topk={K}",
            "--context=test",
            "--keep_history",
            "--output",
            str(out),
        ]
    )
    assert code == 0
    ours = read_csv_output(out.read_text())
    uids = test_data.dataset.inter_feat[dataset.uid_field].numpy()
    _, expected = full_sort_topk(uids, model, test_data, K)
    tokens = dataset.id2token(dataset.uid_field, uids)
    assert len(ours) == len(uids) == 60
    for token, items in zip(tokens, expected.tolist()):
        assert ours[str(token)] == [str(t) for t in dataset.id2token(dataset.iid_field, items)]


def test_test_context_excludes_history_before_the_test_item(restored, tiny_data):
    model, _, dataset, loaders, _ = restored
    test_data = loaders[2]
    splits = [loader._dataset for loader in loaders]
    histories = raw_histories(tiny_data)
    uids = test_data.dataset.inter_feat[dataset.uid_field].numpy()
    items, _ = recommend(model, splits, uids, K, context="test")
    scores = full_sort_scores(uids, model, test_data)
    tokens = dataset.id2token(dataset.uid_field, uids)
    for row, token in enumerate(tokens):
        before_test = histories[str(token)][:-1]  # the last interaction is the test item
        seen = dataset.token2id(dataset.iid_field, before_test)
        scores[row, torch.as_tensor(seen)] = -torch.inf
        recommended = set(dataset.id2token(dataset.iid_field, items[row].tolist()))
        assert not recommended & set(before_test)
    assert torch.equal(items, torch.topk(scores, K).indices)


def test_next_context_reads_whole_history_and_excludes_it(restored, tiny_data):
    model, config, dataset, loaders, _ = restored
    splits = [loader._dataset for loader in loaders]
    histories = raw_histories(tiny_data)
    tokens = sorted(histories)
    uids = user_ids(dataset, tokens)
    items, scores = recommend(model, splits, uids, K, context="next", batch_size=7)
    max_len = config["MAX_ITEM_LIST_LENGTH"]
    # Independent expectation: the last MAX_ITEM_LIST_LENGTH items of the raw history.
    seqs = torch.zeros(len(tokens), max_len, dtype=torch.long)
    lengths = torch.zeros(len(tokens), dtype=torch.long)
    for row, token in enumerate(tokens):
        recent = dataset.token2id(dataset.iid_field, histories[token][-max_len:])
        seqs[row, : len(recent)] = torch.as_tensor(recent)
        lengths[row] = len(recent)
    assert (lengths == max_len).any() and (lengths < max_len).any()  # both cases covered
    with torch.no_grad():
        expected = model.full_sort_predict(
            Interaction({model.ITEM_SEQ: seqs, model.ITEM_SEQ_LEN: lengths})
        )
    expected[:, 0] = -torch.inf
    for row, token in enumerate(tokens):
        expected[
            row, torch.as_tensor(dataset.token2id(dataset.iid_field, histories[token]))
        ] = -torch.inf
        recommended = set(dataset.id2token(dataset.iid_field, items[row].tolist()))
        assert not recommended & set(histories[token]) and "[PAD]" not in recommended
    top = torch.topk(expected, K)
    assert torch.equal(items, top.indices)
    assert torch.allclose(scores, top.values, atol=1e-5)
    # Batching does not change anything.
    again, _ = recommend(model, splits, uids, K, context="next", batch_size=512)
    assert torch.equal(items, again)


def test_users_from_file_and_json_output(trained, tmp_path, capsys):
    users = tmp_path / "users.txt"
    users.write_text("3\n\n7\n3\n")
    code = main(["--recommend", trained, "--users", str(users), "--topk=3", "--format=json"])
    assert code == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["user"] for r in records] == ["3", "7"]
    assert all(len(r["items"]) == len(r["scores"]) == 3 for r in records)
    assert all(r["scores"] == sorted(r["scores"], reverse=True) for r in records)


def test_unknown_users_are_skipped_and_listed(trained, capsys):
    code = main(["--recommend", trained, "--users", "1,nobody,99999", "--topk=3"])
    captured = capsys.readouterr()
    assert code == 0
    assert "warning: skipped 2 unknown user token(s)" in captured.err
    assert "'nobody'" in captured.err and "'99999'" in captured.err
    assert {row["user"] for row in csv.DictReader(io.StringIO(captured.out))} == {"1"}
    assert main(["--recommend", trained, "--users", "nobody,99999"]) == 2
    assert "all 2 user token(s)" in capsys.readouterr().err


def test_missing_checkpoint_is_a_clear_error(capsys):
    code = main(["--recommend", "saved/nope.pth", "--users", "1"])
    assert code == 2
    assert "checkpoint 'saved/nope.pth' does not exist" in capsys.readouterr().err


def test_checkpoint_of_another_dataset_is_refused(trained, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    convert_one_line(
        write_sequences(other / "tiny.txt", n_items=55, seed=3), other, "tiny", show_progress=False
    )
    with pytest.raises(CheckpointMismatchError, match="was trained on dataset 'tiny' with"):
        restore_model(trained, data_path=other)
    code = main(["--recommend", trained, "--users", "1", "--data_path", str(other)])
    err = capsys.readouterr().err
    assert code == 2 and "now holds sha256" in err and "--data_path" in err
    # A checkpoint from before fingerprints were recorded: the weights' shapes still tell.
    old = load_checkpoint(trained)
    old["config"]["dataset_sha256"] = None
    unfingerprinted = tmp_path / "old.pth"
    torch.save(old, unfingerprinted, pickle_protocol=4)
    with pytest.raises(CheckpointMismatchError, match="does not fit dataset 'tiny'"):
        restore_model(unfingerprinted, data_path=other, trust_data=True)


def test_a_checkpoint_without_a_dataset_fingerprint_needs_trust_data(
    trained, tiny_data, tmp_path, capsys
):
    # Same users, same item count, items permuted: the weights fit, and the old
    # checkpoint (no fingerprint) recommended other items with the same scores, exit 0.
    other = tmp_path / "other"
    permuted = permuted_items(tiny_data / "tiny.txt", tmp_path / "permuted.txt")
    convert_one_line(permuted, other, "tiny", show_progress=False)
    old = load_checkpoint(trained)
    old["config"]["dataset_sha256"] = None
    unfingerprinted = str(tmp_path / "old.pth")
    torch.save(old, unfingerprinted, pickle_protocol=4)
    with pytest.raises(CheckpointMismatchError, match="records no dataset fingerprint"):
        restore_model(unfingerprinted, data_path=other)
    for job in (["--recommend", unfingerprinted, "--users", "1"], ["--evaluate", unfingerprinted],
                ["--analyze", unfingerprinted, "--out", str(tmp_path / "analysis")]):  # fmt: skip
        assert main([*job, "--data_path", str(other)]) == 2, job
        err = capsys.readouterr().err
        assert "records no dataset fingerprint" in err and "--trust_data" in err
        assert err.count("\n") == 1, err
    assert not (tmp_path / "analysis").exists()
    # The user's word: used on the data found.
    recommend_argv = ["--recommend", unfingerprinted, "--users", "1", "--trust_data"]
    assert main([*recommend_argv, "--data_path", str(other)]) == 0
    assert main(["--trust_data", "--epochs=1"]) == 2
    assert "--trust_data goes with --resume" in capsys.readouterr().err


# --- safe loading ----------------------------------------------------------------------


def _write_marker(path):
    Path(path).write_text("code ran")


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (_write_marker, (self.marker,))


class _CallsConfig:
    def __reduce__(self):
        from recbole_freq.config.configurator import FreqConfig

        return (FreqConfig, ("SASRec", "tiny"))


def test_real_checkpoint_loads_safely(trained):
    checkpoint = load_checkpoint(trained)
    trusted = torch.load(trained, weights_only=False)
    assert type(checkpoint["config"]).__name__ == "FreqConfig"
    assert checkpoint["config"]["model"] == "SASRec" and checkpoint["epoch"] == trusted["epoch"]
    assert checkpoint["state_dict"].keys() == trusted["state_dict"].keys()
    for name, value in trusted["state_dict"].items():
        assert torch.equal(checkpoint["state_dict"][name], value)


def test_malicious_checkpoint_is_refused_and_runs_nothing(trained, tmp_path):
    marker = tmp_path / "marker"
    evil = tmp_path / "evil.pth"
    genuine = torch.load(trained, weights_only=False)
    # A real checkpoint with a payload next to the genuine entries, in RecBole's protocol.
    torch.save({**genuine, "other_parameter": _Payload(marker)}, evil, pickle_protocol=4)
    with pytest.raises(UntrustedCheckpointError, match="_write_marker"):
        load_checkpoint(evil)
    assert not marker.exists()
    code = main(["--recommend", str(evil), "--users", "1"])
    assert code == 2 and not marker.exists()


def test_allowed_class_may_not_be_called(tmp_path):
    # FreqConfig is allowed, but only to be rebuilt from its state, never constructed.
    path = tmp_path / "calls.pth"
    torch.save({"config": _CallsConfig(), "state_dict": {}}, path, pickle_protocol=4)
    with pytest.raises(UntrustedCheckpointError, match="may not be called"):
        load_checkpoint(path)


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "notes.pth"
    path.write_text("hello")
    with pytest.raises(CheckpointError, match="not a checkpoint written by torch.save"):
        load_checkpoint(path)
    weights = tmp_path / "weights.pth"
    torch.save({"w": torch.ones(2)}, weights)
    with pytest.raises(CheckpointError, match="is not a RecBole checkpoint"):
        load_checkpoint(weights)


@pytest.fixture(scope="module")
def shop_log(tmp_path_factory):
    """A CSV log with raw string ids, prepared by dataset_prep (which re-maps the ids and
    writes shop.idmap.json), and a SASRec trained on it."""
    import random

    from dataset_prep import convert

    work = tmp_path_factory.mktemp("shop")
    rng = random.Random(3)
    rows = ["user_id,item_id,timestamp"]
    for user in range(30):
        start = rng.randint(0, 19)
        for step in range(rng.randint(5, 9)):
            rows.append(f"cust-{user:03d},sku-{(start + step) % 20:02d},{1000 + 10 * step}")
    (work / "log.csv").write_text("\n".join(rows) + "\n")
    convert(work / "log.csv", work / "data", "shop", fmt="csv", core=1, show_progress=False)
    cwd = os.getcwd()
    os.chdir(work)
    try:
        config = dict(
            SMALL_MODEL, epochs=1, data_path=str(work / "data"), checkpoint_dir=str(work / "saved")
        )
        summary = run("SASRec", "shop", config_dict=config)
    finally:
        os.chdir(cwd)
    return work, summary["checkpoint"]


def test_recommend_takes_and_prints_raw_ids_through_the_id_map(shop_log, tmp_path, capsys):
    work, checkpoint = shop_log
    users = tmp_path / "users.txt"
    users.write_text("# customers to email\ncust-004\ncust-017   # VIP\n\n")
    assert main(["--recommend", checkpoint, "--users", str(users), "--topk", "3"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {r["user"] for r in rows} == {"cust-004", "cust-017"} and len(rows) == 6
    assert all(r["item"].startswith("sku-") for r in rows)
    # The same ranking as through the .inter tokens.
    idmap = json.loads((work / "data" / "shop" / "shop.idmap.json").read_text())
    token = str(idmap["user"].index("cust-004") + 1)
    assert (
        main(["--recommend", checkpoint, "--users", token, "--ids", "tokens", "--topk", "3"]) == 0
    )
    by_token = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [idmap["item"][int(r["item"]) - 1] for r in by_token] == [
        r["item"] for r in rows if r["user"] == "cust-004"
    ]
    assert main(["--recommend", checkpoint, "--users", "cust-999"]) == 2
    assert "all 1 user id(s) (raw ids of the prepared log" in capsys.readouterr().err


def test_ids_raw_without_an_id_map_is_a_clear_error(trained, capsys):
    assert main(["--recommend", trained, "--users", "1", "--ids", "raw"]) == 2
    assert "has no id map" in capsys.readouterr().err


def test_unknown_users_read_from_a_file_are_counted_not_quoted(trained, tmp_path, capsys):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret-hash:19000:0:99999:7:::\nalice:$6$another:19000::::::\n")
    assert main(["--recommend", trained, "--users", str(secret)]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the line naming the checkpoint
    assert err.startswith("error: all 2 user token(s)")
    assert "secret-hash" not in err and "alice" not in err
    assert f"the lines of {secret} are not quoted" in err


@pytest.fixture(scope="module")
def with_single_interaction_user(tmp_path_factory):
    """``short`` (the tiny data plus user 900 with one interaction) and a SASRec on it."""
    work = tmp_path_factory.mktemp("short")
    (work / "short").mkdir()
    lines = ["user_id:token\titem_id:token\ttimestamp:float"]
    for user in range(1, 31):
        for step in range(6):
            lines.append(f"{user}\t{(user + step * 3) % 20 + 1}\t{len(lines)}")
    lines.append(f"900\t7\t{len(lines)}")
    (work / "short" / "short.inter").write_text("\n".join(lines) + "\n")
    cwd = os.getcwd()
    os.chdir(work)
    try:
        summary = run(
            "SASRec",
            "short",
            config_dict=dict(
                SMALL_MODEL, epochs=1, data_path=str(work), checkpoint_dir=str(work / "saved")
            ),
        )
    finally:
        os.chdir(cwd)
    return summary["checkpoint"]


def test_all_users_reads_a_single_interaction_as_a_history(with_single_interaction_user, capsys):
    """One item is a history: user 900 gets recommendations read from it (that item not
    among them); under --context test, where no test row exists, the user is skipped
    and named in one line."""
    checkpoint = with_single_interaction_user
    assert main(["--recommend", checkpoint, "--all_users", "--topk=3"]) == 0
    captured = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(captured.out)))
    assert {row["user"] for row in rows} == {str(u) for u in range(1, 31)} | {"900"}
    single = [row["item"] for row in rows if row["user"] == "900"]
    assert len(single) == 3 and "7" not in single
    assert "skipped" not in captured.err

    model, config, dataset, loaders, _ = restore_model(checkpoint)
    splits = [loader._dataset for loader in loaders]
    from recbole_freq.jobs.recommend import single_item_histories, user_inputs, users_without_rows

    uid = user_ids(dataset, ["900"])
    assert users_without_rows(splits, uid, "next").tolist() == uid.tolist()
    histories = single_item_histories(config, uid, [model.ITEM_ID])
    item_seq, lengths, _ = user_inputs(model, splits, uid, "next", histories)
    assert lengths.tolist() == [1] and item_seq[0, 0] == dataset.token2id(dataset.iid_field, "7")

    assert main(["--recommend", checkpoint, "--all_users", "--context", "test"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("skipped") == 1
    assert "skipped 1 user(s) with no test row (too few interactions): 900" in captured.err
    assert "900" not in {row["user"] for row in csv.DictReader(io.StringIO(captured.out))}


def test_a_preparation_killed_between_its_renames_is_refused_until_prepared_again(
    shop_log, tmp_path, monkeypatch, capsys
):
    import shutil

    import dataset_prep.atomic
    from dataset_prep import convert

    work, checkpoint = shop_log
    data = tmp_path / "data"
    shutil.copytree(work / "data", data)
    # Another log: customers renamed, the first one's rows left out.
    other = tmp_path / "other.csv"
    header, *rows = (work / "log.csv").read_text().splitlines()
    kept_rows = [row.replace("cust-", "client-") for row in rows if not row.startswith("cust-000,")]
    other.write_text("\n".join([header, *kept_rows]) + "\n")
    real_replace, renamed = os.replace, []

    def killed_after_the_first_rename(source, target):
        if renamed:
            raise KeyboardInterrupt  # the process dies here; what was renamed stays
        real_replace(source, target)
        renamed.append(target)

    monkeypatch.setattr(dataset_prep.atomic.os, "replace", killed_after_the_first_rename)
    with pytest.raises(KeyboardInterrupt):
        convert(other, data, "shop", fmt="csv", core=1, show_progress=False, force=True)
    monkeypatch.undo()
    assert [Path(path).name for path in renamed] == ["shop.inter"]
    # The new .inter beside the old manifest and id map: trained on, the model
    # recommended the first log's raw ids with exit 0.
    argv = ["--dataset=shop", "--epochs=1", f"--data_path={data}", f"--checkpoint_dir={tmp_path}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "shop.inter is not the file shop.stats.json records" in err
    assert "python -m dataset_prep" in err and err.count("\n") == 1
    assert main(["--recommend", checkpoint, "--users", "1", "--data_path", str(data)]) == 2
    assert "a preparation was interrupted" in capsys.readouterr().err
    # An id map left beside a manifest that names none, or missing where it names one.
    convert(other, data, "shop", fmt="csv", core=1, show_progress=False, force=True)
    idmap = data / "shop" / "shop.idmap.json"
    kept = idmap.read_bytes()
    idmap.write_bytes(kept.replace(b"client-", b"cust-"))
    assert main(argv) == 2
    assert "shop.idmap.json is not the id map" in capsys.readouterr().err
    idmap.unlink()
    assert main(argv) == 2
    assert "shop.idmap.json, which shop.stats.json names, is missing" in capsys.readouterr().err
