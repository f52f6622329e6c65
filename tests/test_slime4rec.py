"""SLIME4Rec (``recbole_freq.model.SLIME4Rec``) against an oracle written from its authors'
algorithm (sudaada/SLIME4Rec, ``recbole/model/layers.py``: ``FilterMixerLayer``,
``FMBlock``, ``Encoder``): the bands as their constructor computes them and the whole
forward pass in float64 numpy with the DFT as sums, fed the plugin model's weights; then
its training with DuoRec's objective through the real pipeline."""

import math

import numpy as np
import pytest
import torch
from test_wearec import _np, gelu, irfft_ortho, layer_norm, rfft_ortho

from conftest import prepare
from recbole_freq.config.configurator import FreqConfig
from recbole_freq.model import SLIME4Rec
from recbole_freq.model.frequency import slime4rec_bands
from recbole_freq.quick_start.quick_start import run


def authors_bands(i, n_layers, n, filter_mixer, dynamic_ratio, slide_mode):
    """``FilterMixerLayer.__init__``'s ``G_left, G_right`` / ``L_left, L_right``."""
    g_i, l_i = {
        "one": (i, n_layers - 1 - i),
        "two": (n_layers - 1 - i, i),
        "three": (n_layers - 1 - i, n_layers - 1 - i),
        "four": (i, i),
    }[slide_mode]
    bins = n // 2 + 1
    out = {}
    if filter_mixer in ("G", "M"):
        s = (bins * (1 - dynamic_ratio)) // (n_layers - 1)
        out["global"] = (int((bins * (1 - dynamic_ratio)) - (g_i * s)), int(bins - g_i * s))
    if filter_mixer in ("L", "M"):
        w = 1 / n_layers
        s = w * bins
        out["local"] = (int((bins * (1 - w)) - (l_i * s)), int(bins - l_i * s))
    return out


@pytest.mark.parametrize("n", [50, 49, 12])
@pytest.mark.parametrize("n_layers", [2, 3, 4])
@pytest.mark.parametrize("mode", ["one", "two", "three", "four"])
def test_bands_are_the_authors(n, n_layers, mode):
    for mixer in ("G", "L", "M"):
        for ratio in (0.3, 0.5, 0.7, 0.8, 1.0):
            for i in range(n_layers):
                ours = slime4rec_bands(i, n_layers, n, mixer, ratio, mode)
                theirs = authors_bands(i, n_layers, n, mixer, ratio, mode)
                assert {k: (r.start, r.stop) for k, r in ours.items()} == theirs


def test_bands_refuse_what_the_authors_code_cannot_build():
    with pytest.raises(ValueError, match="n_layers=1 must be at least 2"):
        slime4rec_bands(0, 1, 50, "G", 0.5)
    with pytest.raises(ValueError, match="filter_mixer='X' is unknown"):
        slime4rec_bands(0, 2, 50, "X", 0.5)
    with pytest.raises(ValueError, match="slide_mode='five' is unknown"):
        slime4rec_bands(0, 2, 50, "G", 0.5, "five")


def authors_forward(model, item_seq, item_seq_len):
    """The authors' ``SLIME4Rec.forward`` in eval mode on RecBole's right-padded rows."""
    eps = 1e-12
    embedding = model.embedding
    outputs = []
    for row, length in zip(item_seq.tolist(), item_seq_len.tolist()):
        n = len(row)
        x = _np(embedding.item_embedding.weight)[row] + _np(embedding.position_embedding.weight)[:n]
        x = layer_norm(x, _np(embedding.layer_norm.weight), _np(embedding.layer_norm.bias), eps)
        for block in model.encoder.blocks:
            layer = block.mixer.filter
            spectrum = rfft_ortho(x)
            filtered = np.zeros_like(spectrum)
            for name, (left, right) in {
                k: (r.start, r.stop) for k, r in layer.band_ranges.items()
            }.items():
                weight = _np(layer.weights[name])[0]
                band = spectrum.copy()
                band[:left] = 0
                band[right:] = 0
                filtered += band * (weight[..., 0] + 1j * weight[..., 1])
            norm = block.mixer.residual.layer_norm
            x = layer_norm(irfft_ortho(filtered, n) + x, _np(norm.weight), _np(norm.bias), eps)
            ffn = block.feed_forward
            inner = gelu(x @ _np(ffn.dense_in.weight).T + _np(ffn.dense_in.bias))
            out = inner @ _np(ffn.dense_out.weight).T + _np(ffn.dense_out.bias)
            norm = ffn.residual.layer_norm
            x = layer_norm(x + out, _np(norm.weight), _np(norm.bias), eps)
        outputs.append(x[length - 1])
    return torch.tensor(np.stack(outputs), dtype=torch.float32)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"filter_mixer": "M", "dynamic_ratio": 0.7, "n_layers": 3, "slide_mode": "two"}],
    ids=["global-band", "both-bands-3-layers"],
)
def test_forward_is_the_authors_slime4rec(small_config, overrides):
    config, train, _, _ = prepare("SLIME4Rec", dict(small_config, **overrides))
    model = SLIME4Rec(config, train._dataset).eval()
    n = config["MAX_ITEM_LIST_LENGTH"]
    generator = torch.Generator().manual_seed(4)
    lengths = torch.arange(1, n + 1)
    items = torch.randint(1, model.n_items, (n, n), generator=generator)
    item_seq = torch.where(torch.arange(n)[None, :] < lengths[:, None], items, 0)
    with torch.no_grad():
        ours = model.forward(item_seq, lengths)
    torch.testing.assert_close(
        ours, authors_forward(model, item_seq, lengths), atol=1e-5, rtol=1e-5
    )
    assert [block.mixer.residual.dropout.p for block in model.encoder.blocks] == [
        config["attn_dropout_prob"]
    ] * config["n_layers"]


def test_slime4rec_trains_with_duorecs_objective(small_config):
    summary = run("SLIME4Rec", "tiny", cmd_overrides=dict(small_config, epochs=2))
    assert summary["epochs_run"] == 2
    assert all(math.isfinite(epoch["train_loss"]) for epoch in summary["history"])
    assert 0.0 <= summary["test_result"]["ndcg@20"] <= 1.0
    assert "contrastive term (contrast=us_x" in summary["training_loss"]


def test_paper_file_is_the_authors_beauty_script():
    config = FreqConfig("SLIME4Rec", "amazon-beauty", paper=True)
    assert (config["filter_mixer"], config["dynamic_ratio"], config["stopping_step"]) == (
        "G",
        0.5,
        20,
    )
    assert config["protocol"] == "recbole" and config["contrast"] == "us_x"
