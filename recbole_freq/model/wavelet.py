"""WEARec's token mixer (AAAI 2026, "wavelet-enhanced adaptive frequency
filtering"): a per-sequence adaptive Fourier filter beside a one-level Haar wavelet
branch, both per head, mixed with a fixed weight."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from recbole_freq.model.layers import keeps_float32


class AdaptiveWaveletFilter(nn.Module):
    r"""The mixing operator of a WEARec layer, before its dropout, residual and LayerNorm.

    The hidden states are split into ``n_heads`` heads of ``d / n_heads`` channels
    (``X_h``, sequence along the second axis) and transformed twice:

    - global, adaptive filtering: ``X~_h = irfft(rfft(X_h) * (W_h (1 + s_h(x)) ) + b_h +
      t_h(x))``, the orthonormal real FFT along the sequence, a real gain ``W_h`` and a
      real offset ``b_h`` per head and frequency bin (shared by the head's channels; ``W``
      starts at 1, ``b`` at -0.1, as in the authors' code), each modulated per sequence by
      ``(s, t) = MLP(mean_t x_t)``, a two-layer GELU MLP of the mean token over the whole
      window (padding positions included, as the authors average);
    - local, wavelet: a one-level Haar transform of each pair of positions
      ``(2i, 2i + 1)``: ``a = (x_{2i} + x_{2i+1}) / 2``, ``d = (x_{2i} - x_{2i+1}) / 2``,
      the detail coefficients scaled by a learned weight ``V`` per head, pair and channel
      (``0.02 N(0, 1)`` at the start), and reconstructed ``x'_{2i} = a + V d``,
      ``x'_{2i+1} = a - V d``; with an odd length the last position gets 0.

    Output: ``(1 - alpha) * wavelet + alpha * fourier`` with ``alpha`` fixed (the authors'
    ``alpha`` argument; their ``gate`` parameter is declared but unused).  The offset is
    added to the complex spectrum's real part only, as a real tensor added to a complex
    one is.  Both branches mix every position of the window, padding included, so the
    result depends on where the padding sits (``sequence_layout``: ``left`` is the
    authors').  ``adaptive: False`` drops the MLP (``s = t = 0``), the authors'
    non-adaptive path.
    """

    def __init__(
        self, seq_len: int, hidden_size: int, n_heads: int, alpha: float, adaptive: bool = True
    ):
        super().__init__()
        if hidden_size % n_heads:
            raise ValueError(
                f"WEARec splits hidden_size={hidden_size} into n_heads={n_heads} heads: "
                "hidden_size must be a multiple of n_heads"
            )
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha={alpha} must lie in [0, 1] (the Fourier branch's weight)")
        self.seq_len, self.n_heads, self.alpha = seq_len, n_heads, float(alpha)
        self.head_size = hidden_size // n_heads
        self.bins = seq_len // 2 + 1
        self.detail_weight = nn.Parameter(
            torch.randn(1, n_heads, seq_len // 2, self.head_size) * 0.02
        )
        self.base_gain = nn.Parameter(torch.ones(n_heads, self.bins, 1))
        self.base_offset = nn.Parameter(torch.full((n_heads, self.bins, 1), -0.1))
        self.modulation = None
        if adaptive:
            self.modulation = nn.Sequential(
                nn.Linear(hidden_size, hidden_size),
                nn.GELU(),
                nn.Linear(hidden_size, n_heads * self.bins * 2),
            )

    @keeps_float32
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, length, size = hidden.shape
        heads = hidden.view(batch, length, self.n_heads, self.head_size).transpose(1, 2)
        mixed = (1.0 - self.alpha) * self.haar(heads) + self.alpha * self.fourier(hidden, heads)
        return mixed.transpose(1, 2).reshape(batch, length, size)

    def fourier(self, hidden: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        gain, offset = self.base_gain, self.base_offset
        if self.modulation is not None:
            scale_shift = self.modulation(hidden.mean(dim=1))
            scale_shift = scale_shift.view(hidden.size(0), self.n_heads, self.bins, 2)
            gain = gain * (1 + scale_shift[..., :1])
            offset = offset + scale_shift[..., 1:]
        spectrum = torch.fft.rfft(heads, dim=2, norm="ortho")
        return torch.fft.irfft(spectrum * gain + offset, n=heads.size(2), dim=2, norm="ortho")

    def haar(self, heads: torch.Tensor) -> torch.Tensor:
        length = heads.size(2)
        pairs = heads[:, :, : length - length % 2].unflatten(2, (length // 2, 2))
        even, odd = pairs[..., 0, :], pairs[..., 1, :]
        approx, detail = (even + odd) / 2, (even - odd) / 2 * self.detail_weight
        out = torch.stack((approx + detail, approx - detail), dim=3).flatten(2, 3)
        return F.pad(out, (0, 0, 0, length % 2))

    def extra_repr(self) -> str:
        return (
            f"seq_len={self.seq_len}, n_heads={self.n_heads}, alpha={self.alpha}, "
            f"adaptive={self.modulation is not None}"
        )
