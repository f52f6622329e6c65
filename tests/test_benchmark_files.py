"""Pre-split datasets (RecBole's ``benchmark_filename``: ``<dataset>.train.inter``,
``.valid.inter``, ``.test.inter``, one row per prefix) work under every protocol and give
the rows that the same data as one ``.inter`` file gives."""

import pytest
import torch

from conftest import SMALL_MODEL
from recbole_freq.config.configurator import FreqConfig
from recbole_freq.data.guard import DatasetNotPreparedError, dataset_fingerprint
from recbole_freq.protocol import HISTORY_LENGTH, HISTORY_START, POSITION_TARGETS, ProtocolError
from recbole_freq.quick_start.quick_start import load_splits, run

PARTS = ["train", "valid", "test"]
PROTOCOLS = ["recbole", "bsarec", "sasrec", "fmlprec", "uni100"]


def write_pre_split(tiny_data, folder, drop_first_train_row=False):
    """RecBole's own split of ``tiny`` written as benchmark files under ``folder/tiny``."""
    config = FreqConfig("SASRec", "tiny", config_dict=dict(SMALL_MODEL, data_path=str(tiny_data)))
    _, loaders = load_splits(config)
    (folder / "tiny").mkdir(parents=True)
    for part, loader in zip(PARTS, loaders):
        dataset = loader._dataset
        feat = dataset.inter_feat
        lines = ["user_id:token\titem_id_list:token_seq\titem_id:token"]
        seen = set()
        for user, items, length, target in zip(
            feat["user_id"].numpy(), feat["item_id_list"].numpy(),
            feat["item_length"].numpy(), feat["item_id"].numpy(),
        ):  # fmt: skip
            if drop_first_train_row and part == "train" and user not in seen:
                seen.add(user)
                continue
            tokens = dataset.id2token("item_id", items[:length])
            lines.append(
                f"{dataset.id2token('user_id', user)}\t{' '.join(tokens)}\t"
                f"{dataset.id2token('item_id', target)}"
            )
        (folder / "tiny" / f"tiny.{part}.inter").write_text("\n".join(lines) + "\n")
    return folder


def token_rows(loader) -> list[tuple]:
    """Every row of a loader in tokens: user, input, target, and the protocol's extra
    fields (the masked history of an evaluation row, the per-position targets)."""
    dataset = loader._dataset
    feat = dataset.inter_feat
    item_tokens = lambda ids: tuple(dataset.id2token("item_id", ids))  # noqa: E731
    rows = []
    for index in range(len(feat)):
        length = int(feat["item_length"][index])
        row = [
            dataset.id2token("user_id", int(feat["user_id"][index])),
            item_tokens(feat["item_id_list"][index][:length].numpy()),
            dataset.id2token("item_id", int(feat["item_id"][index])),
        ]
        if HISTORY_START in feat:
            histories = dataset.protocol_histories
            _, items = histories.items_of(
                feat[HISTORY_START][index : index + 1], feat[HISTORY_LENGTH][index : index + 1]
            )
            row.append(item_tokens(items.numpy()))
        if POSITION_TARGETS in feat:
            targets = feat[POSITION_TARGETS][index]
            row.append(item_tokens(targets[targets > 0].numpy()))
        rows.append(tuple(row))
    return sorted(rows)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pre_split_files_give_the_rows_of_the_same_data_in_one_file(tiny_data, tmp_path, protocol):
    pre_split = write_pre_split(tiny_data, tmp_path / "pre-split")
    settings = dict(SMALL_MODEL, protocol=protocol)
    whole = FreqConfig("SASRec", "tiny", config_dict=dict(settings, data_path=str(tiny_data)))
    parts = FreqConfig(
        "SASRec",
        "tiny",
        config_dict=dict(settings, data_path=str(pre_split), benchmark_filename=PARTS),
    )
    _, from_whole = load_splits(whole)
    _, from_parts = load_splits(parts)
    for whole_loader, parts_loader in zip(from_whole, from_parts):
        assert token_rows(parts_loader) == token_rows(whole_loader)
    # Sampled evaluation draws its negatives from the user's unseen items, as from one file.
    if protocol in ("sasrec", "uni100", "fmlprec"):
        assert from_parts[2].neg_sample_num == from_whole[2].neg_sample_num > 0


