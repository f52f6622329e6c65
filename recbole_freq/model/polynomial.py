"""PolyRec's pieces (Ji et al., "PolyRec: Polynomial Attention for Enhanced Sequential
Recommendation"): Chebyshev polynomial attention (eq. 10-12), an attention operator, and
the truncated residual connection (eq. 13), a residual path."""

from __future__ import annotations

import torch
from torch import nn

from recbole_freq.model.layers import (
    Dropout,
    StandardResidual,
    attention_probabilities,
    keeps_float32,
)
from recbole_freq.utils.options import as_number, integer_option


def chebyshev_terms(matrix: torch.Tensor, values: torch.Tensor, order: int):
    """Yield ``T_k(A) V`` for ``k = 0..order`` by the Chebyshev recursion on the values.

    ``Y_0 = V``, ``Y_1 = A V``, ``Y_{k+1} = 2 A Y_k - Y_{k-1}`` (PolyRec eq. 12 with
    ``T_{k+1}(A) = 2 A T_k(A) - T_{k-1}(A)`` applied to V): each order costs one
    ``(L x L) @ (L x d)`` product; no matrix power or ``T_k(A)`` is ever formed.
    ``matrix`` is ``(..., L, L)``, ``values`` ``(..., L, d)`` with the same leading dims.
    """
    yield values
    if order < 1:
        return
    shape = values.shape
    # Flattened to 3-D so that baddbmm computes 2 A Y_k - Y_{k-1} in one kernel.
    matrix = matrix.reshape(-1, *matrix.shape[-2:])
    previous = values.reshape(-1, *shape[-2:])
    current = torch.bmm(matrix, previous)
    yield current.view(shape)
    for _ in range(order - 1):
        previous, current = current, torch.baddbmm(previous, matrix, current, beta=-1, alpha=2)
        yield current.view(shape)


