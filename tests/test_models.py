"""BSARec and FBSARec end to end through RecBole's real Config / dataset / Trainer."""

import json
from pathlib import Path

import pytest
import torch
from recbole.trainer import Trainer

from conftest import authors_left_padded, first_batch, prepare
from recbole_freq.model import BSARec, FBSARec
from recbole_freq.quick_start.quick_start import REPORTED_METRICS, run
from reference_bsarec import ReferenceBSARec

FBSAREC_COMBINATIONS = [  # thesis appendix tables 1-6
    ["sa"],
    ["ib"],
    ["sa", "ib"],
    ["bsa", "sa"],
    ["bsa", "ib"],
    ["bsa", "sa", "ib"],
]


def test_bsarec_trains_evaluates_full_sort_and_reloads_best_checkpoint(small_config):
    summary = run("BSARec", "tiny", cmd_overrides=small_config)
    assert summary["epochs_run"] == 2 and len(summary["history"]) == 2
    assert set(REPORTED_METRICS) <= set(summary["test_result"])
    assert all(0.0 <= value <= 1.0 for value in summary["test_result"].values())
    checkpoint = Path(summary["checkpoint"])
    assert checkpoint.is_file()
    assert (
        json.loads(Path(summary["summary_file"]).read_text())["test_result"]
        == summary["test_result"]
    )

    # Reloading the best checkpoint into a fresh model reproduces the test metrics.
    config, train, _, test = prepare("BSARec", small_config)
    trainer = Trainer(config, BSARec(config, train._dataset))
    reloaded = trainer.evaluate(test, load_best_model=True, model_file=str(checkpoint))
    assert dict(reloaded) == summary["test_result"]


def test_same_seed_gives_same_metrics(small_config):
    first = run("BSARec", "tiny", cmd_overrides=small_config, saved=False)
    second = run("BSARec", "tiny", cmd_overrides=small_config, saved=False)
    assert first["test_result"] == second["test_result"]
    assert [e["train_loss"] for e in first["history"]] == [
        e["train_loss"] for e in second["history"]
    ]
    other_seed = run("BSARec", "tiny", cmd_overrides=dict(small_config, seed=8), saved=False)
    assert other_seed["history"][0]["train_loss"] != first["history"][0]["train_loss"]


@pytest.mark.parametrize(
    "overrides", [{}, {"beta_type": "scalar", "alpha": 0.3, "c": 5, "n_heads": 1}]
)
def test_fused_model_equals_unfused_oracle(small_config, overrides):
    """Same weights: same scores and identical RecBole metrics as the unfused reference."""
    config, train, _, test = prepare("BSARec", dict(small_config, **overrides))
    model = BSARec(config, train._dataset)
    reference = ReferenceBSARec(config, train._dataset).copy_weights_from(model)
    model.eval(), reference.eval()
    batch = first_batch(test)
    torch.testing.assert_close(
        model.full_sort_predict(batch), reference.full_sort_predict(batch), atol=1e-5, rtol=1e-5
    )
    ours = Trainer(config, model).evaluate(test, load_best_model=False)
    oracle = Trainer(config, reference).evaluate(test, load_best_model=False)
    assert dict(ours) == dict(oracle)


def authors_bsarec_output(reference, item_seq, item_seq_len):
    """BSARec as the authors compute it (``src/model/bsarec.py``): left-padded rows,
    positions ``0 .. n-1`` over the padded row, the additive -10000 causal and padding
    mask, the unmasked FFT filter, and the output at the last position."""
    left = authors_left_padded(item_seq, item_seq_len)
    full = torch.full_like(item_seq_len, left.size(1))
    return reference.forward(left, full)


@pytest.mark.parametrize("overrides", [{}, {"c": 5, "alpha": 0.3, "n_heads": 1}])
def test_left_layout_equals_the_authors_algorithm_for_every_length(small_config, overrides):
    """``sequence_layout: left`` is the authors' BSARec on identical weights for every
    input length 0 .. n (0: the window's first row, one padding item); ``right`` is
    not, for every row shorter than n."""
    overrides = dict(small_config, **overrides)
    config, train, _, _ = prepare("BSARec", dict(overrides, sequence_layout="left"))
    left_model = BSARec(config, train._dataset).eval()
    reference = ReferenceBSARec(config, train._dataset).copy_weights_from(left_model).eval()
    right_config, right_train, _, _ = prepare("BSARec", dict(overrides, sequence_layout="right"))
    right_model = BSARec(right_config, right_train._dataset).eval()
    right_model.load_state_dict(left_model.state_dict())

    n = config["MAX_ITEM_LIST_LENGTH"]
    generator = torch.Generator().manual_seed(3)
    lengths = torch.arange(n + 1)
    items = torch.randint(1, left_model.n_items, (n + 1, n), generator=generator)
    item_seq = torch.where(torch.arange(n)[None, :] < lengths[:, None], items, 0)
    item_seq_len = lengths.clamp(min=1)  # RecBole's item_length of an empty input
    with torch.no_grad():
        ours = left_model.forward(item_seq, item_seq_len)
        authors = authors_bsarec_output(reference, item_seq, lengths)
        right = right_model.forward(item_seq, item_seq_len)
    torch.testing.assert_close(ours, authors, atol=1e-5, rtol=1e-5)
    differs = (right - authors).abs().amax(dim=1) > 1e-3
    assert differs[:n].all() and not differs[n]  # the same function only for full rows


