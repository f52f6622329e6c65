"""SSE-PT (``recbole_freq.model.SSEPT``) and the core's personalised input and score:
the score against eq. 5 written out at every position, the stochastic shared
embeddings' replacement rates, without a user part it is RecBole's SASRec, training
through the real pipeline and protocols, bad settings refused; Rec-Denoiser on it."""

import math

import pytest
import torch
from recbole.model.sequential_recommender import SASRec

from conftest import (
    assert_all_ones_masks_give_the_backbone,
    assert_same_as_recbole,
    first_batch,
    prepare,
)
from recbole_freq.model import BASELINES, MODELS, SSEPT, RecDenoiser
from recbole_freq.model.personal import stochastic_shared
from recbole_freq.quick_start.quick_start import run

NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attn_dropout_prob": 0.0}
NO_SSE = {"sse_user_prob": 0.0, "sse_item_prob": 0.0}


def test_scores_are_eq_5_at_every_position(small_config):
    """``<h_t, [v_l; u_i]>``: the hidden state against the item's embedding concatenated
    with the row's user's, for the full-sort scores and every position's output."""
    config, train, _, test = prepare("SSEPT", dict(small_config))
    model = SSEPT(config, train._dataset).eval()
    assert model.embedding.item_embedding.embedding_dim == 8  # half of hidden 16
    batch = first_batch(test)
    item_seq, users = batch[model.ITEM_SEQ], batch[model.USER_ID]
    with torch.no_grad():
        embedded, mask, _ = model.encoder_inputs(item_seq, users=users)
        hidden = model.encoder(embedded, mask)  # (batch, n, 16)
        items = model.item_embedding.weight[: model.n_items]
        user = model.embedding.user_embedding(users)
        candidates = torch.cat(
            [items[None].expand(len(users), -1, -1), user[:, None].expand(-1, model.n_items, -1)],
            dim=-1,
        )  # (batch, items, 16): [v_l; u_i]
        expected = torch.einsum("bnd,bld->bnl", hidden, candidates)
        every_position = model.encode(item_seq, users=users) @ model.item_scores_weight.t()
        torch.testing.assert_close(every_position, expected)
        last = batch[model.ITEM_SEQ_LEN] - 1
        torch.testing.assert_close(
            model.full_sort_predict(batch), expected[torch.arange(len(users)), last]
        )


def test_stochastic_shared_embeddings_replace_at_their_rate():
    torch.manual_seed(0)
    ids = torch.randint(1, 50, (200, 40))
    assert torch.equal(stochastic_shared(ids, 0.0, 50), ids)
    for prob in (0.1, 0.92):
        replaced = stochastic_shared(ids, prob, 50)
        assert replaced.min() >= 1 and replaced.max() <= 49
        # a replacement draws the same id again with probability 1/49
        rate = (replaced != ids).float().mean().item()
        expected = prob * 48 / 49
        assert abs(rate - expected) < 4 * math.sqrt(expected * (1 - expected) / ids.numel())


def test_sse_acts_in_training_only_and_keeps_padding(small_config):
    config, train, _, _ = prepare("SSEPT", dict(small_config, sse_user_prob=0.9, sse_item_prob=0.5))
    model = SSEPT(config, train._dataset)
    batch = first_batch(train)
    model.eval()
    assert torch.equal(model.sequence_inputs(batch)["users"], batch[model.USER_ID])
    model.train()
    torch.manual_seed(1)
    users = model.sequence_inputs(batch)["users"]
    assert (users != batch[model.USER_ID]).float().mean() > 0.5
    item_seq = batch[model.ITEM_SEQ]
    seen = {}
    original = model.embedding.forward

    def record(inputs, users=None):
        seen["inputs"] = inputs
        return original(inputs, users)

    model.embedding.forward = record
    model.encoder_inputs(item_seq, users=users)
    inputs = seen["inputs"]
    assert torch.equal(inputs == 0, item_seq == 0)  # padding stays padding
    changed = (inputs != item_seq)[item_seq > 0].float().mean().item()
    assert 0.3 < changed < 0.7


def test_without_user_part_and_sse_it_is_recboles_sasrec(small_config):
    overrides = dict(small_config, user_embedding_size=0, **NO_SSE, **NO_DROPOUT)
    config, train, _, test = prepare("SSEPT", overrides)
    model = SSEPT(config, train._dataset)
    assert not model.personalised
    assert_same_as_recbole(model, SASRec(config, train._dataset), config, train, test)


