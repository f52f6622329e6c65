"""Frequency-domain token mixers: BSARec's attentive inductive bias with its frequency
rescaler (Shin et al., AAAI 2024, eq. 2, 7) and beyond-self-attention mixer (eq. 5),
FMLP-Rec's learnable filter (Zhou et al., WWW 2022, the filter layer of its
filter-enhanced blocks), SLIME4Rec's slide filter (Du et al., ICDE 2023) and FEARec's
frequency-enhanced attention (Du et al., SIGIR 2023)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from recbole_freq.model.layers import SoftmaxAttention, keeps_float32

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


SLIDE_FILTER_MIXERS = ("G", "L", "M")
SLIDE_MODES = {  # layer index -> (global band's slide index, local band's slide index)
    "one": lambda i, n: (i, n - 1 - i),
    "two": lambda i, n: (n - 1 - i, i),
    "three": lambda i, n: (n - 1 - i, n - 1 - i),
    "four": lambda i, n: (i, i),
}


def slime4rec_bands(
    layer_index: int, n_layers: int, seq_len: int, filter_mixer: str, dynamic_ratio: float,
    slide_mode: str = "four",
) -> dict[str, range]:  # fmt: skip
    """The rfft bins each filter of a SLIME4Rec layer keeps (Du et al., ICDE 2023, the
    slide filter mixer), as the authors' ``FilterMixerLayer`` computes them, with
    ``F = seq_len // 2 + 1`` bins: the global (dynamic) band is a window of
    ``dynamic_ratio F`` bins that slides down by ``floor(F (1 - dynamic_ratio) /
    (n_layers - 1))`` a layer, the local (static) band one of ``n_layers`` disjoint
    windows of ``F / n_layers`` bins; both start at the highest bins, ``slide_mode``
    sets which slide index each band takes at a layer.  ``filter_mixer`` ``G`` keeps
    the global band, ``L`` the local one, ``M`` both (one filter each, summed)."""
    if filter_mixer not in SLIDE_FILTER_MIXERS:
        raise ValueError(
            f"filter_mixer={filter_mixer!r} is unknown; choose from {list(SLIDE_FILTER_MIXERS)}"
        )
    if slide_mode not in SLIDE_MODES:
        raise ValueError(f"slide_mode={slide_mode!r} is unknown; choose from {list(SLIDE_MODES)}")
    if n_layers < 2:
        raise ValueError(
            f"SLIME4Rec's bands slide over n_layers - 1 steps: n_layers={n_layers} must be "
            "at least 2"
        )
    if not 0.0 < dynamic_ratio <= 1.0:
        raise ValueError(f"dynamic_ratio={dynamic_ratio} must lie in (0, 1]")
    bins = seq_len // 2 + 1
    global_index, local_index = SLIDE_MODES[slide_mode](layer_index, n_layers)
    bands = {}
    if filter_mixer in ("G", "M"):
        step = (bins * (1 - dynamic_ratio)) // (n_layers - 1)
        start = bins * (1 - dynamic_ratio) - global_index * step
        bands["global"] = range(int(start), int(bins - global_index * step))
    if filter_mixer in ("L", "M"):
        width = (1 / n_layers) * bins  # the authors' order of operations, to the bit
        start = bins * (1 - 1 / n_layers) - local_index * width
        bands["local"] = range(int(start), int(bins - local_index * width))
    return bands


class SlideFilter(nn.Module):
    """SLIME4Rec's slide filter (Du et al., ICDE 2023, the filter mixer of each layer):
    ``irfft(sum_b M_b * rfft(X) * W_b)`` along the sequence, one learnable complex filter
    ``W_b`` (one value per bin and hidden dimension, ``0.02 N(0, 1)`` at the start, as
    FMLP-Rec's) for each band ``b`` of ``slime4rec_bands`` and ``M_b`` its 0/1 mask over
    the bins.  Like FMLP-Rec's filter it mixes the whole window, padding included."""

    def __init__(self, seq_len: int, hidden_size: int, bands: dict[str, range]):
        super().__init__()
        self.seq_len, self.band_ranges = seq_len, dict(bands)
        bins = seq_len // 2 + 1
        self.weights = nn.ParameterDict(
            {
                name: nn.Parameter(torch.randn(1, bins, hidden_size, 2) * 0.02)
                for name in self.band_ranges
            }
        )
        for name, band in self.band_ranges.items():
            keep = torch.zeros(1, bins, 1)
            keep[:, band.start : band.stop] = 1.0
            self.register_buffer(f"{name}_mask", keep, persistent=False)

    @keeps_float32
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        spectrum = torch.fft.rfft(hidden, dim=1, norm="ortho")
        filtered = sum(
            spectrum * getattr(self, f"{name}_mask") * torch.view_as_complex(weight)
            for name, weight in self.weights.items()
        )
        return torch.fft.irfft(filtered, n=hidden.size(1), dim=1, norm="ortho")

    def extra_repr(self) -> str:
        bands = ", ".join(f"{name}=[{r.start}, {r.stop})" for name, r in self.band_ranges.items())
        return f"seq_len={self.seq_len}, {bands}"


def fearec_band(layer_index: int, n_layers: int, seq_len: int, global_ratio: float) -> range:
    """The rfft bins layer ``layer_index`` of FEARec samples: its frequency ramp (Du et
    al., SIGIR 2023, "frequency ramp structure"), as the authors' ``HybridAttention``
    computes it.  With ``global_ratio > 1 / n_layers`` every layer keeps a window of
    ``global_ratio`` of the ``n // 2 + 1`` bins, the first layer the highest, each next
    layer slid down by ``floor(bins (1 - global_ratio) / (n_layers - 1))``; otherwise the
    layers share the bins out in ``n_layers`` disjoint windows, highest first."""
    if n_layers < 2:
        raise ValueError(
            f"FEARec's frequency ramp slides over n_layers - 1 steps: n_layers={n_layers} "
            "must be at least 2"
        )
    bins = seq_len // 2 + 1
    local_ratio = 1 / n_layers
    if global_ratio > local_ratio:
        width, step = global_ratio, (bins * (1 - global_ratio)) // (n_layers - 1)
    else:
        width, step = local_ratio, local_ratio * bins
    return range(int(bins * (1 - width) - layer_index * step), int(bins - layer_index * step))


def circulant_index(length: int, device=None) -> torch.Tensor:
    """``index[t, s] = (s - t) mod length``: row ``t`` of the circulant matrix of a
    kernel ``w`` over time delays is ``w[index[t]]``."""
    positions = torch.arange(length, device=device)
    return (positions[None, :] - positions[:, None]) % length


def band_pass_projector(keep: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Matrix ``P`` with ``P x = irfft(keep * rfft(x), n=seq_len)`` along the sequence,
    ``keep`` a real weight per rfft bin: built once in float64 from the FFT of the
    identity, so applying it is one small real matmul (equal in arithmetic)."""
    spectrum = torch.fft.rfft(torch.eye(seq_len, dtype=torch.float64), dim=0)
    spectrum = spectrum * keep.to(torch.float64)[:, None]
    return torch.fft.irfft(spectrum, n=seq_len, dim=0).to(torch.float32)


def circular_correlation_sums(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """``c[b, tau] = sum_{h, t, c} first[b, h, (t + tau) mod n, c] second[b, h, t, c]``
    for inputs (batch, heads, n, channels): ``irfft(rfft(first) conj(rfft(second)))``
    summed over heads and channels, as the Gram matrices over time of each head, summed,
    and the sums along their wrapped diagonals (per head, so that no transposed copy of
    the inputs is kept for the backward pass)."""
    gram = torch.matmul(first, second.transpose(-1, -2)).sum(dim=1)
    length = first.size(2)
    steps = torch.arange(length, device=first.device)
    lagged_rows = (steps[:, None] + steps[None, :]) % length  # [tau, t] -> (t + tau) mod n
    return gram[:, lagged_rows, steps.expand(length, length)].sum(dim=-1)


class FrequencyEnhancedAttention(nn.Module):
    """FEARec's hybrid attention as an attention operator, per head: (Q, K, V) -> context.

    - Frequency-domain attention (the auto-correlation of Autoformer that FEARec adopts):
      ``R = irfft(B * rfft(Q) conj(rfft(K)))`` along the sequence, ``B`` the layer's
      ``band`` (``fearec_band``), averaged over heads and channels to one score per time
      delay; the ``k = int(topk_factor ln n)`` strongest delays (in training the batch's,
      in inference each row's own, as in the authors' two code paths) are
      softmax-weighted, ``V`` rolled by each delay and summed.  The authors' loop of
      ``k`` rolls is done here as one product with the circulant matrix of the weighted
      delays, ``(M)_{t,s} = w(s - t mod n)``: the same sum, one batched matmul, no
      ``k`` copies of ``V``.
    - Time-domain attention (``dual_domain``): softmax attention over ``Q``, ``K``, ``V``
      low-passed to the same band (``std: True``) or to every bin, mixed in with weight
      ``spatial_ratio``.

    Only the score averaged over heads and channels is ever used, and the FFT is linear,
    so the score is computed without a per-channel correlation: for an even ``n``, as
    the circular correlation of ``P_B Q`` with ``K`` (``P_B`` the band's real n x n
    projector, ``band_pass_projector``) summed over heads and channels, a Gram matrix and
    its wrapped diagonals; for an odd ``n`` the authors' ``irfft`` (no length given)
    returns ``n - 1`` delays of no circular correlation, so the spectra are averaged and
    that ``irfft`` taken.  The band-passed ``Q``, ``K``, ``V`` of the time-domain
    attention are matmuls with the projector.  The same function as the authors' FFTs up
    to float rounding (tests/test_fearec.py against RecBole's FEARec), about 5% less time
    per training step on the CPU (benchmarks/results/speed-fearec-lastfm-cpu.md).

    The arithmetic runs in float32 outside autocast (half precision would round the
    spectra and the projectors, and rfft of a length that is not a power of two has no
    half-precision kernel).
    """

    def __init__(
        self, seq_len: int, layer_index: int, n_layers: int, attn_dropout_prob: float,
        topk_factor: float = 1.0, global_ratio: float = 0.6, dual_domain: bool = False,
        spatial_ratio: float = 0.0, std: bool = False,
    ):  # fmt: skip
        super().__init__()
        if not topk_factor > 0:
            raise ValueError(f"FEARec needs topk_factor > 0, got {topk_factor!r}")
        self.seq_len, self.topk_factor = seq_len, float(topk_factor)
        self.delays = int(self.topk_factor * math.log(seq_len))
        band = fearec_band(layer_index, n_layers, seq_len, float(global_ratio))
        self.band_range = (band.start, band.stop)
        bins = seq_len // 2 + 1
        keep = torch.zeros(bins)
        keep[band.start : band.stop] = 1.0
        self.register_buffer("band", keep, persistent=False)
        self.register_buffer("band_pass", band_pass_projector(keep, seq_len), persistent=False)
        self.std = bool(std)
        self.register_buffer("circulant", circulant_index(seq_len), persistent=False)
        self.dual_domain, self.spatial_ratio = bool(dual_domain), float(spatial_ratio)
        self.time_attention = SoftmaxAttention(attn_dropout_prob) if self.dual_domain else None

    def forward(self, query, key, value, mask):
        device_type = query.device.type
        if torch.is_autocast_enabled(device_type):
            with torch.autocast(device_type=device_type, enabled=False):
                return self._attend(query.float(), key.float(), value.float(), mask)
        return self._attend(query, key, value, mask)

    def _attend(self, query, key, value, mask):
        band_passed_query = torch.matmul(self.band_pass, query)
        context = self.aggregate_delays(value, self.delay_scores(query, key, band_passed_query))
        if not self.dual_domain:
            return context
        if self.std:
            time_inputs = (
                band_passed_query,
                *(torch.matmul(self.band_pass, part) for part in (key, value)),
            )
        else:  # every bin kept: the low pass is the identity
            time_inputs = (query, key, value)
        spatial = self.time_attention(*time_inputs, mask)
        return (1 - self.spatial_ratio) * context + self.spatial_ratio * spatial

    def delay_scores(self, query, key, band_passed_query):
        """``mean_{h, c} irfft(B rfft(Q) conj(rfft(K)))``: one score per time delay and
        row, (batch, delays); inputs (batch, heads, n, channels)."""
        length = query.size(-2)
        if length % 2:
            spectra = torch.fft.rfft(query, dim=-2) * torch.fft.rfft(key, dim=-2).conj()
            return torch.fft.irfft(spectra.mean(dim=(1, 3)) * self.band, dim=-1)
        sums = circular_correlation_sums(band_passed_query, key)
        return sums / (query.size(1) * query.size(-1))

    def aggregate_delays(self, value, score):
        """``sum_i w_i roll(V, -d_i)`` over the strongest delays ``d_i`` (the authors'
        ``time_delay_agg_training`` / ``_inference``); ``value``: (batch, heads, n,
        channels), ``score``: (batch, delays)."""
        batch, length = value.size(0), value.size(-2)
        if self.training:
            delays = torch.topk(score.mean(dim=0), self.delays, dim=-1).indices
            weights = score[:, delays]
            delays = delays.expand(batch, -1)
        else:
            weights, delays = torch.topk(score, self.delays, dim=-1)
        kernel = value.new_zeros(batch, length).scatter_add(1, delays, weights.softmax(dim=-1))
        return torch.matmul(kernel[:, self.circulant].unsqueeze(1), value)

    def extra_repr(self) -> str:
        return (
            f"bins={self.band_range}, delays={self.delays}, dual_domain={self.dual_domain}, "
            f"spatial_ratio={self.spatial_ratio}"
        )