def test_left_layout_outputs_keep_recboles_positions(small_config):
    """Every position's output under ``left`` comes back where RecBole's row has the
    item (per-position targets, augmentations), and ``encode`` then ``gather_indexes`` is
    ``forward``."""
    config, train, _, _ = prepare("BSARec", dict(small_config, sequence_layout="left"))
    model = BSARec(config, train._dataset).eval()
    batch = first_batch(train)
    item_seq, lengths = batch[model.ITEM_SEQ], batch[model.ITEM_SEQ_LEN]
    with torch.no_grad():
        every = model.encode(item_seq)
        inputs, outputs = model.run_encoder(item_seq)
        last = model.forward(item_seq, lengths)
    torch.testing.assert_close(model.gather_indexes(every, lengths - 1), last)
    torch.testing.assert_close(outputs[-1], every)
    assert [state.shape for state in inputs] == [state.shape for state in outputs]


def test_training_steps_match_oracle_without_dropout(small_config):
    overrides = dict(small_config, hidden_dropout_prob=0.0, attn_dropout_prob=0.0)
    config, train, _, _ = prepare("BSARec", overrides)
    model = BSARec(config, train._dataset)
    reference = ReferenceBSARec(config, train._dataset).copy_weights_from(model)
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (model, reference)]
    for step, batch in enumerate(train):
        losses = []
        for m, optimizer in zip((model, reference), optimizers):
            m.train()
            optimizer.zero_grad()
            loss = m.calculate_loss(batch)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-4, abs=1e-5)
        if step == 4:
            break


def test_fbsarec_with_bsa_branch_is_bsarec(small_config):
    config, train, _, test = prepare(
        "FBSARec", dict(small_config, fusion_branches=["bsa"], fusion_weights=[1.0])
    )
    fbsarec = FBSARec(config, train._dataset)
    bsarec = BSARec(config, train._dataset)
    bsarec.load_state_dict(fbsarec.state_dict())
    fbsarec.eval(), bsarec.eval()
    batch = first_batch(test)
    assert torch.equal(fbsarec.full_sort_predict(batch), bsarec.full_sort_predict(batch))


@pytest.mark.parametrize("branches", FBSAREC_COMBINATIONS, ids="+".join)
def test_fbsarec_fusions_match_oracle_and_train(small_config, branches):
    weights = [0.5 + i for i in range(len(branches))]
    config, train, _, test = prepare(
        "FBSARec", dict(small_config, fusion_branches=branches, fusion_weights=weights)
    )
    model = FBSARec(config, train._dataset)
    reference = ReferenceBSARec(config, train._dataset, branches, weights).copy_weights_from(model)
    model.eval(), reference.eval()
    batch = first_batch(test)
    torch.testing.assert_close(
        model.full_sort_predict(batch), reference.full_sort_predict(batch), atol=1e-5, rtol=1e-5
    )
    model.train()
    model.calculate_loss(first_batch(train)).backward()
    uses_filter = any(b in ("ib", "bsa") for b in branches)
    uses_attention = any(b in ("sa", "bsa") for b in branches)
    rescaler_grad = model.encoder.blocks[0].mixer.rescaler.sqrt_beta.grad
    attention_grad = model.encoder.blocks[0].mixer.attention.qkv.weight.grad
    assert (rescaler_grad is not None) == uses_filter
    assert (attention_grad is not None) == uses_attention


def test_fbsarec_learnable_fusion_weights_get_gradients(small_config):
    config, train, _, _ = prepare(
        "FBSARec", dict(small_config, fusion_branches="bsa,ib", learn_fusion_weights=True)
    )
    model = FBSARec(config, train._dataset)
    model.calculate_loss(first_batch(train)).backward()
    weights = model.encoder.blocks[0].fusion_weights
    assert isinstance(weights, torch.nn.Parameter) and weights.grad.abs().sum() > 0
    assert torch.allclose(weights.detach(), torch.tensor([0.5, 0.5]))