@pytest.mark.parametrize("protocol", ["recbole", "bsarec"])
def test_a_run_trains_and_tests_on_pre_split_files(tiny_data, tmp_path, protocol):
    pre_split = write_pre_split(tiny_data, tmp_path / "pre-split")
    settings = dict(
        SMALL_MODEL, protocol=protocol, data_path=str(pre_split), benchmark_filename=PARTS,
        checkpoint_dir=str(tmp_path / "saved"),
    )  # fmt: skip
    summary = run("BSARec", "tiny", config_dict=settings)
    assert summary["epochs_run"] == 2 and 0 < summary["test_result"]["ndcg@20"] <= 1
    config = FreqConfig("BSARec", "tiny", config_dict=settings)
    # The fingerprint covers every part: a changed test file is another dataset.
    before = dataset_fingerprint(config)
    assert before == summary["dataset_sha256"]
    test_file = pre_split / "tiny" / "tiny.test.inter"
    lines = test_file.read_text().splitlines()
    test_file.write_text("\n".join(lines[:-1]) + "\n")
    assert dataset_fingerprint(config) != before


def test_rows_that_are_not_every_prefix_are_refused_by_a_protocol_that_rebuilds_histories(
    tiny_data, tmp_path
):
    pre_split = write_pre_split(tiny_data, tmp_path / "pre-split", drop_first_train_row=True)
    settings = dict(SMALL_MODEL, data_path=str(pre_split), benchmark_filename=PARTS)
    with pytest.raises(ProtocolError, match=r"row 1 of the 'train' file \(user \w+\) is not"):
        load_splits(FreqConfig("SASRec", "tiny", config_dict=dict(settings, protocol="bsarec")))
    # RecBole's protocol trains on the rows as given.
    _, (train, _, _) = load_splits(FreqConfig("SASRec", "tiny", config_dict=settings))
    assert len(train._dataset) > 0


def test_missing_part_and_missing_columns_are_one_line_errors(tiny_data, tmp_path):
    pre_split = write_pre_split(tiny_data, tmp_path / "pre-split")
    settings = dict(
        SMALL_MODEL, data_path=str(pre_split), benchmark_filename=PARTS,
        checkpoint_dir=str(tmp_path / "saved"),
    )  # fmt: skip
    (pre_split / "tiny" / "tiny.valid.inter").unlink()
    with pytest.raises(DatasetNotPreparedError, match=r"tiny\.valid\.inter does not exist"):
        run("SASRec", "tiny", config_dict=settings)
    # A plain interaction file is no pre-split sequential file.
    (pre_split / "tiny" / "tiny.valid.inter").write_text("user_id:token\titem_id:token\n1\t2\n")
    with pytest.raises(ValueError, match=r"missing: \['item_id_list'\]"):
        run("SASRec", "tiny", config_dict=settings)
    with pytest.raises(ValueError, match="give the three parts in order"):
        FreqConfig("SASRec", "tiny", config_dict=dict(settings, benchmark_filename=["train"]))


def test_pre_split_input_lists_share_the_targets_item_ids(tiny_data, tmp_path):
    pre_split = write_pre_split(tiny_data, tmp_path / "pre-split")
    config = FreqConfig(
        "SASRec", "tiny", config_dict=dict(SMALL_MODEL, data_path=str(pre_split),
                                           benchmark_filename=PARTS),
    )  # fmt: skip
    assert config["alias_of_item_id"] == ["item_id_list"] and config["load_col"] is None
    _, (train, _, _) = load_splits(config)
    feat = train._dataset.inter_feat
    # Each row's target is the next row's last input item, in one id space.
    same_user = feat["user_id"][1:] == feat["user_id"][:-1]
    next_last = feat["item_id_list"][1:].gather(1, (feat["item_length"][1:] - 1)[:, None])[:, 0]
    assert same_user.sum() > 100
    assert torch.equal(next_last[same_user], feat["item_id"][:-1][same_user])


def test_input_lists_longer_than_max_item_list_length_are_one_line(tiny_data, tmp_path):
    pre_split = write_pre_split(tiny_data, tmp_path / "pre-split")
    settings = dict(
        SMALL_MODEL, data_path=str(pre_split), benchmark_filename=PARTS,
        checkpoint_dir=str(tmp_path / "saved"), MAX_ITEM_LIST_LENGTH=5,
    )  # fmt: skip
    with pytest.raises(
        ValueError,
        match=r"tiny\.train\.inter, line \d+: an input list of \d+ items, more than MAX_ITEM_LIST_LENGTH=5",
    ):
        run("SASRec", "tiny", config_dict=settings)