class ChebyshevAttention(nn.Module):
    """Polynomial attention operator, PolyRec eq. 10-12: ``H V = sum_k w_k T_k(A) V``.

    ``A`` is the causal, row-stochastic softmax attention matrix of eq. 3 (per head) and
    ``T_k`` the Chebyshev polynomials (``T_0 = I``, ``T_1 = A``), evaluated by the
    recursion on the value vectors in ``chebyshev_terms`` (eq. 12).  ``order`` is K;
    ``order = 0`` leaves ``w_0 V`` (no token mixing).

    Coefficients: ``order + 1`` learnable weights per layer, or per head with
    ``per_head`` (the paper does not say; heads see different ``A`` and may want
    different filters).  Initialisation ``w = (0, 1, 0, ..., 0)``: since ``T_1(A) = A``
    the operator starts as exactly the softmax attention that PolyRec extends, so
    training starts from the working baseline, higher orders grow only where the loss
    rewards them, and the learned magnitudes (``start_recording``) show what training
    wanted from each order instead of echoing an arbitrary initial mix.

    Attention dropout drops entries of ``A`` and renormalises each row to sum 1, instead
    of the inverted dropout of the softmax operator: the eigenvalues of the triangular
    ``A`` are its diagonal entries, which inverted dropout scales to ``1 / (1 - p)`` (2
    at p = 0.5), outside [-1, 1] where Chebyshev polynomials are bounded (``T_3(2) =
    26``).  Renormalised, ``A`` stays row-stochastic and every ``T_k(A)`` keeps unit row
    sums.  The dropped keys are masked before the softmax, which renormalises over the
    kept ones for free; a row that would lose all its keys keeps them (an empty row
    would give NaN, and 0 * NaN in the next product spreads it to every row).
    Without dropout (evaluation) nothing changes.
    """

    def __init__(self, dropout_prob: float, order: int = 3, n_heads: int = 1, per_head=False):
        super().__init__()
        if not 0.0 <= dropout_prob < 1.0:
            raise ValueError(f"attn_dropout_prob={dropout_prob} must lie in [0, 1)")
        self.order = integer_option(
            order, "poly_order", 0, "it is the Chebyshev order K of PolyRec eq. 12, e.g. 3"
        )
        self.dropout_prob = dropout_prob
        initial = torch.zeros(n_heads if per_head else 1, self.order + 1)
        initial[:, min(self.order, 1)] = 1.0  # w = (0, 1, 0, ...): plain attention
        self.coefficients = nn.Parameter(initial)
        self._recorded: torch.Tensor | None = None
        self._recorded_tokens = 0

    def forward(self, query, key, value, mask):
        weights = self.coefficients.view(1, -1, self.order + 1, 1, 1)
        if self.order == 0:
            terms = iter([value])
        else:
            if self.training and self.dropout_prob > 0:
                draws = torch.rand(*query.shape[:-1], key.size(-2), device=query.device)
                kept = mask & (draws >= self.dropout_prob)
                attend = torch.where(kept.any(dim=-1, keepdim=True), kept, mask)
            else:
                attend = mask
            probs = attention_probabilities(query, key, attend)
            terms = chebyshev_terms(probs, value, self.order)
        output = 0
        for k, term in enumerate(terms):
            contribution = weights[:, :, k] * term
            output = output + contribution
            if self._recorded is not None:
                self._record(k, contribution, mask)
        return output

    def start_recording(self) -> None:
        """Accumulate, over the following forward passes, the mean norm of each order's
        contribution ``w_k T_k(A) V`` per real token (all heads' values concatenated)."""
        self._recorded = torch.zeros(self.order + 1, dtype=torch.float64)
        self._recorded_tokens = 0

    def stop_recording(self) -> torch.Tensor:
        """Mean contribution norm per order since ``start_recording``; stops recording."""
        if self._recorded is None:
            raise RuntimeError("stop_recording() called without start_recording()")
        result = self._recorded / max(self._recorded_tokens, 1)
        self._recorded, self._recorded_tokens = None, 0
        return result.float()

    def _record(self, k: int, contribution: torch.Tensor, mask: torch.Tensor) -> None:
        # A query position holds an item exactly when it may attend to itself (a
        # key-only mask, as in bidirectional attention, marks the items directly).
        if mask.size(-2) == 1:
            real = mask[:, 0, 0].expand(contribution.size(0), -1)
        else:
            real = mask[:, 0].diagonal(dim1=-2, dim2=-1)
        norms = contribution.detach().square().sum(dim=(1, 3)).sqrt()  # (batch, seq_len)
        self._recorded[k] += norms[real].sum().item()
        if k == 0:
            self._recorded_tokens += int(real.sum())

    def extra_repr(self) -> str:
        heads = self.coefficients.size(0)
        return f"order={self.order}, coefficient_sets={heads}, dropout={self.dropout_prob}"


TRUNCATED_SKIP_READINGS = ("truncated", "identity_and_truncated", "bsarec_mix")