@pytest.mark.parametrize(
    "ablation",
    [
        {"alpha": 0.0},
        {"alpha": 1.0},
        {"beta_type": "scalar"},
        {"loss_type": "BPR", "train_neg_sample_args": {"distribution": "uniform", "sample_num": 1}},
    ],
)
def test_ablations_and_bpr_train_through_recbole(small_config, ablation):
    summary = run(
        "BSARec", "tiny", cmd_overrides=dict(small_config, epochs=1, **ablation), saved=False
    )
    assert summary["epochs_run"] == 1 and summary["history"][0]["train_loss"] > 0


def test_learned_beta_is_exposed_per_layer(small_config):
    config, train, _, _ = prepare("BSARec", small_config)
    betas = BSARec(config, train._dataset).learned_beta()
    assert len(betas) == 2 and betas[0].shape == (16,) and (betas[0] >= 0).all()


def test_recbole_builtin_runs_on_same_split(small_config):
    ours = run("BSARec", "tiny", cmd_overrides=dict(small_config, epochs=1), saved=False)
    sasrec = run("SASRec", "tiny", cmd_overrides=dict(small_config, epochs=1), saved=False)
    assert set(sasrec["test_result"]) == set(ours["test_result"])
    assert sasrec["config"]["eval_args"] == ours["config"]["eval_args"]
    assert sasrec["config"]["valid_metric"] == "NDCG@20"


def test_ml100k_two_epochs_end_to_end(tmp_path):
    """RecBole's bundled ml-100k through the whole pipeline (small model to stay fast)."""
    overrides = {
        "epochs": 2,
        "hidden_size": 16,
        "inner_size": 32,
        "n_layers": 1,
        "MAX_ITEM_LIST_LENGTH": 20,
        "train_batch_size": 1024,
        "show_progress": False,
        "state": "WARNING",
        "checkpoint_dir": str(tmp_path / "saved"),
        "load_col": {"inter": ["user_id", "item_id", "timestamp"]},
    }
    summary = run("BSARec", "ml-100k", cmd_overrides=overrides)
    assert summary["epochs_run"] == 2
    assert summary["config"]["data_path"].endswith("ml-100k")
    # A trained model ranks far better than chance (20 of 1,682 items: HR@20 ~ 0.012).
    assert summary["test_result"]["hit@20"] > 0.05


def test_registered_components_are_one_config_line_away(small_config, monkeypatch):
    """An operator or residual path registered in encoder.py is picked by config, gets its
    config keys as options, and its regularization_loss() is added to the loss."""
    from recbole_freq.model import encoder, layers

    class ScaledSoftmax(layers.SoftmaxAttention):
        def __init__(self, dropout_prob, scale):
            super().__init__(dropout_prob)
            self.scale = scale
            self.penalty = torch.nn.Parameter(torch.tensor(0.25))

        def regularization_loss(self):
            return self.penalty

    sublayers = []

    def tracking_residual(ctx):
        sublayers.append(ctx.sublayer)
        return layers.StandardResidual(ctx.hidden_size, ctx.hidden_dropout_prob, ctx.layer_norm_eps)

    monkeypatch.setitem(
        encoder.ATTENTION_OPERATORS,
        "scaled",
        encoder.Component(
            lambda ctx, test_scale=1.0: ScaledSoftmax(ctx.attn_dropout_prob, test_scale),
            ("test_scale",),
        ),
    )
    monkeypatch.setitem(encoder.RESIDUAL_PATHS, "tracking", encoder.Component(tracking_residual))
    overrides = dict(small_config, attention_operator="scaled", test_scale=3.0, residual="tracking")
    config, train, _, _ = prepare("BSARec", overrides)
    model = BSARec(config, train._dataset)
    operators = [block.mixer.attention.operator for block in model.encoder.blocks]
    assert all(isinstance(op, ScaledSoftmax) and op.scale == 3.0 for op in operators)
    assert sublayers == ["attention", "filter", "feed_forward"] * 2
    assert model.regularization_loss().item() == pytest.approx(0.5)
    model.eval()
    batch = first_batch(train)
    plain = torch.nn.functional.cross_entropy(
        model.forward(batch["item_id_list"], batch["item_length"])
        @ model.item_embedding.weight.t(),
        batch["item_id"],
    )
    assert model.calculate_loss(batch).item() == pytest.approx(plain.item() + 0.5, rel=1e-5)
