"""Mixed precision (RecBole's ``enable_amp``, the plugin's ``amp_dtype``) on the CPU, where
autocast computes in bfloat16: every plugin model trains with finite losses, and the
frequency filters keep float32."""

import math

import pytest
import torch

from recbole_freq.model import MODELS
from recbole_freq.model.frequency import (
    FrequencyEnhancedAttention,
    FrequencyRescaler,
    LearnableFilter,
)
from recbole_freq.model.polynomial import TruncatedResidual
from recbole_freq.quick_start.quick_start import run


@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_plugin_model_trains_under_mixed_precision(small_config, model):
    settings = dict(small_config, epochs=1, enable_amp=True)
    if model == "FEARec":  # int(10 ln 12) delays would not fit these short rows
        settings["topk_factor"] = 3
    summary = run(model, "tiny", config_dict=settings)
    losses = [epoch["train_loss"] for epoch in summary["history"]]
    assert losses and all(math.isfinite(loss) for loss in losses)
    assert all(0 <= value <= 1 for value in summary["test_result"].values())


FILTERS = {
    "BSARec low-pass (matmul)": lambda: FrequencyRescaler(12, 3, 16, method="matmul"),
    "BSARec low-pass (fft)": lambda: FrequencyRescaler(12, 3, 16, method="fft"),
    "FMLP-Rec filter": lambda: LearnableFilter(12, 16),
    "PolyRec truncated residual": lambda: TruncatedResidual(16, 12, 0.0, 1e-12, 0.5, 4),
    "FEARec hybrid attention": lambda: FrequencyEnhancedAttention(
        12, 0, 2, 0.0, topk_factor=3, dual_domain=True, spatial_ratio=0.1, std=True
    ),
}


@pytest.mark.parametrize("name", list(FILTERS))
def test_frequency_filters_compute_in_float32_under_autocast(name):
    torch.manual_seed(0)
    layer = FILTERS[name]().eval()
    hidden = torch.randn(4, 12, 16)
    if isinstance(layer, TruncatedResidual):
        apply = layer.truncated_skip
    elif isinstance(layer, FrequencyEnhancedAttention):  # per head: (4, 2 heads, 12, 8)
        mask = torch.ones(4, 1, 12, 12, dtype=torch.bool).tril()
        parts = [torch.randn(4, 2, 12, 8) for _ in range(3)]
        apply = lambda x: layer(parts[0] + x[:, None, :, :8], parts[1], parts[2], mask)  # noqa: E731
    else:
        apply = layer
    full = apply(hidden)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        mixed = apply(hidden)
    # bfloat16 would be off by about 1e-2 relative (8 bits of mantissa).
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, full, rtol=1e-6, atol=1e-6)


def test_amp_dtype_sets_the_precision_of_the_training_step(small_config, monkeypatch):
    from recbole_freq.model.sequential_recommender.bsarec import BSARec

    seen = set()
    original = BSARec.calculate_loss

    def recording(self, interaction):
        seen.add((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return original(self, interaction)

    monkeypatch.setattr(BSARec, "calculate_loss", recording)
    settings = dict(small_config, epochs=1, enable_amp=True, amp_dtype="float16")
    summary = run("BSARec", "tiny", config_dict=settings)
    assert seen == {(True, torch.float16)}
    assert math.isfinite(summary["history"][0]["train_loss"])
    # Only during the epoch: torch's default is back afterwards.
    assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    seen.clear()
    run("BSARec", "tiny", config_dict=dict(small_config, epochs=1, enable_amp=True))
    assert seen == {(True, torch.bfloat16)}


def test_an_unknown_amp_dtype_is_one_line(small_config):
    with pytest.raises(ValueError, match="amp_dtype='float8' is not a mixed-precision type"):
        run("BSARec", "tiny", config_dict=dict(small_config, enable_amp=True, amp_dtype="float8"))
