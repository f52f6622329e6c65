"""CL4SRec (``recbole_freq.model.CL4SRec``): each augmentation operator against its
definition, the two views, ``lmd: 0`` against RecBole's SASRec on shared weights, the
loss terms and the training through the real pipeline."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from recbole.model.sequential_recommender import SASRec

from conftest import assert_same_as_recbole, first_batch, prepare
from recbole_freq.cli import main
from recbole_freq.model import BASELINES, CL4SRec
from recbole_freq.model.contrastive import (
    item_crop,
    item_mask,
    item_reorder,
    nt_xent,
    two_augmented_views,
)
from recbole_freq.quick_start.quick_start import run

MASK = 10_000  # above every item id batch_of makes
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attn_dropout_prob": 0.0}


def batch_of(lengths, width=12):
    """Left-aligned sequences of distinct items 1..n (0 after), as RecBole holds them."""
    seqs = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        seqs[row, :n] = torch.arange(1, n + 1) + 10 * row
    return seqs, torch.tensor(lengths)


lengths_strategy = st.lists(st.integers(1, 12), min_size=1, max_size=6)
ratio_strategy = st.floats(0.05, 1.0)


@settings(max_examples=40, deadline=None)
@given(lengths_strategy, ratio_strategy, st.integers(0, 2**16))
def test_crop_keeps_a_contiguous_run_of_floor_eta_n_items(lengths, eta, seed):
    torch.manual_seed(seed)
    seqs, lens = batch_of(lengths)
    cropped, kept = item_crop(seqs, lens, eta)
    for row, n in enumerate(lengths):
        k = min(n, max(1, math.floor(n * eta)))
        assert kept[row] == k and (cropped[row, k:] == 0).all()
        original = seqs[row, :n].tolist()
        run_ = cropped[row, :k].tolist()
        start = original.index(run_[0])
        assert original[start : start + k] == run_


@settings(max_examples=40, deadline=None)
@given(lengths_strategy, ratio_strategy, st.integers(0, 2**16))
def test_mask_replaces_floor_gamma_n_items(lengths, gamma, seed):
    torch.manual_seed(seed)
    seqs, lens = batch_of(lengths)
    masked, same_lengths = item_mask(seqs, lens, gamma, MASK)
    assert torch.equal(same_lengths, lens)
    for row, n in enumerate(lengths):
        assert int((masked[row] == MASK).sum()) == math.floor(n * gamma)
        assert ((masked[row, :n] == MASK) | (masked[row, :n] == seqs[row, :n])).all()
        assert (masked[row, n:] == 0).all()


@settings(max_examples=40, deadline=None)
@given(lengths_strategy, ratio_strategy, st.integers(0, 2**16))
def test_reorder_shuffles_one_window_of_floor_beta_n_items(lengths, beta, seed):
    torch.manual_seed(seed)
    seqs, lens = batch_of(lengths)
    reordered, _ = item_reorder(seqs, lens, beta)
    for row, n in enumerate(lengths):
        original, ours = seqs[row].tolist(), reordered[row].tolist()
        assert sorted(original) == sorted(ours) and ours[n:] == original[n:]
        moved = [i for i in range(len(original)) if original[i] != ours[i]]
        if moved:  # the changed positions lie in one window of floor(beta * n)
            assert moved[-1] - moved[0] + 1 <= math.floor(n * beta)


def test_two_views_use_two_different_operators():
    torch.manual_seed(0)
    seqs, lens = batch_of([1, 2, 5, 8, 12] * 20)
    first, second, operators = two_augmented_views(seqs, lens, 0.6, 0.3, 0.6, MASK)
    single = lens <= 1
    assert (operators[single] == -1).all() and torch.equal(first[0][single], seqs[single])
    assert (operators[~single, 0] != operators[~single, 1]).all()
    assert set(operators[~single].flatten().tolist()) == {0, 1, 2}
    for (view, view_len), column in ((first, 0), (second, 1)):
        cropped = operators[:, column] == 0
        assert (view_len[cropped] < lens[cropped]).all()
        masked = operators[:, column] == 1
        assert ((view[masked] == MASK).sum(dim=1) == (lens[masked] * 0.3).floor()).all()


def test_lmd_zero_is_recboles_sasrec(small_config):
    config, train, _, test = prepare("CL4SRec", dict(small_config, lmd=0, **NO_DROPOUT))
    model = CL4SRec(config, train._dataset)
    assert model.auxiliary_losses() == []
    assert_same_as_recbole(model, SASRec(config, train._dataset), config, train, test)


def test_the_loss_is_ce_plus_lmd_times_nt_xent_of_the_two_views(small_config):
    config, train, _, _ = prepare("CL4SRec", dict(small_config, lmd=0.4, tau=0.5))
    model = CL4SRec(config, train._dataset)
    model.eval()
    batch = first_batch(train)
    item_seq, lengths = batch[model.ITEM_SEQ], batch[model.ITEM_SEQ_LEN]
    with torch.no_grad():
        torch.manual_seed(5)
        loss = model.calculate_loss(batch).item()
        output = model.forward(item_seq, lengths)
        cross_entropy = torch.nn.functional.cross_entropy(
            output @ model.item_scores_weight.t(), batch[model.POS_ITEM_ID]
        )
        torch.manual_seed(5)
        (first, first_len), (second, second_len), _ = model.augmented_views(item_seq, lengths)
        contrast = nt_xent(model.forward(first, first_len), model.forward(second, second_len), 0.5)
    assert loss == pytest.approx(cross_entropy.item() + 0.4 * contrast.item(), rel=1e-5)
    # the [mask] token is an input only: never scored
    assert model.full_sort_predict(first_batch(train)).size(1) == model.n_items


def test_cl4srec_trains_and_evaluates_and_is_a_baseline(small_config):
    summary = run("CL4SRec", "tiny", cmd_overrides=dict(small_config, epochs=1), saved=False)
    assert summary["epochs_run"] == 1 and summary["config"]["crop_eta"] == 0.6
    assert summary["history"][0]["train_loss"] > 0
    assert "CL4SRec" in BASELINES


@pytest.mark.parametrize(
    "setting, message",
    [
        ("--crop_eta=0", "crop_eta=0 must be a proportion in (0, 1]"),
        ("--mask_gamma=1.5", "mask_gamma=1.5 must be a proportion in (0, 1]"),
        ("--lmd=-0.1", "lmd=-0.1 must be a number >= 0"),
        ("--sim=l2", "sim='l2' is unknown"),
    ],
)
def test_bad_settings_are_one_line(small_config, capsys, setting, message):
    args = [f"--{key}={value}" for key, value in small_config.items()]
    assert main(["--model=CL4SRec", "--dataset=tiny", *args, setting]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