class TruncatedResidual(nn.Module):
    """Truncated residual connection, PolyRec eq. 13:
    ``x_{i+1} = alpha f(x_i) + (1 - alpha) IFFT(F_C(x_i) * K)``.

    ``F_C`` keeps the lowest ``bins`` (the paper's C) bins of the orthonormal real FFT
    along the sequence, ``K`` is a learnable complex filter on those bins (one value per
    bin and hidden dimension), and the inverse FFT returns to the sequence with every
    other bin zero; ``T(x) = IFFT(F_C(x) K)`` below.  The paper does not say whether the
    identity skip ``x`` stays (section 4.4 says alpha "balances truncated residual
    connections and standard residual connections"), so ``reading`` (``trc_skip``) names
    the three readings, each closed by dropout on the sub-layer and LayerNorm like every
    sub-layer of the core:

    - ``truncated``: eq. 13 with ``f(x)`` the bare sub-layer, the identity skip replaced
      by the truncated one: ``LayerNorm(alpha Dropout(f(x)) + (1 - alpha) T(x))``.  The
      newest item keeps only its share of a C-bin low-pass of the whole window.
    - ``identity_and_truncated`` (the default since the Beauty screening of issue 66:
      it led the other two in validation NDCG@20 at every epoch from 2 to 21, then ran
      level with ``bsarec_mix``; docs/models.md):
      eq. 13 with ``f(x)`` the sub-layer with its standard residual, so alpha balances
      the standard residual against the truncated one:
      ``LayerNorm(alpha (x + Dropout(f(x))) + (1 - alpha) T(x))``.
    - ``bsarec_mix``: the truncated skip as a second branch beside the sub-layer, each
      with its own dropout, identity skip and LayerNorm, mixed as BSARec eq. 5 mixes its
      two branches: ``alpha LayerNorm(x + Dropout(f(x))) + (1 - alpha) LayerNorm(x +
      Dropout(T(x)))``.

    ``K`` starts at 1 + 0i, so the skip starts as the exact low-pass projection of ``x``
    (what the identity skip keeps after truncation) and learns per-bin gains and phases
    from there; the paper gives no initialisation.

    Like BSARec's filter the skip mixes all positions of the (right-padded) input, later
    ones included; RecBole trains on prefixes whose target is never in the input, so no
    target leaks into a prediction.
    """

    def __init__(
        self, hidden_size, max_seq_length, dropout_prob, layer_norm_eps, alpha, bins,
        reading="identity_and_truncated",
    ):  # fmt: skip
        super().__init__()
        alpha, bins = _truncated_residual_options(alpha, bins, max_seq_length)
        self.alpha = alpha
        self.bins = bins
        self.reading = _skip_reading(reading)
        self.dropout = Dropout(dropout_prob)
        self.layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        if self.reading == "bsarec_mix":
            self.skip_dropout = Dropout(dropout_prob)
            self.skip_layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        gain = torch.zeros(bins, hidden_size, 2)
        gain[..., 0] = 1.0  # K = 1 + 0i (real and imaginary parts stored as a pair)
        self.spectral_filter = nn.Parameter(gain)
        analysis, synthesis = truncated_dft_bases(max_seq_length, bins)
        self.register_buffer("analysis", analysis, persistent=False)
        self.register_buffer("synthesis", synthesis, persistent=False)

    @keeps_float32
    def truncated_skip(self, hidden: torch.Tensor) -> torch.Tensor:
        """``IFFT(F_C(x) * K)`` along the sequence axis (dim 1).

        Computed with the C-bin real DFT bases of ``truncated_dft_bases``: the same
        numbers as ``irfft(rfft(x, norm="ortho")[:C] * K)`` (the tests compare them),
        about 3.5x faster than two full FFTs on the CPU because C is small.
        """
        bases = self.analysis, self.synthesis
        if bases[0].size(1) != hidden.size(1):
            if hidden.size(1) // 2 + 1 < self.bins:
                raise ValueError(
                    f"trc_c={self.bins} is larger than the spectrum of a length-"
                    f"{hidden.size(1)} sequence ({hidden.size(1) // 2 + 1} rfft bins)"
                )
            bases = truncated_dft_bases(hidden.size(1), self.bins)
        # Kept in float64 so that the bases are exact in every working precision.
        analysis, synthesis = (basis.to(hidden) for basis in bases)
        spectrum = torch.einsum("cl,bld->bcd", analysis, hidden)
        real, imag = spectrum[:, : self.bins], spectrum[:, self.bins :]
        gain_real, gain_imag = self.spectral_filter.unbind(-1)
        filtered = torch.cat(
            [real * gain_real - imag * gain_imag, real * gain_imag + imag * gain_real], dim=1
        )
        return torch.einsum("lc,bcd->bld", synthesis, filtered)

    def forward(self, sublayer_output: torch.Tensor, sublayer_input: torch.Tensor) -> torch.Tensor:
        skip = self.truncated_skip(sublayer_input)
        if self.reading == "bsarec_mix":
            sublayer = self.layer_norm(sublayer_input + self.dropout(sublayer_output))
            truncated = self.skip_layer_norm(sublayer_input + self.skip_dropout(skip))
            return self.alpha * sublayer + (1.0 - self.alpha) * truncated
        sublayer = self.dropout(sublayer_output)
        if self.reading == "identity_and_truncated":
            sublayer = sublayer_input + sublayer
        return self.layer_norm(self.alpha * sublayer + (1.0 - self.alpha) * skip)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, bins={self.bins}, reading={self.reading}"


