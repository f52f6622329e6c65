"""MUFFIN's pieces (CIKM 2025; code ilwoong100/MUFFIN, ``recbole/model/sequential_recommender/
module.py`` and ``muffin.py``): a user-adaptive filter computed once per sequence from
its embedded spectrum, a global filter mixer scaled by it, and a mixture of frequency
bands chosen by a softmax gate with a load-balancing loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from recbole_freq.model.frequency import FilterMixer
from recbole_freq.model.layers import keeps_float32


def _spectrum(hidden: torch.Tensor) -> torch.Tensor:
    return torch.fft.rfft(hidden, dim=1, norm="ortho")


class UserAdaptiveFilter(nn.Module):
    """The user-adaptive filter ("UAF"): ``sigmoid(BatchNorm(Conv1d(|rfft(E)|)))``, a
    gain in (0, 1) per frequency bin and channel of each sequence, from the magnitude
    spectrum of its embedded input ``E`` (a 1-D convolution along the bins, ``kernel_size``
    wide with reflected padding, channels in and out ``d``).  Every filter layer of both
    encoders scales its learnable weights by it."""

    def __init__(self, hidden_size: int, kernel_size: int, seq_len: int):
        super().__init__()
        bins = seq_len // 2 + 1
        if kernel_size < 1 or kernel_size % 2 == 0 or kernel_size // 2 >= bins:
            raise ValueError(
                f"kernel_size={kernel_size} must be odd (the convolution keeps the {bins} "
                f"bins) and below {2 * bins - 1} (reflected padding needs kernel_size // 2 "
                "< the number of bins)"
            )
        self.conv = nn.Conv1d(
            hidden_size, hidden_size, kernel_size, padding=kernel_size // 2, padding_mode="reflect"
        )
        self.norm = nn.BatchNorm1d(hidden_size)

    @keeps_float32
    def forward(self, embedded: torch.Tensor) -> torch.Tensor:
        """(batch, bins, d) gains of the rows ``embedded`` (batch, n, d)."""
        magnitude = _spectrum(embedded).abs().transpose(1, 2)
        return torch.sigmoid(self.norm(self.conv(magnitude))).transpose(1, 2)


class AdaptiveGlobalFilter(nn.Module):
    """The global filter of a MUFFIN layer ("GFM"): ``irfft(rfft(X) * (U * W))`` with a
    learnable complex ``W`` (one value per bin and channel, ``0.02 N(0, 1)`` at the start)
    scaled by the sequence's user-adaptive gains ``U``."""

    def __init__(self, seq_len: int, hidden_size: int):
        super().__init__()
        self.seq_len = seq_len
        self.weight = nn.Parameter(torch.randn(1, seq_len // 2 + 1, hidden_size, 2) * 0.02)

    def filtered_spectrum(self, hidden: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
        return _spectrum(hidden) * (gains * torch.view_as_complex(self.weight))

    @keeps_float32
    def forward(self, hidden: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
        spectrum = self.filtered_spectrum(hidden, gains)
        return torch.fft.irfft(spectrum, n=hidden.size(1), dim=1, norm="ortho")


class AdaptiveGlobalMixer(FilterMixer):
    """Token mixer ``adaptive_global_filter``: FMLP-Rec's filter mixer around the global
    filter, ``LayerNorm(X + Dropout(irfft(rfft(X) U W)))``; ``gains`` (``U``) come with
    every forward pass as the encoder's per-pass context (``relations``)."""

    def forward(self, hidden, mask, wanted, relations=None):
        return {"filter": self.residual(self.filter(hidden, _gains(relations)), hidden)}


def _gains(relations) -> torch.Tensor:
    if not isinstance(relations, torch.Tensor):
        raise ValueError(
            "MUFFIN's filter layers need the sequence's user-adaptive gains with every "
            "forward pass (the encoder's relations); build the model with MUFFIN"
        )
    return relations


class BandMixtureMixer(nn.Module):
    """Token mixer ``band_mixture``, MUFFIN's local filter layer ("LFM").

    The filtered spectrum ``rfft(X) U W`` is cut into ``num_bands`` contiguous bands (band
    ``b`` the bins ``[b F // B, (b + 1) F // B)`` of ``F = n // 2 + 1``), each transformed
    back and closed by the residual path on its own, ``Y_b = LayerNorm(X + Dropout(
    irfft(band_b)))``; the output is ``sum_b p_b Y_b`` with ``p = softmax(gate([mean_f
    |X_f|; mean_f angle(X_f)]))``, the gate a Linear-LayerNorm-GELU-Linear-GELU-Linear
    network of the unfiltered spectrum's mean magnitude and mean phase.  The authors keep
    the top ``num_bands`` of ``num_bands`` probabilities (all of them) and renormalise;
    that is ``p`` itself.  ``balance_loss()`` is the load-balancing penalty of the last
    forward pass: the mean over bands of ``(mean_rows p_b - 1 / B)^2``."""

    branches = ("filter",)
    default_branches = ("filter",)

    def __init__(self, seq_len: int, hidden_size: int, num_bands: int, residual):
        super().__init__()
        bins = seq_len // 2 + 1
        if not 1 <= num_bands <= bins:
            raise ValueError(f"num_bands={num_bands} must lie in [1, {bins}] (the rfft bins)")
        self.filter = AdaptiveGlobalFilter(seq_len, hidden_size)
        self.residual = residual
        self.num_bands = num_bands
        self.gate = nn.Sequential(
            nn.Linear(2 * hidden_size, hidden_size),
            nn.LayerNorm(hidden_size),
            nn.GELU(),
            nn.Linear(hidden_size, hidden_size // 2),
            nn.GELU(),
            nn.Linear(hidden_size // 2, num_bands),
        )
        masks = torch.zeros(num_bands, bins, 1)
        for band in range(num_bands):
            masks[band, band * bins // num_bands : (band + 1) * bins // num_bands] = 1.0
        self.register_buffer("band_masks", masks, persistent=False)
        self._balance = None

    def band_probabilities(self, hidden: torch.Tensor) -> torch.Tensor:
        spectrum = _spectrum(hidden)
        features = torch.cat([spectrum.abs().mean(1), spectrum.angle().mean(1)], dim=-1)
        probs = F.softmax(self.gate(features), dim=-1)
        return probs / probs.sum(dim=-1, keepdim=True)

    @keeps_float32
    def forward(self, hidden, mask, wanted, relations=None):
        probs = self.band_probabilities(hidden)
        self._balance = ((probs.mean(0) - 1 / self.num_bands) ** 2).mean()
        spectrum = self.filter.filtered_spectrum(hidden, _gains(relations).to(hidden.dtype))
        bands = spectrum.unsqueeze(1) * self.band_masks  # (batch, bands, bins, d)
        signals = torch.fft.irfft(bands, n=hidden.size(1), dim=2, norm="ortho")
        outputs = self.residual(signals, hidden.unsqueeze(1))
        return {"filter": (probs[:, :, None, None] * outputs).sum(1)}

    def balance_loss(self) -> torch.Tensor:
        if self._balance is None:
            raise RuntimeError("balance_loss() reads the last forward pass; none ran yet")
        return self._balance
