"""PolyRec: polynomial attention, truncated residual, same-target positives, CL loss,
ablations and the order diagnostic, against explicit definitions and through RecBole."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from recbole.trainer import Trainer

from conftest import first_batch, prepare
from recbole_freq.cli import main
from recbole_freq.config.configurator import FreqConfig
from recbole_freq.model import PolyRec
from recbole_freq.model.contrastive import SameTargetSampler
from recbole_freq.model.layers import (
    SoftmaxAttention,
    StandardResidual,
    attention_probabilities,
    build_attention_mask,
)
from recbole_freq.model.polynomial import ChebyshevAttention, TruncatedResidual, chebyshev_terms
from recbole_freq.quick_start.quick_start import REPORTED_METRICS, run


def random_attention_inputs(batch=3, heads=2, seq_len=7, head_size=4, seed=0):
    """Queries, keys, values and a causal mask with right padding, in float64."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(batch, heads, seq_len, head_size, generator=generator, dtype=torch.float64)
        for _ in range(3)
    )
    lengths = [seq_len, seq_len - 3, 1][:batch]
    item_seq = torch.zeros(batch, seq_len, dtype=torch.long)
    for row, length in enumerate(lengths):
        item_seq[row, :length] = torch.arange(1, length + 1)
    return q, k, v, build_attention_mask(item_seq)


def matrix_chebyshev(matrix: torch.Tensor, order: int) -> list[torch.Tensor]:
    """T_0..T_order of a matrix, built as matrices from T_0 = I, T_1 = A."""
    identity = torch.eye(matrix.size(-1), dtype=matrix.dtype).expand_as(matrix)
    polynomials = [identity, matrix]
    while len(polynomials) <= order:
        polynomials.append(2 * matrix @ polynomials[-1] - polynomials[-2])
    return polynomials[: order + 1]


def monomial_chebyshev(matrix: torch.Tensor, order: int) -> torch.Tensor:
    """T_order(A) from numpy's monomial coefficients of T_order and matrix powers."""
    coefficients = np.polynomial.chebyshev.cheb2poly([0] * order + [1])
    return sum(float(c) * torch.linalg.matrix_power(matrix, j) for j, c in enumerate(coefficients))


