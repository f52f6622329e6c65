"""TV-Rec (``recbole_freq.model.TVRec``) against an oracle written from its authors'
algorithm (jeongwhanchoi/TV-Rec, ``model/tvrec.py``, on the BSARec authors' code): the
whole forward pass in complex128 numpy, the filter evaluated as they do in the
graph-Fourier basis of the cyclic shift (its eigendecomposition, the powers of its
eigenvalues, ``F = V o (H L^T)``) and, for inference, as their one precomputed matrix,
fed the plugin model's weights; then its training and paper files through the real
pipeline."""

import math

import numpy as np
import pytest
import torch
import yaml

from conftest import (
    REPO_ROOT,
    authors_left_padded,
    left_and_right_models,
    oracle_feed_forward,
    prepare,
    rows_of_every_length,
)
from conftest import as_float64 as _np
from conftest import oracle_layer_norm as layer_norm
from recbole_freq.config.configurator import FreqConfig
from recbole_freq.model import TVRec
from recbole_freq.model.graph_filter import TimeVariantGraphFilter
from recbole_freq.quick_start.quick_start import run


class AuthorsLayer:
    """``NVRecLayer``'s filter for sequences of ``length``: the cyclic graph of ``length +
    order - 1`` nodes (``A[0, -1] = 1``, ``A[i, i - 1] = 1``), its graph Fourier
    transform from ``eig``, and ``H = c_t (B / ||B||)`` with complex ``B``."""

    def __init__(self, layer: TimeVariantGraphFilter, length: int, order: int):
        nodes = length + order - 1
        shift = np.zeros((nodes, nodes))
        shift[0, -1] = 1.0
        shift[np.arange(1, nodes), np.arange(nodes - 1)] = 1.0
        eigenvalues, self.igft = np.linalg.eig(shift)
        self.gft = np.linalg.inv(self.igft)
        self.powers = np.stack([eigenvalues**k for k in range(order + 1)], axis=1)
        basis = _np(layer.basis)
        basis = basis[..., 0] + 1j * basis[..., 1]
        basis = basis / np.linalg.norm(basis, axis=1, keepdims=True)
        self.response = _np(layer.coefficients).astype(complex) @ basis  # H: nodes x (K + 1)
        self.length, self.order = length, order

    def spectral(self, x):
        """Their training path: ``Re(F (gft x~))`` of the zero-padded ``x`` (length, d)."""
        padded = np.concatenate([x, np.zeros((self.order - 1, x.shape[1]))])
        spectrum = self.gft @ padded.astype(complex)
        F = self.igft * (self.response @ self.powers.T)
        return (F @ spectrum).real[: self.length]

    def inference_matrix(self):
        """Their ``calculate_func_H``: ``Re(F gft)``, one real nodes x nodes matrix."""
        F = self.igft * (self.response @ self.powers.T)
        return (F @ self.gft).real


def authors_forward(model, rows, inference=False):
    """``TVRecModel.forward`` of left-padded ``rows`` in eval mode: the newest position."""
    eps = model.encoder.blocks[0].mixer.residual.layer_norm.eps
    n = rows.size(1)
    layers = [
        AuthorsLayer(block.mixer.filter, n, block.mixer.filter.order)
        for block in model.encoder.blocks
    ]
    outputs = []
    for row in rows.tolist():
        pad = np.array(row) == 0
        x = _np(model.embedding.item_embedding.weight)[row]
        norm = model.embedding.layer_norm
        x = layer_norm(x, _np(norm.weight), _np(norm.bias), eps)
        for block, layer in zip(model.encoder.blocks, layers):
            x[pad] = 0.0
            if inference:
                padded = np.concatenate([x, np.zeros((layer.order - 1, x.shape[1]))])
                filtered = (layer.inference_matrix() @ padded)[:n]
            else:
                filtered = layer.spectral(x)
            norm = block.mixer.residual.layer_norm
            x = layer_norm(x + filtered, _np(norm.weight), _np(norm.bias), eps)
            x = oracle_feed_forward(x, block.feed_forward, eps)
        outputs.append(x[-1])
    return torch.tensor(np.stack(outputs), dtype=torch.float32)


