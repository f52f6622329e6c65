"""MUFFIN (``recbole_freq.model.MUFFIN``) against an oracle written from its authors'
algorithm (ilwoong100/MUFFIN, ``recbole/model/sequential_recommender/muffin.py`` and
``module.py``): the user-adaptive filter (a reflect-padded convolution written as a sum,
batch norm with running statistics), both encoders and the fusion in float64 numpy,
fed the plugin model's weights; the band balance term; training through the pipeline."""

import math

import numpy as np
import pytest
import torch
from test_wearec import _np, gelu, irfft_ortho, layer_norm, rfft_ortho

from conftest import prepare
from recbole_freq.config.configurator import FreqConfig
from recbole_freq.model import MUFFIN
from recbole_freq.model.band_mixture import UserAdaptiveFilter
from recbole_freq.quick_start.quick_start import run


def linear(x, layer):
    out = x @ _np(layer.weight).T
    return out + _np(layer.bias) if layer.bias is not None else out


def authors_gains(embedded, user_filter):
    """``sigmoid(BatchNorm1d(Conv1d(|rfft(E)|)))`` in eval mode, (bins, d)."""
    magnitude = np.abs(rfft_ortho(embedded)).T  # (d, bins)
    conv, norm = user_filter.conv, user_filter.norm
    k = conv.kernel_size[0]
    pad = k // 2
    padded = np.concatenate(
        [magnitude[:, 1 : pad + 1][:, ::-1], magnitude, magnitude[:, -pad - 1 : -1][:, ::-1]],
        axis=1,
    )  # reflect: the edge bin itself is not repeated
    weight, bins = _np(conv.weight), magnitude.shape[1]
    out = (
        np.stack(
            [np.einsum("oik,ik->o", weight, padded[:, f : f + k]) for f in range(bins)], axis=1
        )
        + _np(conv.bias)[:, None]
    )
    out = (out - _np(norm.running_mean)[:, None]) / np.sqrt(
        _np(norm.running_var)[:, None] + norm.eps
    ) * _np(norm.weight)[:, None] + _np(norm.bias)[:, None]
    return (1 / (1 + np.exp(-out))).T


def complex_weight(parameter):
    weight = _np(parameter)[0]
    return weight[..., 0] + 1j * weight[..., 1]


def feed_forward(x, ffn, eps):
    out = linear(gelu(linear(x, ffn.dense_in)), ffn.dense_out)
    norm = ffn.residual.layer_norm
    return layer_norm(x + out, _np(norm.weight), _np(norm.bias), eps)


