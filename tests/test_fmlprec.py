"""FMLP-Rec (``recbole_freq.model.FMLPRec``): its filter against the DFT written out, the
all-pass filter against the MLP path, and its training through the real pipeline."""

import math

import numpy as np
import pytest
import torch

from conftest import first_batch, prepare
from recbole_freq.jobs.compare import compare
from recbole_freq.model import FMLPRec
from recbole_freq.model.frequency import LearnableFilter
from recbole_freq.protocol import ProtocolError
from recbole_freq.quick_start.quick_start import new_model, run


def dft_filter_oracle(hidden: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """The authors' ``irfft(rfft(x, norm=ortho) * W, norm=ortho)`` with the DFT written as
    sums: the full spectrum gets W on the bins 0..n//2 and its conjugate mirror above."""
    n = hidden.shape[1]
    k = np.arange(n)
    forward = np.exp(-2j * np.pi * np.outer(k, k) / n) / math.sqrt(n)
    spectrum = np.einsum("kt,btd->bkd", forward, hidden)
    half = weight[..., 0] + 1j * weight[..., 1]  # (1, n//2+1, d)
    full = np.concatenate([half, np.conj(half[:, 1 : n - n // 2][:, ::-1])], axis=1)
    if n % 2 == 0:  # irfft keeps only the real part of the Nyquist bin
        full[:, n // 2] = full[:, n // 2].real
    spectrum = spectrum * full
    spectrum[:, 0] = spectrum[:, 0].real  # and of the frequency-0 bin
    if n % 2 == 0:
        spectrum[:, n // 2] = spectrum[:, n // 2].real
    inverse = np.conj(forward).T
    return np.einsum("tk,bkd->btd", inverse, spectrum).real


@pytest.mark.parametrize("n", [7, 8])
def test_learnable_filter_is_the_authors_fft_filter(n):
    torch.manual_seed(0)
    layer = LearnableFilter(n, 5)
    hidden = torch.randn(3, n, 5, dtype=torch.float64)
    ours = layer.double()(hidden).detach().numpy()
    weight = layer.complex_weight.detach().numpy()
    assert np.allclose(ours, dft_filter_oracle(hidden.numpy(), weight), atol=1e-10)
    # circulant: commutes with the circular shift between right and left padding
    shifted = layer(torch.roll(hidden, 2, dims=1))
    assert torch.allclose(shifted, torch.roll(layer(hidden), 2, dims=1), atol=1e-12)


def test_all_pass_filter_leaves_the_mlp_path(small_config):
    """With ``W = 1`` the filter is the identity, and each block is
    ``FFN(LayerNorm(2 X))`` without dropout: FMLP-Rec reduces to its MLP path."""
    config, train, _, _ = prepare("FMLPRec", small_config)
    model = new_model(config, train)
    model.eval()
    for block in model.encoder.blocks:
        weight = block.mixer.filter.complex_weight
        with torch.no_grad():
            weight[..., 0] = 1.0
            weight[..., 1] = 0.0
    item_seq = first_batch(train)["item_id_list"]
    with torch.no_grad():
        hidden = model.embedding(item_seq)
        for block in model.encoder.blocks:
            hidden = block.feed_forward(block.mixer.residual.layer_norm(2 * hidden))
        assert torch.allclose(model.encode(item_seq), hidden, atol=1e-5)


def test_fmlprec_trains_with_the_authors_loss_and_reloads(small_config):
    summary = run("FMLPRec", "tiny", cmd_overrides=dict(small_config, epochs=2))
    assert summary["protocol"]["label"] == "recbole+train_loss=bce"
    assert all(math.isfinite(epoch["train_loss"]) for epoch in summary["history"])
    assert 0.0 <= summary["test_result"]["ndcg@20"] <= 1.0
    assert FMLPRec.token_mixer == "filter"
    # CE through the model's own loss, one config line away
    summary = run("FMLPRec", "tiny", cmd_overrides=dict(small_config, epochs=1, train_loss="model"))
    assert summary["protocol"]["label"] == "recbole"


def test_fmlprec_is_not_causal_so_sasrec_rows_refuse_it(small_config):
    with pytest.raises(ProtocolError, match="needs a causal model"):
        run("FMLPRec", "wide", cmd_overrides=dict(small_config, protocol="sasrec"), saved=False)


def test_comparisons_count_fmlprec_as_a_baseline(small_config, tmp_path):
    overrides = {k: v for k, v in dict(small_config, epochs=1).items() if k != "seed"}
    table = compare("BSARec,FMLPRec", "tiny", seeds="5", overrides=overrides, out=tmp_path / "c")
    markdown = table["markdown"]
    assert "Improv. BSARec" in markdown
    # its own loss does not make it another protocol; the table says so
    assert "Protocol recbole (docs/protocols.md), each model with its own training loss" in (
        markdown
    )
    assert "recbole+train_loss=bce" in markdown