@pytest.mark.parametrize("order", [0, 1, 2, 3, 5, 8])
@pytest.mark.parametrize("per_head", [False, True])
def test_recursion_equals_explicit_matrix_polynomial(order, per_head):
    q, k, v, mask = random_attention_inputs(seed=order)
    matrix = attention_probabilities(q, k, mask)  # row-stochastic, causal
    assert torch.allclose(matrix.sum(-1), torch.ones(()).double())
    assert torch.equal(matrix.triu(1), torch.zeros_like(matrix))
    polynomials = matrix_chebyshev(matrix, order)
    for k_order, (term, polynomial) in enumerate(
        zip(chebyshev_terms(matrix, v, order), polynomials)
    ):
        torch.testing.assert_close(term, polynomial @ v, atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(polynomial, monomial_chebyshev(matrix, k_order))

    operator = ChebyshevAttention(0.5, order, n_heads=2, per_head=per_head).double().eval()
    with torch.no_grad():
        operator.coefficients.normal_()
    w = operator.coefficients.detach()
    w = w.expand(2, order + 1)  # one row per head
    explicit = sum(
        w[:, index].view(1, 2, 1, 1) * (polynomial @ v)
        for index, polynomial in enumerate(polynomials)
    )
    torch.testing.assert_close(operator(q, k, v, mask), explicit, atol=1e-10, rtol=1e-10)


def test_order_one_with_weights_zero_one_equals_softmax_attention():
    q, k, v, mask = (t.float() if t.is_floating_point() else t for t in random_attention_inputs())
    chebyshev = ChebyshevAttention(0.5, order=1, n_heads=2).eval()
    assert chebyshev.coefficients.tolist() == [[0.0, 1.0]]  # the initialisation
    softmax = SoftmaxAttention(0.5).eval()
    torch.testing.assert_close(chebyshev(q, k, v, mask), softmax(q, k, v, mask))


def test_polynomial_dropout_keeps_attention_row_stochastic():
    q, k, v, mask = random_attention_inputs(seq_len=9)
    operator = ChebyshevAttention(0.9, order=3).double()
    with torch.no_grad():
        operator.coefficients.normal_()
    ones = torch.ones_like(v)  # T_k(A) 1 = 1 for a row-stochastic A, whatever k
    torch.manual_seed(0)
    for _ in range(5):
        out = operator.train()(q, k, ones, mask)
        torch.testing.assert_close(out, operator.coefficients.sum() * ones)
        dropped = operator(q, k, v, mask)  # padded rows too: never an empty row, no NaN
        assert torch.isfinite(dropped).all()
        assert not torch.allclose(dropped, operator.eval()(q, k, v, mask))


@pytest.mark.parametrize("seq_len,bins", [(50, 1), (50, 3), (50, 5), (50, 26), (49, 9), (12, 7)])
def test_truncated_residual_keeps_exactly_c_bins(seq_len, bins):
    torch.manual_seed(bins)
    residual = TruncatedResidual(
        8, seq_len, 0.0, 1e-12, alpha=0.5, bins=bins, reading="truncated"
    ).double()
    with torch.no_grad():
        residual.spectral_filter.normal_()
    x = torch.randn(4, seq_len, 8, dtype=torch.float64, requires_grad=True)
    skip = residual.truncated_skip(x)
    # The paper's form with full FFTs: same values and gradients.
    gain = torch.view_as_complex(residual.spectral_filter)
    kept = torch.fft.rfft(x, dim=1, norm="ortho")[:, :bins] * gain
    fft_skip = torch.fft.irfft(kept, n=seq_len, dim=1, norm="ortho")
    torch.testing.assert_close(skip, fft_skip, atol=1e-12, rtol=1e-12)
    weights = torch.randn_like(skip)
    grads = torch.autograd.grad((skip * weights).sum(), [x, residual.spectral_filter])
    fft_grads = torch.autograd.grad((fft_skip * weights).sum(), [x, residual.spectral_filter])
    for grad, fft_grad in zip(grads, fft_grads):
        torch.testing.assert_close(grad, fft_grad, atol=1e-12, rtol=1e-12)
    x = x.detach()
    spectrum = torch.fft.rfft(residual.truncated_skip(x), dim=1, norm="ortho")
    assert spectrum.shape[1] == seq_len // 2 + 1
    assert spectrum[:, bins:].abs().sum() < 1e-10  # no energy above C
    assert (spectrum[:, :bins].abs().sum(dim=(0, 2)) > 1e-3).all()  # all C bins kept
    # eq. 13 in the reading "truncated", before the LayerNorm that closes every sub-layer.
    f = torch.randn_like(x)
    expected = 0.5 * f + 0.5 * residual.truncated_skip(x)
    torch.testing.assert_close(residual(f, x), residual.layer_norm(expected))


def _skip_oracle(x, gain, bins):
    """``T(x) = IFFT(F_C(x) K)`` of eq. 13 with full FFTs (independent of the bases)."""
    kept = torch.fft.rfft(x, dim=1, norm="ortho")[:, :bins] * torch.view_as_complex(gain)
    return torch.fft.irfft(kept, n=x.size(1), dim=1, norm="ortho")


def _layer_norm(x, eps=1e-12):
    return (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + eps).sqrt()


@pytest.mark.parametrize("reading", ["truncated", "identity_and_truncated", "bsarec_mix"])
def test_each_reading_of_eq13_is_its_equation(reading):
    torch.manual_seed(3)
    alpha, bins = 0.3, 4
    residual = TruncatedResidual(6, 20, 0.0, 1e-12, alpha, bins, reading=reading).double()
    with torch.no_grad():
        residual.spectral_filter.normal_()
    x, f = torch.randn(3, 20, 6, dtype=torch.float64), torch.randn(3, 20, 6, dtype=torch.float64)
    skip = _skip_oracle(x, residual.spectral_filter, bins)
    expected = {
        "truncated": _layer_norm(alpha * f + (1 - alpha) * skip),
        "identity_and_truncated": _layer_norm(alpha * (x + f) + (1 - alpha) * skip),
        "bsarec_mix": alpha * _layer_norm(x + f) + (1 - alpha) * _layer_norm(x + skip),
    }[reading]
    torch.testing.assert_close(residual(f, x), expected)


def _own_share(reading: str) -> float:
    """How much the newest position's output follows its own input rather than the rest
    of the window: the norm of the Jacobian block d out[-1] / d x[-1] over the mean norm
    of the blocks d out[-1] / d x[j] of the other positions (sub-layer output held at 0)."""
    torch.manual_seed(0)
    residual = TruncatedResidual(8, 50, 0.0, 1e-12, 0.5, 3, reading=reading).double().eval()
    x = torch.randn(50, 8, dtype=torch.float64)

    def newest(window):
        return residual(torch.zeros_like(window)[None], window[None])[0, -1]

    blocks = torch.autograd.functional.jacobian(newest, x).norm(dim=(0, 2))  # per position
    return (blocks[-1] / blocks[:-1].mean()).item()


def test_only_readings_with_the_identity_path_pass_the_newest_item_on():
    truncated = _own_share("truncated")
    for reading in ("identity_and_truncated", "bsarec_mix"):
        assert _own_share(reading) > 3 * truncated, reading


def test_unknown_reading_is_refused():
    with pytest.raises(ValueError, match="trc_skip='identity' is unknown"):
        TruncatedResidual(4, 10, 0.0, 1e-12, 0.5, 2, reading="identity")


def test_truncated_skip_starts_as_exact_low_pass_projection():
    # Built for length 50, applied to length 10: the bases follow the input's length.
    residual = TruncatedResidual(4, 50, 0.0, 1e-12, alpha=0.3, bins=2).double()
    x = torch.randn(2, 10, 4, dtype=torch.float64)
    n = torch.arange(10, dtype=torch.float64)
    # Real projector onto frequencies 0 and +-1 of the unitary DFT, written out.
    basis = [torch.ones(10) / math.sqrt(10)]
    basis += [f(2 * math.pi * n / 10) * math.sqrt(2 / 10) for f in (torch.cos, torch.sin)]
    projector = sum(torch.outer(b, b) for b in basis).double()
    torch.testing.assert_close(residual.truncated_skip(x), projector @ x)


def sequence_set(features) -> set:
    return {
        (int(target), tuple(seq.tolist()))
        for seq, target in zip(features["item_id_list"], features["item_id"])
    }


def test_order_one_model_equals_softmax_model_with_the_same_weights(small_config):
    overrides = dict(small_config, poly_order=1, cl_weight=0)
    config, train, _, test = prepare("PolyRec", overrides)
    polynomial = PolyRec(config, train._dataset)
    softmax_config, _, _, _ = prepare("PolyRec", dict(overrides, attention_operator="softmax"))
    plain = PolyRec(softmax_config, train._dataset)
    missing, unexpected = plain.load_state_dict(polynomial.state_dict(), strict=False)
    assert not missing and all(name.endswith("operator.coefficients") for name in unexpected)
    polynomial.eval(), plain.eval()
    batch = first_batch(test)
    torch.testing.assert_close(
        polynomial.full_sort_predict(batch), plain.full_sort_predict(batch), atol=1e-5, rtol=1e-5
    )


def test_residual_paths_by_sublayer_and_paper_defaults(small_config):
    config, train, _, _ = prepare("PolyRec", small_config)
    assert (config["poly_order"], config["trc_alpha"], config["trc_c"]) == (3, 0.5, 3)
    assert (config["cl_weight"], config["attention_operator"]) == (0.1, "chebyshev")
    model = PolyRec(config, train._dataset)
    for block in model.encoder.blocks:
        assert isinstance(block.mixer.attention.operator, ChebyshevAttention)
        assert isinstance(block.mixer.attention.residual, TruncatedResidual)
        assert type(block.feed_forward.residual) is StandardResidual
    both = PolyRec(
        FreqConfig(
            "PolyRec",
            "tiny",
            cmd_overrides=dict(
                small_config, trc_sublayers="attention,feed_forward", poly_per_head=True
            ),
        ),
        train._dataset,
    )
    assert isinstance(both.encoder.blocks[1].feed_forward.residual, TruncatedResidual)
    assert [w.shape for w in both.polynomial_coefficients()] == [(2, 4), (2, 4)]


def test_same_target_sampler_on_the_training_split(small_config):
    config, train, valid, test = prepare("PolyRec", small_config)
    model = PolyRec(config, train._dataset)
    sampler = model.positive_sampler
    training = sequence_set(train._dataset.inter_feat)
    held_out = sequence_set(valid._dataset.inter_feat) | sequence_set(test._dataset.inter_feat)
    # The index holds exactly the distinct training (target, sequence) rows ...
    assert sampler.rows.numel() == len(training)
    targets = train._dataset.inter_feat["item_id"][sampler.rows]
    indexed = {
        (int(t), tuple(s.tolist())) for s, t in zip(sampler.sequences[sampler.rows], targets)
    }
    assert indexed == training
    # ... and none of the validation / test rows that training lacks.
    assert held_out - training and not (held_out - training) & indexed
    others = {}
    for target, seq in training:
        others.setdefault(target, set()).add(seq)
    drawn = 0
    torch.manual_seed(0)
    for _ in range(3):
        for batch in train:
            seqs, lens, found = sampler.positives(
                batch["item_id_list"], batch["item_length"], batch["item_id"]
            )
            for seq, length, ok, anchor, target in zip(
                seqs, lens, found, batch["item_id_list"], batch["item_id"]
            ):
                anchor, target, seq = tuple(anchor.tolist()), int(target), tuple(seq.tolist())
                assert bool(ok) == (len(others[target] - {anchor}) > 0)
                if ok:
                    drawn += 1
                    assert seq != anchor and seq in others[target]
                    assert (target, seq) in training
                    assert int(length) == sum(1 for item in seq if item)
                else:
                    assert seq == anchor  # falls back to a dropout view of itself
    assert drawn > 0 and 0 < sampler.coverage <= 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 4), st.lists(st.integers(1, 3), min_size=3, max_size=3)),
        min_size=1,
        max_size=25,
    )
)
def test_sampler_never_pairs_a_sequence_with_itself(rows):
    targets = torch.tensor([t for t, _ in rows])
    seqs = torch.tensor([s for _, s in rows])
    sampler = SameTargetSampler(seqs, torch.full((len(rows),), 3), targets, n_items=6)
    picked, found = sampler(seqs.repeat(20, 1), targets.repeat(20))
    for index, (row, ok) in enumerate(zip(picked.tolist(), found.tolist())):
        anchor = rows[index % len(rows)]
        others = {tuple(s) for t, s in rows if t == anchor[0]} - {tuple(anchor[1])}
        assert ok == bool(others)
        if ok:
            assert rows[row][0] == anchor[0] and tuple(rows[row][1]) in others