def truncated_dft_bases(seq_len: int, bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Real matrices of the lowest ``bins`` bins of the orthonormal real DFT (float64).

    ``analysis`` (2 bins x L): its rows give the real, then the imaginary parts of
    ``rfft(x, norm="ortho")[:bins]``.  ``synthesis`` (L x 2 bins): ``irfft(.., n=L,
    norm="ortho")`` of a spectrum that is zero above ``bins``; bins other than 0 and
    L / 2 count twice (they stand for their mirror frequencies too), and the imaginary
    parts of those two are ignored (their sine rows vanish), as in ``irfft``.
    """
    positions = torch.arange(seq_len, dtype=torch.float64)
    frequencies = torch.arange(bins, dtype=torch.float64)
    angle = 2 * torch.pi * torch.outer(frequencies, positions) / seq_len
    real, imag = torch.cos(angle) / seq_len**0.5, -torch.sin(angle) / seq_len**0.5
    weight = torch.full((bins, 1), 2.0, dtype=torch.float64)
    weight[0] = 1.0
    if seq_len % 2 == 0 and bins == seq_len // 2 + 1:
        weight[-1] = 1.0  # the Nyquist bin has no mirror
    analysis = torch.cat([real, imag])
    synthesis = torch.cat([real * weight, imag * weight]).t()
    return analysis, synthesis.contiguous()


def _truncated_residual_options(alpha, bins, max_seq_length):
    alpha = as_number(alpha)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(
            f"trc_alpha={alpha} must lie in [0, 1] (PolyRec eq. 13: weight of the sub-layer "
            "against the truncated skip; the paper finds 0.5-0.7 best)"
        )
    n_bins = max_seq_length // 2 + 1
    hint = (
        f"MAX_ITEM_LIST_LENGTH={max_seq_length} has {n_bins} rfft bins; "
        f"choose 1 <= trc_c <= {n_bins}"
    )
    bins = integer_option(bins, "trc_c", 1, hint)
    if bins > n_bins:
        raise ValueError(f"trc_c={bins} is larger than the spectrum: {hint}")
    return alpha, bins


def _skip_reading(value) -> str:
    if value not in TRUNCATED_SKIP_READINGS:
        raise ValueError(
            f"trc_skip={value!r} is unknown; choose from {list(TRUNCATED_SKIP_READINGS)} "
            "(readings of PolyRec eq. 13, docs/models.md)"
        )
    return value


TRUNCATABLE_SUBLAYERS = ("attention", "filter", "feed_forward")


def _sublayer_names(value) -> tuple[str, ...]:
    # Accepts a list (yaml) or a string such as "attention,feed_forward" (command line).
    if isinstance(value, str):
        value = [part.strip(" '\"") for part in value.strip("[]()").split(",")]
    names = tuple(name for name in value if name)
    unknown = [name for name in names if name not in TRUNCATABLE_SUBLAYERS]
    if unknown:
        raise ValueError(
            f"trc_sublayers={list(names)} names unknown sub-layers {unknown}; "
            f"choose from {list(TRUNCATABLE_SUBLAYERS)}"
        )
    return names


def fourier_truncated_residual(
    ctx, trc_alpha=0.5, trc_c=3, trc_sublayers=("attention",), trc_skip="identity_and_truncated"
):
    """The truncated residual, in the reading ``trc_skip``, on the sub-layers named in
    ``trc_sublayers`` (default the attention sub-layer, whose token mixing is what eq. 13
    filters), the standard residual on the others."""
    alpha, bins = _truncated_residual_options(trc_alpha, trc_c, ctx.max_seq_length)
    reading = _skip_reading(trc_skip)
    if ctx.sublayer not in _sublayer_names(trc_sublayers):
        return StandardResidual(ctx.hidden_size, ctx.hidden_dropout_prob, ctx.layer_norm_eps)
    return TruncatedResidual(
        ctx.hidden_size,
        ctx.max_seq_length,
        ctx.hidden_dropout_prob,
        ctx.layer_norm_eps,
        alpha,
        bins,
        reading,
    )
