"""Noise injection (``recbole_freq.data.noise``): which rows it corrupts, reproducibly, and
what stays clean for evaluation."""

import pytest
import torch

from conftest import prepare
from recbole_freq.data.noise import corrupt_sequences
from recbole_freq.quick_start.quick_start import run


def histories_of(dataset):
    feat = dataset.inter_feat
    return {key: feat[key].clone() for key in ("user_id", "item_id", "item_id_list", "item_length")}


def test_noise_corrupts_the_given_fraction_reproducibly_and_leaves_evaluation_clean(
    small_config,
):
    _, train, valid, test = prepare("SASRec", small_config)
    datasets = [loader._dataset for loader in (train, valid, test)]
    clean = [histories_of(d) for d in datasets]
    stats = corrupt_sequences(*datasets, ratio=0.2, seed=11, scope="train")
    noisy_train = histories_of(datasets[0])
    assert stats["replaced"] == round(0.2 * stats["training_interactions"])
    # Validation and test rows are untouched.
    for before, dataset in zip(clean[1:], datasets[1:]):
        after = histories_of(dataset)
        assert all(torch.equal(before[k], after[k]) for k in before)
    # Each interaction changed once: count it in the per-user sequences (first rows'
    # history item + every target), and check every history is a window of them.
    changed = (noisy_train["item_id"] != clean[0]["item_id"]).sum().item()
    first = clean[0]["item_length"] == 1
    changed += (
        (noisy_train["item_id_list"][first, 0] != clean[0]["item_id_list"][first, 0]).sum().item()
    )
    assert changed == stats["replaced"]
    corrupt_sequences(*datasets, ratio=0.0, seed=0)  # re-checks the prefix layout
    held_out = {}
    for dataset in datasets[1:]:
        for u, i in zip(
            dataset.inter_feat["user_id"].tolist(), dataset.inter_feat["item_id"].tolist()
        ):
            held_out.setdefault(u, set()).add(i)
    replaced = noisy_train["item_id"] != clean[0]["item_id"]
    for u, i in zip(
        noisy_train["user_id"][replaced].tolist(), noisy_train["item_id"][replaced].tolist()
    ):
        assert i not in held_out.get(u, set()) and i != 0

    # Same seed, same corruption; another seed, another one.
    _, train2, valid2, test2 = prepare("SASRec", small_config)
    again = [loader._dataset for loader in (train2, valid2, test2)]
    corrupt_sequences(*again, ratio=0.2, seed=11)
    assert torch.equal(histories_of(again[0])["item_id_list"], noisy_train["item_id_list"])
    _, train3, valid3, test3 = prepare("SASRec", small_config)
    other = [loader._dataset for loader in (train3, valid3, test3)]
    corrupt_sequences(*other, ratio=0.2, seed=12)
    assert not torch.equal(histories_of(other[0])["item_id"], noisy_train["item_id"])


def test_noise_observed_scope_shares_corrupted_histories_with_evaluation(small_config):
    _, train, valid, test = prepare("SASRec", small_config)
    datasets = [loader._dataset for loader in (train, valid, test)]
    clean = [histories_of(d) for d in datasets]
    corrupt_sequences(*datasets, ratio=0.3, seed=3, scope="observed")
    for before, dataset in zip(clean[1:], datasets[1:]):
        after = histories_of(dataset)
        assert torch.equal(before["item_id"], after["item_id"])  # targets stay clean
        assert not torch.equal(before["item_id_list"], after["item_id_list"])
    # A validation history ends with the user's (corrupted) last training target.
    train_feat, valid_feat = datasets[0].inter_feat, datasets[1].inter_feat
    last_target = {}
    order = torch.argsort(train_feat["timestamp"], stable=True).tolist()
    for u, i in zip(train_feat["user_id"][order].tolist(), train_feat["item_id"][order].tolist()):
        last_target[u] = i
    for u, hist, length in zip(
        valid_feat["user_id"].tolist(), valid_feat["item_id_list"], valid_feat["item_length"]
    ):
        assert hist[length - 1].item() == last_target[u]


def test_noise_switch_runs_end_to_end(small_config):
    summary = run(
        "SASRec", "tiny", cmd_overrides=dict(small_config, epochs=1, noise_ratio=0.2), saved=False
    )
    assert summary["noise"]["replaced"] == round(0.2 * summary["noise"]["training_interactions"])


@pytest.mark.parametrize("ratio", [1.0, -0.1, 1.5])
def test_noise_ratio_outside_unit_interval_is_rejected(small_config, ratio):
    with pytest.raises(ValueError, match=rf"noise_ratio={ratio} must lie in \[0, 1\)"):
        run("SASRec", "tiny", cmd_overrides=dict(small_config, noise_ratio=ratio), saved=False)


def training_sequences(prefix_rows) -> dict:
    """Each user's training sequence from RecBole's prefix rows: the first row's history
    item, then every row's target, in order of history length."""
    feat = prefix_rows.inter_feat
    rows = sorted(
        zip(feat["user_id"].tolist(), feat["item_length"].tolist(), range(len(feat))),
    )
    sequences = {}
    for user, length, row in rows:
        if length == 1:
            sequences[user] = [feat["item_id_list"][row, 0].item()]
        sequences[user].append(feat["item_id"][row].item())
    return sequences


def test_noise_reaches_the_rows_a_protocol_builds(small_config):
    """Under --protocol=sasrec the training rows are rebuilt per user; they hold the
    corrupted sequence that RecBole's prefix rows hold under the same noise, and the
    evaluation histories share it (noise_scope observed)."""
    noisy = dict(small_config, noise_ratio=0.3, noise_scope="observed")
    _, prefix, _, _ = prepare("SASRec", noisy)
    assert prefix.noise_report["replaced"] > 0
    corrupted = training_sequences(prefix._dataset)
    _, clean_prefix, _, _ = prepare("SASRec", small_config)
    assert corrupted != training_sequences(clean_prefix._dataset)

    _, train, valid, _ = prepare("SASRec", dict(noisy, protocol="sasrec"))
    assert train.noise_report == prefix.noise_report
    feat = train._dataset.inter_feat
    for user, items, length, target in zip(
        feat["user_id"].tolist(),
        feat["item_id_list"],
        feat["item_length"].tolist(),
        feat["item_id"].tolist(),
    ):
        row = items[:length].tolist() + [target]
        assert row == corrupted[user][-len(row) :]
    valid_feat = valid._dataset.inter_feat
    for user, items, length in zip(
        valid_feat["user_id"].tolist(), valid_feat["item_id_list"], valid_feat["item_length"]
    ):
        assert items[length - 1].item() == corrupted[user][-1]