def phase(spectrum, n):
    """``torch.angle`` of ``torch.fft.rfft``'s output: the bins of a real signal that are
    real (0, and n / 2 for even n) come with an imaginary part of exactly +0, so their
    phase is 0 or pi; the sums of ``rfft_ortho`` leave rounding noise there instead."""
    spectrum = spectrum.copy()
    for real_bin in {0, n // 2} if n % 2 == 0 else {0}:
        spectrum[real_bin] = spectrum[real_bin].real + 0j
    return np.angle(spectrum)


def authors_band_mixture(x, mixer, gains, eps):
    spectrum = rfft_ortho(x)
    features = np.concatenate([np.abs(spectrum).mean(0), phase(spectrum, x.shape[0]).mean(0)])
    gate = mixer.gate
    hidden = linear(features, gate[0])
    hidden = gelu(layer_norm(hidden, _np(gate[1].weight), _np(gate[1].bias), gate[1].eps))
    logits = linear(gelu(linear(hidden, gate[3])), gate[5])
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    filtered = spectrum * (gains * complex_weight(mixer.filter.weight))
    bins, n_bands = spectrum.shape[0], mixer.num_bands
    norm = mixer.residual.layer_norm
    out = np.zeros_like(x)
    for band in range(n_bands):
        part = np.zeros_like(filtered)
        start, stop = band * bins // n_bands, (band + 1) * bins // n_bands
        part[start:stop] = filtered[start:stop]
        signal = irfft_ortho(part, x.shape[0])
        out += probs[band] * layer_norm(signal + x, _np(norm.weight), _np(norm.bias), eps)
    return out, probs


def authors_forward(model, item_seq, item_seq_len):
    """The authors' ``Muffin.forward`` in eval mode: the fused output and the band
    probabilities of every LFM layer, per row."""
    eps = 1e-12
    embedding = model.embedding
    outputs, all_probs = [], []
    for row, length in zip(item_seq.tolist(), item_seq_len.tolist()):
        mask = (np.array(row) != 0)[:, None]
        e = _np(embedding.item_embedding.weight)[row] * mask
        e = layer_norm(e, _np(embedding.layer_norm.weight), _np(embedding.layer_norm.bias), eps)
        gains = authors_gains(e, model.user_filter)
        g = e
        for block in model.global_encoder.blocks:
            mixer = block.mixer
            spectrum = rfft_ortho(g) * (gains * complex_weight(mixer.filter.weight))
            norm = mixer.residual.layer_norm
            g = layer_norm(
                irfft_ortho(spectrum, g.shape[0]) + g, _np(norm.weight), _np(norm.bias), eps
            )
            g = feed_forward(g, block.feed_forward, eps)
        x, row_probs = e, []
        for block in model.encoder.blocks:
            x, probs = authors_band_mixture(x, block.mixer, gains, eps)
            row_probs.append(probs)
            x = feed_forward(x, block.feed_forward, eps)
        last = length - 1
        fused = linear(np.concatenate([x[last], g[last]]), model.fusion) + e[last]
        norm = model.output_norm
        outputs.append(layer_norm(fused, _np(norm.weight), _np(norm.bias), eps))
        all_probs.append(row_probs)
    return torch.tensor(np.stack(outputs), dtype=torch.float32), np.array(all_probs)


def _perturb(model, seed):
    """Filters, gate and batch-norm statistics away from their start."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        norm = model.user_filter.norm
        norm.running_mean.normal_(0.0, 0.3, generator=generator)
        norm.running_var.uniform_(0.5, 2.0, generator=generator)
        norm.weight.add_(0.3 * torch.randn(norm.weight.shape, generator=generator))
        for encoder in (model.encoder, model.global_encoder):
            for block in encoder.blocks:
                block.mixer.filter.weight.normal_(0.0, 1.0, generator=generator)


def _rows(model, config):
    """One row of each length 2 .. n.  A row of one item (right-padded) has a real
    spectrum in the first layer, and whether the phase of a bin with a negative real part
    is pi or -pi there depends on the signed zero the FFT library returns (pocketfft
    gives -0 for some bins of a delta): the authors' gate reads that phase, so on such
    rows only torch's own FFT reproduces it (docs/models.md, MUFFIN)."""
    n = config["MAX_ITEM_LIST_LENGTH"]
    generator = torch.Generator().manual_seed(6)
    lengths = torch.arange(2, n + 1)
    items = torch.randint(1, model.n_items, (n - 1, n), generator=generator)
    return torch.where(torch.arange(n)[None, :] < lengths[:, None], items, 0), lengths


@pytest.mark.parametrize(
    "overrides",
    [{}, {"num_bands": 4, "kernel_size": 3, "MAX_ITEM_LIST_LENGTH": 11}],
    ids=["default", "4-bands-kernel-3-odd-length"],
)
def test_forward_is_the_authors_muffin(small_config, overrides):
    config, train, _, _ = prepare("MUFFIN", dict(small_config, **overrides))
    model = MUFFIN(config, train._dataset)
    _perturb(model, seed=2)
    model.eval()
    float32 = model.forward(*_rows(model, config))  # the model as it trains, below
    model.double()
    item_seq, lengths = _rows(model, config)
    with torch.no_grad():
        ours = model.forward(item_seq, lengths).float()
        balance = model.balance_loss()
    oracle, probs = authors_forward(model, item_seq, lengths)
    torch.testing.assert_close(ours, oracle, atol=1e-6, rtol=1e-6)
    # in float32 the perturbed filters (weights of order 1) round at about 1e-5
    torch.testing.assert_close(float32.detach(), oracle, atol=1e-4, rtol=1e-4)
    # the authors' compute_balance_loss, per layer, summed
    expected = sum(
        ((probs[:, layer].mean(0) - 1 / probs.shape[-1]) ** 2).mean()
        for layer in range(probs.shape[1])
    )
    assert float(balance) == pytest.approx(expected, rel=1e-6) and expected > 0


def test_the_padding_item_stays_zero_and_positions_are_not_embedded(small_config):
    config, train, _, _ = prepare("MUFFIN", small_config)
    model = MUFFIN(config, train._dataset)
    assert model.embedding.position_embedding is None
    assert not model.item_embedding.weight[0].any()
    with pytest.raises(ValueError, match="kernel_size=4 must be odd"):
        UserAdaptiveFilter(16, 4, 12)


def test_muffin_trains_with_its_three_terms(small_config):
    summary = run("MUFFIN", "tiny", cmd_overrides=dict(small_config, epochs=2))
    assert summary["epochs_run"] == 2
    assert all(math.isfinite(epoch["train_loss"]) for epoch in summary["history"])
    assert 0.0 <= summary["test_result"]["ndcg@20"] <= 1.0
    assert "band balance (beta=0.2)" in summary["training_loss"]
    without = run("MUFFIN", "tiny", cmd_overrides=dict(small_config, epochs=1, alpha=0, beta=0))
    assert without["history"][0]["train_loss"] < summary["history"][0]["train_loss"]


@pytest.mark.parametrize(
    "dataset,alpha,beta,kernel,dropout",
    [
        ("amazon-beauty", 0.1, 0.2, 7, 0.4),
        ("ml-1m", 0.1, 0.2, 3, 0.1),
        ("amazon-toys-games", 0.05, 1.0, 7, 0.4),
        ("amazon-sports-outdoors", 0.5, 0.05, 7, 0.5),
        ("yelp", 0.5, 1.0, 5, 0.4),
    ],
)
def test_paper_files_are_the_authors_script(dataset, alpha, beta, kernel, dropout):
    config = FreqConfig("MUFFIN", dataset, paper=True)
    got = (config["alpha"], config["beta"], config["kernel_size"], config["hidden_dropout_prob"])
    assert got == (alpha, beta, kernel, dropout) and config["freq_dropout_prob"] == dropout
    assert config["num_bands"] == 6 and config["protocol"] == "recbole"