def test_sampler_draws_the_other_members_uniformly():
    seqs = torch.tensor([[1, 2], [2, 2], [3, 2], [4, 2], [5, 2]])
    targets = torch.tensor([7, 7, 7, 7, 8])
    sampler = SameTargetSampler(seqs, torch.full((5,), 2), targets, n_items=9)
    torch.manual_seed(1)
    for anchor in range(4):
        picked, found = sampler(seqs[anchor].repeat(3000, 1), targets[anchor].repeat(3000))
        counts = np.bincount(picked.numpy(), minlength=5)
        assert found.all() and counts[anchor] == 0 and counts[4] == 0
        assert all(900 < counts[i] < 1100 for i in range(4) if i != anchor), counts
    assert not sampler(seqs[4:], targets[4:])[1].any()  # alone with its target


def test_contrastive_loss_is_infonce_with_same_target_rows_masked(small_config):
    config, train, _, _ = prepare("PolyRec", dict(small_config, cl_temperature=0.5))
    model = PolyRec(config, train._dataset)
    anchor, positive = torch.randn(4, 16), torch.randn(4, 16)
    targets = torch.tensor([3, 5, 3, 9])
    logits = anchor @ positive.t() / 0.5
    expected = 0.0
    for i in range(4):
        negatives = [j for j in range(4) if j == i or targets[j] != targets[i]]
        expected -= logits[i, i] - torch.logsumexp(logits[i, negatives], 0)
    torch.testing.assert_close(model.contrastive_loss(anchor, positive, targets), expected / 4)