def _grow_filters(model, seed):
    """Coefficients of order 1 instead of the authors' 1e-3 start, so that the filter's
    output is not lost beside the residual."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in model.encoder.blocks:
            layer = block.mixer.filter
            layer.coefficients.copy_(torch.randn(layer.coefficients.shape, generator=generator))


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"MAX_ITEM_LIST_LENGTH": 12, "filter_order": 12, "basis_size": 3},
        {"filter_order": 5, "basis_size": 0},
    ],
    ids=["order-50", "order-equals-length", "free-taps-order-5"],
)
def test_left_layout_is_the_authors_tvrec_for_every_length(small_config, overrides):
    """Same weights, every input length 0 .. n: ours under ``sequence_layout: left``
    equals the oracle's spectral path and its inference matrix to 1e-5 (with order = n
    the first position's top tap wraps round to the newest item, as theirs does); under
    RecBole's right padding it does not for rows of 2 .. n - 1 items (one item is only
    rescaled by its own tap, which the LayerNorm after the residual undoes)."""
    config, model, right = left_and_right_models(
        TVRec, dict(small_config, **overrides), lambda left: _grow_filters(left, seed=5)
    )
    n = config["MAX_ITEM_LIST_LENGTH"]
    item_seq, lengths = rows_of_every_length(model.n_items, n)
    with torch.no_grad():
        ours = model.forward(item_seq, lengths.clamp(min=1))
        theirs = right.forward(item_seq, lengths.clamp(min=1))
    rows = authors_left_padded(item_seq, lengths)
    spectral = authors_forward(model, rows)
    torch.testing.assert_close(ours, spectral, atol=1e-5, rtol=1e-5)
    inference = authors_forward(model, rows, inference=True)
    torch.testing.assert_close(ours, inference, atol=1e-5, rtol=1e-5)
    differs = (theirs - spectral).abs().amax(dim=1) > 1e-3
    assert differs[2:n].all() and not differs[n]


def test_the_filter_is_a_position_varying_convolution_with_one_wrap():
    """Each output position reads itself and earlier positions, through the taps
    ``Re(c_t B^)`` (orders above ``t`` fall on padding nodes), and one link more, for any
    order ``K``: the first position's tap of order ``K`` reads node ``(0 - K) mod (L + K -
    1) = L - 1``."""
    torch.manual_seed(0)
    for order in (6, 3, 9):
        layer = TimeVariantGraphFilter(6, order=order, basis_size=4).double()
        with torch.no_grad():
            layer.coefficients.normal_()
            matrix, taps = layer.matrix(), layer.taps()
        for t in range(6):
            for s in range(6):
                expected = taps[t, t - s] if s <= t and t - s <= order else 0.0
                if (t, s) == (0, 5):
                    expected = taps[0, order]
                assert float(matrix[t, s]) == pytest.approx(float(expected), abs=1e-12)


def test_the_basis_orthogonality_term_is_the_authors():
    """``weight * sum over the real and imaginary parts of ||P P^T - I||^2``, each part's
    rows normalised; 0 for a fixed basis or a weight of 0; bad settings refused."""
    torch.manual_seed(1)
    layer = TimeVariantGraphFilter(8, order=4, basis_size=3, orthogonality_weight=0.5).double()
    expected = 0.0
    for part in (_np(layer.basis[..., 0]), _np(layer.basis[..., 1])):
        rows = part / np.linalg.norm(part, axis=1, keepdims=True)
        expected += ((rows @ rows.T - np.eye(3)) ** 2).sum()
    assert float(layer.regularization_loss()) == pytest.approx(0.5 * expected, rel=1e-10)
    assert TimeVariantGraphFilter(8, 4, 0, 0.5).regularization_loss() == 0.0
    assert TimeVariantGraphFilter(8, 4, 3, 0.0).regularization_loss() == 0.0
    with pytest.raises(ValueError, match="filter_order=0 must be a whole number, 1 or more"):
        TimeVariantGraphFilter(8, 0, 3)
    with pytest.raises(ValueError, match="orthogonality_weight=-1"):
        TimeVariantGraphFilter(8, 4, 3, -1)


def test_tvrec_trains_its_loss_includes_the_term_and_evaluates(small_config):
    """Through the real pipeline: two epochs, a test score; the training loss is the CE
    plus the orthogonality term (a model with the term and one without, same weights,
    differ by exactly the term)."""
    summary = run("TVRec", "tiny", cmd_overrides=dict(small_config, epochs=2))
    assert summary["epochs_run"] == 2
    assert all(math.isfinite(epoch["train_loss"]) for epoch in summary["history"])
    assert 0.0 <= summary["test_result"]["ndcg@20"] <= 1.0

    config, train, _, _ = prepare("TVRec", dict(small_config, orthogonality_weight=0.25))
    model = TVRec(config, train._dataset).eval()
    plain_config, _, _, _ = prepare("TVRec", dict(small_config, orthogonality_weight=0.0))
    plain = TVRec(plain_config, train._dataset).eval()
    plain.load_state_dict(model.state_dict())
    interaction = next(iter(train))
    with torch.no_grad():
        term = sum(block.mixer.filter.regularization_loss() for block in model.encoder.blocks)
        gap = model.calculate_loss(interaction) - plain.calculate_loss(interaction)
    assert float(term) > 0 and float(gap) == pytest.approx(float(term), rel=1e-5)


@pytest.mark.parametrize(
    "dataset,basis_size,weight,dropout,learning_rate",
    [
        ("lastfm", 8, 0.001, 0.4, 0.001),
        ("amazon-beauty", 32, 0.0, 0.5, 0.0005),
        ("amazon-sports-outdoors", 16, 0.0, 0.5, 0.0005),
        ("yelp", 16, 0.001, 0.1, 0.0005),
    ],
)
def test_paper_files_are_the_authors_released_runs(
    dataset, basis_size, weight, dropout, learning_rate
):
    config = FreqConfig("TVRec", dataset, paper=True)
    assert (
        config["basis_size"],
        config["orthogonality_weight"],
        config["hidden_dropout_prob"],
        config["learning_rate"],
        config["filter_order"],
        config["input_position_embedding"],
    ) == (basis_size, weight, dropout, learning_rate, 50, False)
    assert config["protocol"] == "bsarec" and config["sequence_layout"] == "left"
    reference = yaml.safe_load(
        (REPO_ROOT / "properties" / "reference" / f"{dataset}.yaml").read_text()
    )
    logs = [s for s in reference["bsarec"] if s["name"] == "authors' log, TV-Rec"]
    assert len(logs) == 1 and set(logs[0]["rows"]["TVRec"]) >= {"hit@10", "ndcg@10"}