def test_ssept_trains_under_sasrec_protocol_and_recommends(small_config):
    summary = run("SSEPT", "wide", cmd_overrides=dict(small_config, protocol="sasrec"))
    assert summary["epochs_run"] == 2 and 0.0 < summary["test_result"]["hit@10"] <= 1.0
    from recbole_freq.jobs.recommend import recommend
    from recbole_freq.quick_start.restore import restore_model

    model, _, _, splits, _ = restore_model(summary["checkpoint"])
    datasets = tuple(split._dataset for split in splits)
    uids = datasets[2].inter_feat[model.USER_ID].numpy()[:5]
    items, scores = recommend(model, datasets, uids, k=3)
    assert items.shape == (5, 3) and torch.isfinite(scores).all()


def test_ssept_is_a_baseline_with_the_authors_settings(small_config):
    config, train, _, _ = prepare("SSEPT", {"data_path": small_config["data_path"]})
    assert "SSEPT" in BASELINES
    model = SSEPT(config, train._dataset)
    assert model.embedding.item_embedding.embedding_dim == 50
    assert model.embedding.user_embedding.embedding_dim == 50
    assert (model.sse.user_prob, model.sse.item_prob) == (0.92, 0.1)


@pytest.mark.parametrize(
    "model, overrides, message",
    [
        ("SSEPT", {"user_embedding_size": 16}, r"must lie in \(0, hidden_size=16\)"),
        ("SSEPT", {"user_embedding_size": -1}, "must be an integer >= 0"),
        ("SSEPT", {"sse_item_prob": 1.0}, r"sse_item_prob=1.0 must be a probability in \[0, 1\)"),
        ("SSEPT", {"user_embedding_size": 0}, "sse_user_prob=0.92 replaces user embeddings"),
        ("DuoRec", {"user_embedding_size": 8}, "not available for DuoRec"),
        ("RecDenoiser", {"backbone": "SSE-PT", "user_embedding_size": 0}, "needs user_embedd"),
    ],
)
def test_bad_personalisation_settings_are_refused(small_config, model, overrides, message):
    config, train, _, _ = prepare(model, dict(small_config, **overrides))
    with pytest.raises(ValueError, match=message):
        MODELS[model](config, train._dataset)


def test_recdenoiser_on_ssept_with_all_ones_masks_is_ssept(small_config):
    shared = dict(small_config, hidden_act="gelu", layer_norm_eps=1e-12, **NO_DROPOUT)
    overrides = dict(shared, backbone="SSE-PT", sparsity_beta=0.0, jacobian_gamma=0.0)
    config, train, _, test = prepare("RecDenoiser", overrides)
    denoiser = RecDenoiser(config, train._dataset)
    assert denoiser.personalised and (denoiser.sse.user_prob, denoiser.sse.item_prob) == (
        0.92,
        0.1,
    )
    plain_config, _, _, _ = prepare("SSEPT", shared)
    plain = SSEPT(plain_config, train._dataset)
    assert_all_ones_masks_give_the_backbone(denoiser, plain, first_batch(test))
    summary = run("RecDenoiser", "tiny", cmd_overrides=dict(small_config, backbone="SSE-PT"))
    assert summary["epochs_run"] == 2 and summary["model_report"]["learned_masks"]


@pytest.mark.parametrize("jacobian_gamma", [0.0, 0.1])
def test_training_scores_are_eq_5_for_a_loss_that_is_not_shift_invariant(
    small_config, jacobian_gamma
):
    """Rec-Denoiser's BCE (eq. 4) on SSE-PT trains on the scores full-sort ranks by:
    ``<h_t, [v_l; u_i]>`` with the user term counted once (it once was read out twice
    without the Jacobian term, which CE and BPR cannot see, BCE can)."""
    overrides = dict(
        small_config,
        backbone="SSE-PT",
        loss_type="BCE",
        jacobian_gamma=jacobian_gamma,
        train_neg_sample_args={"distribution": "uniform", "sample_num": 1},
    )
    config, train, _, _ = prepare("RecDenoiser", overrides)
    model = RecDenoiser(config, train._dataset).eval()
    batch = first_batch(train)
    with torch.no_grad():
        losses = model.training_pass(batch).contributions * len(batch)
        scores = model.full_sort_predict(batch)
    rows = torch.arange(len(batch))
    positive = scores[rows, batch[model.POS_ITEM_ID]]
    negative = scores[rows, batch[model.NEG_ITEM_ID]]
    expected = torch.nn.functional.softplus(-positive) + torch.nn.functional.softplus(negative)
    torch.testing.assert_close(losses, expected)