def test_loss_adds_lambda_times_contrastive_term(small_config):
    overrides = dict(small_config, hidden_dropout_prob=0.0, attn_dropout_prob=0.0)
    config, train, _, _ = prepare("PolyRec", overrides)
    with_cl = PolyRec(config, train._dataset)
    config_off, _, _, _ = prepare("PolyRec", dict(overrides, cl_weight=0))
    without_cl = PolyRec(config_off, train._dataset)
    assert without_cl.positive_sampler is None  # ablation (a) costs nothing
    without_cl.load_state_dict(with_cl.state_dict())
    batch = first_batch(train)
    torch.manual_seed(3)
    total = with_cl.calculate_loss(batch)
    torch.manual_seed(3)
    seqs, lens, _ = with_cl.positive_sampler.positives(
        batch["item_id_list"], batch["item_length"], batch["item_id"]
    )
    anchor = with_cl.forward(batch["item_id_list"], batch["item_length"])
    cl = with_cl.contrastive_loss(anchor, with_cl.forward(seqs, lens), batch["item_id"])
    rec = without_cl.calculate_loss(batch)
    assert total.item() == pytest.approx(rec.item() + 0.1 * cl.item(), rel=1e-5)
    total.backward()
    assert all(p.grad is not None for p in with_cl.encoder.parameters())


