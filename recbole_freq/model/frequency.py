"""Frequency-domain token mixers: BSARec's attentive inductive bias with its frequency
rescaler (Shin et al., AAAI 2024, eq. 2, 7) and beyond-self-attention mixer (eq. 5), and
FMLP-Rec's learnable filter (Zhou et al., WWW 2022, the filter layer of its
filter-enhanced blocks)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from recbole_freq.model.layers import keeps_float32

BSA_BRANCHES = ("bsa", "sa", "ib")


def low_pass_projector(seq_len: int, low_bins: int) -> torch.Tensor:
    """Matrix ``P`` with ``P x = LFC[x]``: keep the lowest ``low_bins`` rfft bins (eq. 2).

    Built once from the orthonormal real FFT of the identity, so applying it is one
    small matmul per layer and equals ``irfft(mask * rfft(x))`` exactly in arithmetic.
    """
    identity = torch.eye(seq_len, dtype=torch.float64)
    spectrum = torch.fft.rfft(identity, dim=0, norm="ortho")
    spectrum[low_bins:] = 0
    return torch.fft.irfft(spectrum, n=seq_len, dim=0, norm="ortho").to(torch.float32)


# From this sequence length on, LFC[X] is computed as irfft(rfft(X)[:bins]) instead of
# the dense n x n projection: the matmul costs n^2 d per sequence against the FFT's
# n log n d and holds an n x n matrix.  The crossover was measured on the CPU (training
# step of the rescaler alone, batch 256, d 64; benchmarks/bench_low_pass.py and
# benchmarks/results/low-pass-crossover-cpu.md): below it the matmul is faster.
FFT_LOW_PASS_FROM_LENGTH = 256
LOW_PASS_METHODS = ("auto", "matmul", "fft")


class FrequencyRescaler(nn.Module):
    """Attentive inductive bias with frequency rescaler, BSARec eq. 7.

    ``A_IB X = LFC[X] + beta * HFC[X]`` along the sequence axis.  Following the
    authors' code, the paper's ``c`` keeps ``c // 2 + 1`` rfft bins (the frequency-0 bin
    and ``c // 2`` more), ``HFC = X - LFC``, and ``beta = sqrt_beta ** 2`` stays
    non-negative; ``sqrt_beta`` starts from a standard normal draw.  ``beta_type``
    ``vector`` learns one beta per hidden dimension, ``scalar`` one per layer.
    ``method`` picks how ``LFC`` is computed (the same function either way): ``matmul``
    (dense projector), ``fft`` (rfft/irfft) or ``auto`` (``fft`` from
    ``FFT_LOW_PASS_FROM_LENGTH`` on).
    """

    def __init__(
        self, seq_len: int, c: int, hidden_size: int, beta_type: str = "vector", method="auto"
    ):
        super().__init__()
        n_bins = seq_len // 2 + 1
        low_bins = c // 2 + 1
        if c < 1 or low_bins > n_bins:
            raise ValueError(
                f"c={c} is out of range for MAX_ITEM_LIST_LENGTH={seq_len}: c keeps "
                f"c // 2 + 1 = {low_bins} of the {n_bins} rfft bins of the sequence; "
                f"choose 1 <= c <= {2 * n_bins - 1}"
            )
        if beta_type not in ("vector", "scalar"):
            raise ValueError(f"beta_type={beta_type!r} is unknown; use 'vector' or 'scalar'")
        if method not in LOW_PASS_METHODS:
            raise ValueError(
                f"low-pass method {method!r} is unknown; use one of {LOW_PASS_METHODS}"
            )
        if method == "auto":
            method = "fft" if seq_len >= FFT_LOW_PASS_FROM_LENGTH else "matmul"
        self.seq_len = seq_len
        self.c = c
        self.low_bins = low_bins
        self.method = method
        width = hidden_size if beta_type == "vector" else 1
        self.sqrt_beta = nn.Parameter(torch.randn(1, 1, width))
        projector = low_pass_projector(seq_len, low_bins) if method == "matmul" else None
        self.register_buffer("low_pass", projector, persistent=False)

    @property
    def beta(self) -> torch.Tensor:
        return self.sqrt_beta.square().flatten()

    @keeps_float32
    def low_frequency(self, hidden: torch.Tensor) -> torch.Tensor:
        """``LFC[X]`` of eq. 2 along the sequence axis (dim 1)."""
        if self.low_pass is not None:
            return torch.matmul(self.low_pass, hidden)
        spectrum = torch.fft.rfft(hidden, dim=1, norm="ortho")[:, : self.low_bins]
        return torch.fft.irfft(spectrum, n=self.seq_len, dim=1, norm="ortho")

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        low = self.low_frequency(hidden)
        return low + self.sqrt_beta.square() * (hidden - low)

    def extra_repr(self) -> str:
        return f"seq_len={self.seq_len}, c={self.c}, method={self.method}"


class BeyondSelfAttentionMixer(nn.Module):
    """Beyond-self-attention layer, BSARec eq. 5: ``S = alpha A_IB X + (1 - alpha) A X``.

    As in the authors' code each term has its own residual path (dropout, residual,
    LayerNorm) before the mix.  Offers three branches for FBSARec's cross fusion:
    ``bsa`` = S, ``sa`` = A X and ``ib`` = A_IB X.  A term with zero weight that no
    requested branch needs is not computed.
    """

    branches = BSA_BRANCHES
    default_branches = ("bsa",)

    def __init__(self, attention, rescaler: FrequencyRescaler, residual, alpha: float):
        super().__init__()
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha={alpha} must lie in [0, 1] (0: only A, 1: only A_IB)")
        self.attention = attention
        self.rescaler = rescaler
        self.residual = residual
        self.alpha = alpha

    def forward(self, hidden, mask, wanted: Sequence[str], relations=None):
        need_sa = "sa" in wanted or ("bsa" in wanted and self.alpha < 1.0)
        need_ib = "ib" in wanted or ("bsa" in wanted and self.alpha > 0.0)
        features = {}
        if need_ib:
            features["ib"] = self.residual(self.rescaler(hidden), hidden)
        if need_sa:
            features["sa"] = self.attention(hidden, mask, relations)
        if "bsa" in wanted:
            if self.alpha == 0.0:
                features["bsa"] = features["sa"]
            elif self.alpha == 1.0:
                features["bsa"] = features["ib"]
            else:
                features["bsa"] = self.alpha * features["ib"] + (1 - self.alpha) * features["sa"]
        return features


class LearnableFilter(nn.Module):
    """FMLP-Rec's filter layer (Zhou et al., WWW 2022, "learnable filters"): the
    orthonormal real FFT of the sequence along its axis, ``X = F(F^l)``, multiplied
    element-wise by a learnable complex filter ``W`` of one value per frequency bin and
    hidden dimension, ``X~ = W * X``, and transformed back, ``F~ = F^-1(X~)``.

    As in the authors' ``FilterLayer`` (Woeee/FMLP-Rec, ``modules.py``), ``W`` starts
    from ``0.02 N(0, 1)`` in its real and imaginary parts.  The filter mixes every
    position, padding included, so a row shorter than ``n`` gives a different output
    under RecBole's right padding and the authors' left padding (its padding positions
    carry other position embeddings): ``sequence_layout`` chooses, ``left`` under
    ``--protocol=fmlprec`` and ``bsarec``.
    """

    def __init__(self, seq_len: int, hidden_size: int):
        super().__init__()
        self.seq_len = seq_len
        self.complex_weight = nn.Parameter(
            torch.randn(1, seq_len // 2 + 1, hidden_size, 2, dtype=torch.float32) * 0.02
        )

    @keeps_float32
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        spectrum = torch.fft.rfft(hidden, dim=1, norm="ortho")
        spectrum = spectrum * torch.view_as_complex(self.complex_weight)
        return torch.fft.irfft(spectrum, n=self.seq_len, dim=1, norm="ortho")

    def extra_repr(self) -> str:
        return f"seq_len={self.seq_len}"


class FilterMixer(nn.Module):
    """Token mixer of FMLP-Rec's filter-enhanced blocks: the learnable filter closed by
    its residual path, ``LayerNorm(F^l + Dropout(F~))``; the branch ``filter``.
    It mixes over the whole sequence, attention mask unused, as in the authors' code."""

    branches = ("filter",)
    default_branches = ("filter",)

    def __init__(self, filter_layer: LearnableFilter, residual):
        super().__init__()
        self.filter = filter_layer
        self.residual = residual

    def forward(self, hidden, mask, wanted: Sequence[str], relations=None):
        return {"filter": self.residual(self.filter(hidden), hidden)}
