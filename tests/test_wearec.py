"""WEARec (``recbole_freq.model.WEARec``) against an oracle written from its authors'
algorithm (xhy963319431/WEARec, ``src/model/wearec.py``, on the BSARec authors' code):
the whole forward pass in float64 numpy with the DFT and the Haar transform written as
sums and loops, fed the plugin model's weights; then its training, search grid and paper
files through the real pipeline."""

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
    rows_of_every_length,
)
from conftest import as_float64 as _np
from conftest import oracle_gelu as gelu
from conftest import oracle_layer_norm as layer_norm
from recbole_freq.config.configurator import FreqConfig
from recbole_freq.model import WEARec
from recbole_freq.model.wavelet import AdaptiveWaveletFilter
from recbole_freq.quick_start.quick_start import run


def rfft_ortho(x):
    """``torch.fft.rfft(x, dim=0, norm='ortho')`` of a (n, ...) array, as sums."""
    n = x.shape[0]
    t = np.arange(n)
    return np.stack(
        [np.tensordot(np.exp(-2j * np.pi * k * t / n), x, axes=(0, 0)) for k in range(n // 2 + 1)]
    ) / math.sqrt(n)


def irfft_ortho(spectrum, n):
    """``torch.fft.irfft(spectrum, n, dim=0, norm='ortho')``: the Hermitian spectrum's
    real signal; the imaginary parts of bin 0 (and of bin n / 2 for even n) do not count."""
    t = np.arange(n)
    out = np.zeros((n, *spectrum.shape[1:]))
    for k in range(n // 2 + 1):
        weight = 1 if k == 0 or (n % 2 == 0 and k == n // 2) else 2
        phase = np.exp(2j * np.pi * k * t / n).reshape(n, *([1] * (spectrum.ndim - 1)))
        out += weight * (spectrum[k][None] * phase).real
    return out / math.sqrt(n)


def authors_mixer(x, layer, heads):
    """``WEARecLayer.forward`` before its dropout / residual / LayerNorm, for one row
    ``x`` (n, d): per head the adaptive Fourier filter and the Haar wavelet, mixed."""
    n, d = x.shape
    size = d // heads
    bins = n // 2 + 1
    gain, offset = _np(layer.base_gain), _np(layer.base_offset)  # (heads, bins, 1)
    context = x.mean(axis=0)  # every position of the window, padding included
    if layer.modulation is not None:
        first, second = layer.modulation[0], layer.modulation[2]
        hidden = gelu(context @ _np(first.weight).T + _np(first.bias))
        params = (hidden @ _np(second.weight).T + _np(second.bias)).reshape(heads, bins, 2)
        gain = gain * (1 + params[..., :1])
        offset = offset + params[..., 1:]
    detail_weight = _np(layer.detail_weight)[0]  # (heads, n // 2, size)
    out = np.zeros_like(x)
    for h in range(heads):
        channels = slice(h * size, (h + 1) * size)
        head = x[:, channels]
        fourier = irfft_ortho(rfft_ortho(head) * gain[h] + offset[h], n)
        wavelet = np.zeros_like(head)
        for i in range(n // 2):
            even, odd = head[2 * i], head[2 * i + 1]
            approx, detail = 0.5 * (even + odd), 0.5 * (even - odd) * detail_weight[h, i]
            wavelet[2 * i], wavelet[2 * i + 1] = approx + detail, approx - detail
        out[:, channels] = (1 - layer.alpha) * wavelet + layer.alpha * fourier
    return out


def authors_forward(model, rows, heads):
    """``WEARecModel.forward`` of left-padded ``rows`` in eval mode: the newest position."""
    eps = model.encoder.blocks[0].mixer.residual.layer_norm.eps
    embedding = model.embedding
    outputs = []
    for row in rows.tolist():
        n = len(row)
        x = _np(embedding.item_embedding.weight)[row] + _np(embedding.position_embedding.weight)[:n]
        norm = embedding.layer_norm
        x = layer_norm(x, _np(norm.weight), _np(norm.bias), eps)
        for block in model.encoder.blocks:
            norm = block.mixer.residual.layer_norm
            mixed = authors_mixer(x, block.mixer.filter, heads)
            x = layer_norm(x + mixed, _np(norm.weight), _np(norm.bias), eps)
            x = oracle_feed_forward(x, block.feed_forward, eps)
        outputs.append(x[-1])
    return torch.tensor(np.stack(outputs), dtype=torch.float32)


def _randomise_filters(model, seed):
    """Gains, offsets and wavelet weights away from their start, so that each term counts."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in model.encoder.blocks:
            layer = block.mixer.filter
            for parameter in (layer.base_gain, layer.base_offset, layer.detail_weight):
                parameter.add_(0.5 * torch.randn(parameter.shape, generator=generator))


@pytest.mark.parametrize(
    "overrides",
    [{}, {"MAX_ITEM_LIST_LENGTH": 11, "n_heads": 4, "alpha": 0.7}, {"adaptive": False}],
    ids=["default", "odd-length-4-heads", "not-adaptive"],
)
def test_left_layout_is_the_authors_wearec_for_every_length(small_config, overrides):
    """Same weights, every input length 0 .. n (an odd n leaves the last position out of
    the wavelet pairs, as the authors' code does): ours under ``sequence_layout: left``
    equals the oracle to 1e-5; under RecBole's right padding it does not for rows
    shorter than n (the mean token and the pairs then see the padding elsewhere)."""
    config, model, right = left_and_right_models(
        WEARec, dict(small_config, **overrides), lambda left: _randomise_filters(left, seed=5)
    )
    n = config["MAX_ITEM_LIST_LENGTH"]
    item_seq, lengths = rows_of_every_length(model.n_items, n)
    with torch.no_grad():
        ours = model.forward(item_seq, lengths.clamp(min=1))
        theirs = right.forward(item_seq, lengths.clamp(min=1))
    oracle = authors_forward(model, authors_left_padded(item_seq, lengths), config["n_heads"])
    torch.testing.assert_close(ours, oracle, atol=1e-5, rtol=1e-5)
    differs = (theirs - oracle).abs().amax(dim=1) > 1e-3
    assert differs[:n].all() and not differs[n]


def test_the_operator_is_its_two_branches():
    """``alpha`` 0 is the Haar branch alone and 1 the Fourier branch alone; with a wavelet
    weight of 1 the Haar branch gives each pair back, and with gain 1, offset 0 and no
    modulation the Fourier branch is the identity."""
    torch.manual_seed(0)
    hidden = torch.randn(3, 10, 8, dtype=torch.float64)
    for alpha in (0.0, 1.0):
        layer = AdaptiveWaveletFilter(10, 8, 2, alpha, adaptive=False).double()
        with torch.no_grad():
            layer.detail_weight.fill_(1.0)
            layer.base_offset.zero_()
        torch.testing.assert_close(layer(hidden), hidden)
    with pytest.raises(ValueError, match="hidden_size must be a multiple of n_heads"):
        AdaptiveWaveletFilter(10, 8, 3, 0.5)
    with pytest.raises(ValueError, match=r"alpha=1.5 must lie in \[0, 1\]"):
        AdaptiveWaveletFilter(10, 8, 2, 1.5)


def test_wearec_trains_evaluates_and_is_one_config_line_from_its_ablation(small_config):
    summary = run("WEARec", "tiny", cmd_overrides=dict(small_config, epochs=2))
    assert summary["epochs_run"] == 2
    assert all(math.isfinite(epoch["train_loss"]) for epoch in summary["history"])
    assert 0.0 <= summary["test_result"]["ndcg@20"] <= 1.0
    plain = run("WEARec", "tiny", cmd_overrides=dict(small_config, epochs=1, adaptive=False))
    assert plain["config"]["adaptive"] is False


@pytest.mark.parametrize(
    "dataset,heads,alpha,learning_rate",
    [
        ("lastfm", 2, 0.3, 0.001),
        ("amazon-beauty", 8, 0.2, 0.0005),
        ("amazon-sports-outdoors", 4, 0.3, 0.001),
        ("ml-1m", 2, 0.3, 0.0005),
    ],
)
def test_paper_files_are_the_authors_released_runs(dataset, heads, alpha, learning_rate):
    config = FreqConfig("WEARec", dataset, paper=True)
    assert (config["n_heads"], config["alpha"], config["learning_rate"]) == (
        heads,
        alpha,
        learning_rate,
    )
    assert config["protocol"] == "bsarec" and config["sequence_layout"] == "left"
    reference = yaml.safe_load(
        (REPO_ROOT / "properties" / "reference" / f"{dataset}.yaml").read_text()
    )
    logs = [s for s in reference["bsarec"] if s["name"] == "authors' log, WEARec"]
    assert len(logs) == 1 and set(logs[0]["rows"]["WEARec"]) >= {"hit@10", "ndcg@10"}


def test_the_search_grid_is_the_authors_88_settings():
    from recbole_freq.jobs.tune.hyper import grid_size, parse_hyper_file

    space = parse_hyper_file(REPO_ROOT / "properties" / "hyper" / "WEARec.hyper")
    assert list(space) == ["learning_rate", "alpha", "n_heads"] and grid_size(space) == 88
    assert space["n_heads"].values == (1, 2, 4, 8)