def test_polyrec_trains_through_recbole_and_reports_order_contributions(small_config):
    summary = run("PolyRec", "tiny", cmd_overrides=small_config)
    assert summary["epochs_run"] == 2 and set(REPORTED_METRICS) <= set(summary["test_result"])
    assert all(0.0 <= value <= 1.0 for value in summary["test_result"].values())
    assert all(math.isfinite(e["train_loss"]) for e in summary["history"])

    config, train, _, test = prepare("PolyRec", small_config)
    model = PolyRec(config, train._dataset)
    fresh = model.order_contributions(first_batch(test))
    assert fresh.shape == (2, 4) and (fresh[:, 1] > 0).all()
    assert (fresh[:, [0, 2, 3]] == 0).all()  # w = (0, 1, 0, 0) at initialisation
    trainer = Trainer(config, model)
    reloaded = trainer.evaluate(test, load_best_model=True, model_file=summary["checkpoint"])
    assert dict(reloaded) == summary["test_result"]
    model.train()
    trained = model.order_contributions(test, max_batches=2)
    assert trained.shape == (2, 4) and (trained > 0).all()
    assert model.training  # the diagnostic restores the mode it found


@pytest.mark.parametrize(
    "ablation,operator,residual",
    [
        ({"cl_weight": 0}, ChebyshevAttention, TruncatedResidual),  # (a) w/o CL
        ({"residual": "standard"}, ChebyshevAttention, StandardResidual),  # (b) w/o TRC
        ({"attention_operator": "softmax"}, SoftmaxAttention, TruncatedResidual),  # (c) w/o PA
    ],
    ids=["wo_CL", "wo_TRC", "wo_PA"],
)
def test_table3_ablations_are_configuration(small_config, ablation, operator, residual):
    config, train, _, _ = prepare("PolyRec", dict(small_config, **ablation))
    model = PolyRec(config, train._dataset)
    attention = model.encoder.blocks[0].mixer.attention
    assert type(attention.operator) is operator and type(attention.residual) is residual
    assert (model.positive_sampler is None) == ("cl_weight" in ablation)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step, batch in enumerate(train):
        optimizer.zero_grad()
        loss = model.calculate_loss(batch)
        loss.backward()
        optimizer.step()
        assert math.isfinite(loss.item())
        if step == 2:
            break
    if operator is SoftmaxAttention:
        with pytest.raises(ValueError, match="attention_operator: chebyshev"):
            model.order_contributions(first_batch(train))


BAD_INPUTS = [
    (["--poly_order=-1"], "poly_order=-1 must be an integer >= 0"),
    (["--poly_order=1.5"], "--poly_order (command line) must be an integer, got 1.5"),
    (["--trc_c=8"], "trc_c=8 is larger than the spectrum: MAX_ITEM_LIST_LENGTH=12 has 7"),
    (["--trc_c=0"], "trc_c=0 must be an integer >= 1"),
    (["--trc_alpha=1.5"], "trc_alpha=1.5 must lie in [0, 1]"),
    (["--trc_alpha=-0.1"], "trc_alpha=-0.1 must lie in [0, 1]"),
    (["--cl_weight=-0.1"], "cl_weight=-0.1 must be a number >= 0"),
    (["--trc_sublayers=[attention,ffn]"], "names unknown sub-layers ['ffn']"),
    (["--trc_skip=identity"], "trc_skip='identity' is unknown; choose from"),
]


@pytest.mark.parametrize("args,message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_is_a_clear_error_with_exit_code_2(small_config, capsys, args, message):
    given_keys = {arg[2:].split("=", 1)[0] for arg in args}
    base = [f"--{k}={v}" for k, v in small_config.items() if k not in given_keys]
    code = main(["--model=PolyRec", "--dataset=tiny", *base, *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not list(Path(small_config["checkpoint_dir"]).glob("*.pth"))
