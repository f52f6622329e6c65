"""The one Transformer encoder core that every recbole-freq model is built from.

A block is ``token mixer -> feed-forward``.  The token mixer is either plain multi-head
self-attention or BSARec's beyond-self-attention mix (BSARec eq. 5); inside
self-attention the *attention operator* turns queries, keys and values into ``A V``
(softmax attention, BSARec eq. 1); every sub-layer ends in a *residual path*
(dropout + residual + LayerNorm, BSARec eq. 9).  Each paper contributes one of these
pieces and the encoder picks them by configuration, so papers' ideas combine freely and
no model file carries its own attention, LayerNorm or feed-forward code.

Tensors are ``(batch, seq_len, hidden)`` unless stated; attention masks are boolean
``(batch, 1, seq_len, seq_len)`` with ``True`` where a query may attend to a key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {
    "gelu": F.gelu,
    "relu": F.relu,
    "swish": F.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
}

BSA_BRANCHES = ("bsa", "sa", "ib")


def build_attention_mask(item_seq: torch.Tensor, bidirectional: bool = False) -> torch.Tensor:
    """Boolean mask that hides padding keys (item id 0) and, unless bidirectional, the future.

    Same set of allowed (query, key) pairs as RecBole's ``get_attention_mask``, which
    encodes it as an additive ``0 / -10000`` mask.
    """
    keys_real = (item_seq != 0)[:, None, None, :]
    if bidirectional:
        return keys_real
    seq_len = item_seq.size(-1)
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=item_seq.device).tril()
    return keys_real & causal


class SequenceEmbedding(nn.Module):
    """Embedding layer, BSARec eq. 4: ``E = Dropout(LayerNorm(M[s] + P))``."""

    def __init__(self, n_items, max_seq_length, hidden_size, dropout_prob, layer_norm_eps):
        super().__init__()
        self.item_embedding = nn.Embedding(n_items, hidden_size, padding_idx=0)
        self.position_embedding = nn.Embedding(max_seq_length, hidden_size)
        self.layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = Dropout(dropout_prob)

    def forward(self, item_seq: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(item_seq.size(1), device=item_seq.device)
        embedded = self.item_embedding(item_seq) + self.position_embedding(positions)
        return self.dropout(self.layer_norm(embedded))


class StandardResidual(nn.Module):
    """Residual path ``LayerNorm(x + Dropout(f(x)))`` that closes every sub-layer (eq. 9)."""

    def __init__(self, hidden_size, dropout_prob, layer_norm_eps):
        super().__init__()
        self.dropout = Dropout(dropout_prob)
        self.layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)

    def forward(self, sublayer_output: torch.Tensor, sublayer_input: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(sublayer_input + self.dropout(sublayer_output))


class Dropout(nn.Module):
    """Inverted dropout with the same Bernoulli(1 - p) masks as ``nn.Dropout``.

    On the CPU the mask is drawn as ``rand >= p``: PyTorch's CPU ``bernoulli_`` is about
    3.5x slower and took 40% of a training step.  Other devices use ``F.dropout``.
    """

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability {p} must lie in [0, 1)")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        keep = torch.rand_like(x) >= self.p
        return x * keep.to(x.dtype).mul_(1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}"


def attention_probabilities(query, key, mask) -> torch.Tensor:
    """``A = softmax(Q K^T / sqrt(d))`` restricted to the allowed keys, BSARec eq. 1."""
    scores = torch.matmul(query, key.transpose(-1, -2)) * query.size(-1) ** -0.5
    return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)


class SoftmaxAttention(nn.Module):
    """Attention operator ``softmax(Q K^T / sqrt(d)) V`` (BSARec eq. 1, per head).

    Dropout acts on the attention probabilities as in RecBole's and the authors'
    implementations.  Inference and non-CPU training use PyTorch's fused
    ``scaled_dot_product_attention``; CPU training with dropout computes ``A`` explicitly
    because the fused kernel's CPU fallback draws its dropout mask with the slow
    ``bernoulli_``.  Both give the same function (tests compare them with an unfused
    oracle).
    """

    def __init__(self, dropout_prob: float):
        super().__init__()
        self.dropout = Dropout(dropout_prob)

    def forward(self, query, key, value, mask):
        if self.training and self.dropout.p > 0 and query.device.type == "cpu":
            return torch.matmul(self.dropout(attention_probabilities(query, key, mask)), value)
        return F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=mask,
            dropout_p=self.dropout.p if self.training else 0.0,
        )


@dataclass(frozen=True)
class LayerContext:
    """What a component factory may need to know about the layer it is built for."""

    hidden_size: int
    n_heads: int
    max_seq_length: int
    hidden_dropout_prob: float
    attn_dropout_prob: float
    layer_norm_eps: float
    layer_index: int
    sublayer: str = ""  # for residual paths: "attention", "filter" or "feed_forward"


@dataclass(frozen=True)
class Component:
    """A configurable encoder piece: ``factory(context, **options)``, where the options are
    the values of ``config_keys`` passed as keyword arguments of the same names (keys
    absent from the config fall back to the factory's defaults)."""

    factory: Callable[..., nn.Module]
    config_keys: tuple[str, ...] = ()


# Attention operators: (query, key, value, mask) -> A V, per head.
ATTENTION_OPERATORS: dict[str, Component] = {
    "softmax": Component(lambda ctx: SoftmaxAttention(ctx.attn_dropout_prob)),
}


class MultiHeadSelfAttention(nn.Module):
    """Multi-head self-attention with output projection ``W^O`` (BSARec eq. 6).

    Returns the sub-layer output after its residual path, ``A X`` in BSARec's notation.
    """

    def __init__(self, hidden_size, n_heads, operator: nn.Module, residual: nn.Module):
        super().__init__()
        if hidden_size % n_heads:
            raise ValueError(
                f"hidden_size={hidden_size} is not divisible by n_heads={n_heads}; "
                "choose n_heads among the divisors of hidden_size"
            )
        self.n_heads = n_heads
        self.head_size = hidden_size // n_heads
        # One projection for Q, K and V: a single GEMM instead of three.
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.operator = operator
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.residual = residual

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, seq_len, _ = hidden.shape
        qkv = self.qkv(hidden).view(batch, seq_len, 3, self.n_heads, self.head_size)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        context = self.operator(query, key, value, mask)
        context = context.transpose(1, 2).reshape(batch, seq_len, -1)
        return self.residual(self.dense(context), hidden)


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


class SelfAttentionMixer(nn.Module):
    """Token mixer of SASRec-style blocks: offers the branch ``sa`` = ``A X``."""

    branches = ("sa",)
    default_branches = ("sa",)

    def __init__(self, attention: MultiHeadSelfAttention):
        super().__init__()
        self.attention = attention

    def forward(self, hidden, mask, wanted: Sequence[str]):
        return {"sa": self.attention(hidden, mask)}


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

    def forward(self, hidden, mask, wanted: Sequence[str]):
        need_sa = "sa" in wanted or ("bsa" in wanted and self.alpha < 1.0)
        need_ib = "ib" in wanted or ("bsa" in wanted and self.alpha > 0.0)
        features = {}
        if need_ib:
            features["ib"] = self.residual(self.rescaler(hidden), hidden)
        if need_sa:
            features["sa"] = self.attention(hidden, mask)
        if "bsa" in wanted:
            if self.alpha == 0.0:
                features["bsa"] = features["sa"]
            elif self.alpha == 1.0:
                features["bsa"] = features["ib"]
            else:
                features["bsa"] = self.alpha * features["ib"] + (1 - self.alpha) * features["sa"]
        return features


class FeedForward(nn.Module):
    """Point-wise feed-forward network with its residual path, BSARec eq. 8-9."""

    def __init__(self, hidden_size, inner_size, hidden_act, residual: nn.Module):
        super().__init__()
        if hidden_act not in ACTIVATIONS:
            raise ValueError(
                f"hidden_act={hidden_act!r} is unknown; choose from {sorted(ACTIVATIONS)}"
            )
        self.dense_in = nn.Linear(hidden_size, inner_size)
        self.activation = ACTIVATIONS[hidden_act]
        self.dense_out = nn.Linear(inner_size, hidden_size)
        self.residual = residual

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.residual(self.dense_out(self.activation(self.dense_in(hidden))), hidden)


class TransformerBlock(nn.Module):
    """``X^{l+1} = sum_b w_b FFN(branch_b(X^l))`` over the mixer's selected branches.

    With one branch of weight 1 this is the usual ``FFN(mixer(X))``; several branches
    give FBSARec's cross fusion (thesis section 3.4), the feed-forward network being
    shared by the branches.  Fusion weights are fixed or learnable.
    """

    def __init__(self, mixer, feed_forward, branches=None, weights=None, learn_weights=False):
        super().__init__()
        # An empty list is a user's choice to refuse, not to replace by the default.
        branches = tuple(mixer.default_branches if branches is None else branches)
        unknown = [name for name in branches if name not in mixer.branches]
        if not branches or unknown or len(set(branches)) != len(branches):
            raise ValueError(
                f"fusion_branches={list(branches)} is invalid for this model: use distinct "
                f"names from {list(mixer.branches)}"
            )
        if weights is None:
            weights = [1.0 / len(branches)] * len(branches)
        if len(weights) != len(branches):
            raise ValueError(
                f"fusion_weights={list(weights)} needs one weight per branch of "
                f"fusion_branches={list(branches)}"
            )
        if not all(
            isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w)
            for w in weights
        ) or not any(weights):
            raise ValueError(
                f"fusion_weights={list(weights)} must be finite numbers, not all 0 (all 0 "
                "would give every item the same score)"
            )
        self.mixer = mixer
        self.feed_forward = feed_forward
        self.branches = branches
        weights = torch.tensor([float(w) for w in weights])
        if learn_weights:
            self.fusion_weights = nn.Parameter(weights)
        else:
            self.register_buffer("fusion_weights", weights)
        self._plain = len(branches) == 1 and not learn_weights and float(weights[0]) == 1.0

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        features = self.mixer(hidden, mask, self.branches)
        if self._plain:
            return self.feed_forward(features[self.branches[0]])
        fused = 0
        for weight, name in zip(self.fusion_weights, self.branches):
            fused = fused + weight * self.feed_forward(features[name])
        return fused


class TransformerEncoder(nn.Module):
    """A stack of ``TransformerBlock`` s; optionally returns every layer's output."""

    def __init__(self, blocks: Sequence[TransformerBlock]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, hidden, mask, output_all_layers: bool = False):
        outputs = []
        for block in self.blocks:
            hidden = block(hidden, mask)
            outputs.append(hidden)
        return outputs if output_all_layers else hidden


TOKEN_MIXERS = ("self_attention", "bsa")

# Residual paths: (sublayer_output, sublayer_input) -> next hidden states.
RESIDUAL_PATHS: dict[str, Component] = {
    "standard": Component(
        lambda ctx: StandardResidual(ctx.hidden_size, ctx.hidden_dropout_prob, ctx.layer_norm_eps)
    ),
}


def _lookup(registry: dict[str, Component], kind: str, name: str) -> Component:
    if name not in registry:
        raise ValueError(f"{kind}={name!r} is unknown; choose from {sorted(registry)}")
    return registry[name]


def build_encoder(
    *,
    n_layers: int,
    hidden_size: int,
    n_heads: int,
    inner_size: int,
    hidden_dropout_prob: float,
    attn_dropout_prob: float,
    hidden_act: str,
    layer_norm_eps: float,
    max_seq_length: int,
    token_mixer: str = "self_attention",
    attention_operator: str = "softmax",
    operator_options: dict | None = None,
    residual: str = "standard",
    residual_options: dict | None = None,
    alpha: float = 0.0,
    c: int = 1,
    beta_type: str = "vector",
    fusion_branches: Sequence[str] | None = None,
    fusion_weights: Sequence[float] | None = None,
    learn_fusion_weights: bool = False,
) -> TransformerEncoder:
    """Assemble the encoder from configuration (the names are RecBole's config keys)."""
    if n_layers < 1:
        raise ValueError(f"n_layers={n_layers} must be at least 1")
    if n_heads < 1:
        raise ValueError(f"n_heads={n_heads} must be at least 1")
    for name, prob in (
        ("hidden_dropout_prob", hidden_dropout_prob),
        ("attn_dropout_prob", attn_dropout_prob),
    ):
        if not 0.0 <= prob < 1.0:
            raise ValueError(f"{name}={prob} must lie in [0, 1)")
    if token_mixer not in TOKEN_MIXERS:
        raise ValueError(
            f"token_mixer={token_mixer!r} is unknown; choose from {list(TOKEN_MIXERS)}"
        )
    operator = _lookup(ATTENTION_OPERATORS, "attention_operator", attention_operator)
    residual_path = _lookup(RESIDUAL_PATHS, "residual", residual)

    blocks = []
    for layer_index in range(n_layers):
        context = LayerContext(
            hidden_size,
            n_heads,
            max_seq_length,
            hidden_dropout_prob,
            attn_dropout_prob,
            layer_norm_eps,
            layer_index,
        )

        def residual_for(sublayer: str, context=context) -> nn.Module:
            return residual_path.factory(
                replace(context, sublayer=sublayer), **(residual_options or {})
            )

        attention = MultiHeadSelfAttention(
            hidden_size,
            n_heads,
            operator.factory(context, **(operator_options or {})),
            residual_for("attention"),
        )
        if token_mixer == "bsa":
            rescaler = FrequencyRescaler(max_seq_length, c, hidden_size, beta_type)
            mixer = BeyondSelfAttentionMixer(attention, rescaler, residual_for("filter"), alpha)
        else:
            mixer = SelfAttentionMixer(attention)
        feed_forward = FeedForward(
            hidden_size, inner_size, hidden_act, residual_for("feed_forward")
        )
        blocks.append(
            TransformerBlock(
                mixer, feed_forward, fusion_branches, fusion_weights, learn_fusion_weights
            )
        )
    return TransformerEncoder(blocks)


def init_weights(module: nn.Module, initializer_range: float) -> None:
    """RecBole's and the authors' initialisation: N(0, initializer_range) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        module.weight.data.normal_(mean=0.0, std=initializer_range)
    elif isinstance(module, nn.LayerNorm):
        module.bias.data.zero_()
        module.weight.data.fill_(1.0)
    if isinstance(module, nn.Linear) and module.bias is not None:
        module.bias.data.zero_()


# --- PolyRec (Ji et al., "PolyRec: Polynomial Attention for Enhanced Sequential
# Recommendation"): Chebyshev polynomial attention (eq. 10-12) as an attention operator
# and the truncated residual connection (eq. 13) as a residual path.


def _integer_option(value, name: str, minimum: int, hint: str) -> int:
    """``value`` as an int >= minimum (RecBole may hand over 3.0 or "3"), else ValueError."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    finite = number == number and abs(number) != float("inf")
    if isinstance(value, bool) or not finite or number != int(number) or number < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}; {hint}")
    return int(number)


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
        self.order = _integer_option(
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


class TruncatedResidual(nn.Module):
    """Truncated residual connection, PolyRec eq. 13:
    ``x_{i+1} = alpha f(x_i) + (1 - alpha) IFFT(F_C(x_i) * K)``.

    ``F_C`` keeps the lowest ``bins`` (the paper's C) bins of the orthonormal real FFT
    along the sequence, ``K`` is a learnable complex filter on those bins (one value per
    bin and hidden dimension), and the inverse FFT returns to the sequence with every
    other bin zero.  Reading: eq. 13 is the residual ``x + f(x)`` with its identity skip
    ``x`` replaced by the truncated skip and the two branches weighted by ``alpha``;
    like every sub-layer of the core it is closed by dropout on ``f`` and LayerNorm:
    ``LayerNorm(alpha Dropout(f(x)) + (1 - alpha) IFFT(F_C(x) K))``.

    ``K`` starts at 1 + 0i, so the skip starts as the exact low-pass projection of ``x``
    (what the identity skip keeps after truncation) and learns per-bin gains and phases
    from there; the paper gives no initialisation.

    Like BSARec's filter the skip mixes all positions of the (right-padded) input, later
    ones included; RecBole trains on prefixes whose target is never in the input, so no
    target leaks into a prediction.
    """

    def __init__(self, hidden_size, max_seq_length, dropout_prob, layer_norm_eps, alpha, bins):
        super().__init__()
        alpha, bins = _truncated_residual_options(alpha, bins, max_seq_length)
        self.alpha = alpha
        self.bins = bins
        self.dropout = Dropout(dropout_prob)
        self.layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        gain = torch.zeros(bins, hidden_size, 2)
        gain[..., 0] = 1.0  # K = 1 + 0i (real and imaginary parts stored as a pair)
        self.spectral_filter = nn.Parameter(gain)
        analysis, synthesis = truncated_dft_bases(max_seq_length, bins)
        self.register_buffer("analysis", analysis, persistent=False)
        self.register_buffer("synthesis", synthesis, persistent=False)

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
        mixed = self.alpha * self.dropout(sublayer_output)
        return self.layer_norm(mixed + (1.0 - self.alpha) * self.truncated_skip(sublayer_input))

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, bins={self.bins}"


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
    try:
        alpha = float(alpha)
    except (TypeError, ValueError):
        alpha = float("nan")
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
    bins = _integer_option(bins, "trc_c", 1, hint)
    if bins > n_bins:
        raise ValueError(f"trc_c={bins} is larger than the spectrum: {hint}")
    return alpha, bins


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


def _fourier_truncated_residual(ctx, trc_alpha=0.5, trc_c=3, trc_sublayers=("attention",)):
    """The truncated residual on the sub-layers named in ``trc_sublayers`` (default the
    attention sub-layer, whose token mixing is what eq. 13 filters), the standard
    residual on the others."""
    alpha, bins = _truncated_residual_options(trc_alpha, trc_c, ctx.max_seq_length)
    if ctx.sublayer not in _sublayer_names(trc_sublayers):
        return StandardResidual(ctx.hidden_size, ctx.hidden_dropout_prob, ctx.layer_norm_eps)
    return TruncatedResidual(
        ctx.hidden_size,
        ctx.max_seq_length,
        ctx.hidden_dropout_prob,
        ctx.layer_norm_eps,
        alpha,
        bins,
    )


ATTENTION_OPERATORS["chebyshev"] = Component(
    lambda ctx, poly_order=3, poly_per_head=False: ChebyshevAttention(
        ctx.attn_dropout_prob, poly_order, ctx.n_heads, bool(poly_per_head)
    ),
    ("poly_order", "poly_per_head"),
)
RESIDUAL_PATHS["fourier_truncated"] = Component(
    _fourier_truncated_residual, ("trc_alpha", "trc_c", "trc_sublayers")
)


# --- Rec-Denoiser (Chen et al., "Denoising Self-Attentive Sequential Recommendation",
# RecSys 2022, section 4): trainable binary masks on the attention probabilities (eq. 5)
# as an attention operator, learned with the unbiased ARM / AR estimators (eq. 10-11)
# under the sparsity penalty (eq. 8); the Jacobian regulariser of the Transformer blocks
# (eq. 12); and ``DenoisingObjective``, which puts them together (eq. 13) around any
# model's forward pass.

MASK_ESTIMATORS = ("ARM", "AR")
MASK_SAMPLING = ("batch", "sequence")
SPARSITY_NORMALIZATIONS = ("train_examples", "batch", "none")
JACOBIAN_NORMALIZATIONS = ("position", "sequence")


def sparsity_penalty_scale(normalization, train_examples: int, batch_size: int) -> float:
    """Factor that puts eq. 8's ``beta * sum sigmoid(Phi)`` on the scale of a loss that is
    a *mean* over the mini-batch's training rows (RecBole's losses and ours).

    Eq. 13 adds ``beta R_M`` once to ``L_BCE``, a *sum* over every training sequence and
    position (eq. 4); ``R_M`` depends on no input, so divided per training row it is
    ``beta R_M / N``:

    - ``train_examples`` (default): ``1 / N``, N the training rows of one epoch (one per
      target for SASRec-style rows); eq. 13 divided by N, so beta keeps the paper's weight
      against the whole training loss;
    - ``batch``: ``1 / batch_size``, Algorithm 1 read literally (eq. 13 per mini-batch
      with the loss summed over the batch);
    - ``none``: 1, beta added as is to the batch-mean loss.  That is N times stronger than
      eq. 13 (about 49,000 on lastfm): at the paper's beta 0.01 every mask is pruned.
    """
    if normalization not in SPARSITY_NORMALIZATIONS:
        raise ValueError(
            f"sparsity_normalization={normalization!r} is unknown; choose 'train_examples' "
            "(eq. 13 per training row: beta / N), 'batch' (beta / train_batch_size) or "
            "'none' (beta added as is to the batch-mean loss)"
        )
    if normalization == "none":
        return 1.0
    count = train_examples if normalization == "train_examples" else batch_size
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(
            f"sparsity_normalization={normalization!r} needs a positive number of "
            f"{'training rows' if normalization == 'train_examples' else 'rows per batch'}, "
            f"got {count!r}"
        )
    return 1.0 / count


def _denoise_non_negative(value, name: str, hint: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if isinstance(value, bool) or not number >= 0.0 or number == float("inf"):
        raise ValueError(f"{name}={value!r} must be a finite number >= 0; {hint}")
    return number


def _denoise_estimator(value) -> str:
    name = str(value).upper() if isinstance(value, str) else value
    if name not in MASK_ESTIMATORS:
        raise ValueError(
            f"estimator={value!r} is unknown; choose 'ARM' (Rec-Denoiser eq. 10: two "
            "antithetic forward passes, low variance) or 'AR' (eq. 11: one pass)"
        )
    return name


def mask_alignment_index(mask: torch.Tensor) -> torch.Tensor:
    """``(batch, seq_len)``: the row (and column) of the ``n x n`` mask parameters that
    each position of each sequence uses.

    Rec-Denoiser's ``Phi`` is indexed as in the authors' left-padded layout, where row
    ``n - 1`` is always the most recent item (the query that predicts the next one) and
    column ``n - 1 - k`` the k-th item before it.  RecBole right-pads, so a sequence of
    ``len`` items is shifted by ``n - len``; padding positions (never attended to, never
    scored) reuse index ``n - 1``.  The lengths are read off the boolean attention mask:
    its last query row allows exactly the real keys.
    """
    seq_len = mask.size(-1)
    lengths = mask[:, 0, -1, :].sum(-1)
    positions = torch.arange(seq_len, device=mask.device)
    return (positions + (seq_len - lengths)[:, None]).clamp(max=seq_len - 1)


def align_masks(canonical: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Per-sequence view ``(batch, heads, n, n)`` of ``(heads, n, n)`` mask values laid out
    as in ``mask_alignment_index`` (a gather; its gradient scatters back)."""
    return canonical[:, index[:, :, None], index[:, None, :]].transpose(0, 1)


class DenoisingMaskAttention(nn.Module):
    """Attention with Rec-Denoiser's differentiable masks, eq. 5: ``M = A * Z``, ``M V``.

    ``A`` is the softmax attention (restricted to the causal / padding mask) and ``Z`` a
    binary mask with ``Z ~ Bernoulli(sigmoid(Phi))`` (eq. 8-9); ``Phi`` is one ``n x n``
    parameter per layer (``mask_per_head=False``, the paper) or per head, indexed as in
    ``mask_alignment_index``.  ``M`` is not renormalised (eq. 5); attention dropout acts
    on ``M``.

    - Training: ``Z`` is drawn from uniform noise ``U``: ``1[U < sigmoid(Phi)]``, or for
      the second antithetic pass of ARM ``1[U > sigmoid(-Phi)]`` (eq. 10); ``U`` is one
      ``n x n`` draw per mini-batch and layer (``mask_sampling=batch``, Algorithm 1) or
      one per sequence (``sequence``: still unbiased, lower variance).  ``Z`` is a hard
      threshold, so no gradient reaches ``Phi`` through the forward pass; ``Phi`` learns
      from ``estimator_surrogate`` (run by ``DenoisingObjective``) and from the sparsity
      penalty ``regularization_loss() = sparsity_scale * sparsity_beta * sum
      sigmoid(Phi)`` (eq. 8; ``sparsity_scale`` from ``sparsity_penalty_scale``, set by
      the model, 1 for an operator on its own).
    - Inference (``eval()``): the deterministic mask ``sigmoid(Phi)`` where it exceeds 0.5
      and 0 elsewhere (section 4.1.2), see ``inference_mask``.

    ``sigmoid(Phi)`` starts at ``mask_init_prob`` (the paper gives no value; 0.9 starts
    close to the backbone).  Outside ``DenoisingObjective`` a training forward pass draws
    fresh masks from the global RNG, but the base model's loss cannot train ``Phi``: the
    estimators need the loss of each pass, so ``regularization_loss`` refuses that use.
    """

    def __init__(
        self,
        max_seq_length: int,
        n_heads: int,
        dropout_prob: float,
        estimator: str = "ARM",
        sparsity_beta: float = 0.0,
        mask_per_head: bool = False,
        mask_sampling: str = "batch",
        mask_init_prob: float = 0.9,
    ):
        super().__init__()
        self.estimator = _denoise_estimator(estimator)
        self.sparsity_beta = _denoise_non_negative(
            sparsity_beta, "sparsity_beta", "it is beta of Rec-Denoiser eq. 8, e.g. 0.01"
        )
        if mask_per_head not in (True, False):
            raise ValueError(f"mask_per_head={mask_per_head!r} must be True or False")
        if mask_sampling not in MASK_SAMPLING:
            raise ValueError(
                f"mask_sampling={mask_sampling!r} is unknown; choose 'batch' (one mask per "
                "mini-batch and layer, Algorithm 1) or 'sequence' (one per sequence)"
            )
        try:
            init = float(mask_init_prob)
        except (TypeError, ValueError):
            init = float("nan")
        if not 0.0 < init < 1.0:
            raise ValueError(
                f"mask_init_prob={mask_init_prob!r} must lie in (0, 1): the initial keep "
                "probability sigmoid(Phi), e.g. 0.9"
            )
        self.mask_sampling = mask_sampling
        self.sparsity_scale = 1.0
        heads = n_heads if mask_per_head else 1
        logit = torch.logit(torch.tensor(init, dtype=torch.float64)).item()
        self.phi = nn.Parameter(torch.full((heads, max_seq_length, max_seq_length), logit))
        self.dropout = Dropout(dropout_prob)
        self._generator: torch.Generator | None = None
        self._branch = "first"
        self._driven = False
        self._draw = None  # (U aligned per sequence, relevant entries, alignment index)

    def keep_probability(self) -> torch.Tensor:
        """``sigmoid(Phi)``, ``(heads, n, n)``: the probability of keeping each link."""
        return torch.sigmoid(self.phi)

    def inference_mask(self) -> torch.Tensor:
        """Deterministic mask of section 4.1.2: ``sigmoid(Phi)`` where ``> 0.5``, else 0."""
        keep = torch.sigmoid(self.phi)
        return keep * (keep > 0.5)

    def forward(self, query, key, value, mask):
        probs = attention_probabilities(query, key, mask)
        index = mask_alignment_index(mask)
        if self.training:
            keep = self._sample(mask, index)
        else:
            keep = align_masks(self.inference_mask(), index)
        return torch.matmul(self.dropout(probs * keep.to(probs.dtype)), value)

    def _sample(self, mask: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        if self._branch == "second":
            if self._draw is None:
                raise RuntimeError("the second ARM pass found no draw of the first pass")
            uniform = self._draw[0]
            with torch.no_grad():
                return uniform > align_masks(torch.sigmoid(-self.phi), index)
        if self._driven and self._draw is not None:
            raise RuntimeError(
                "the encoder ran twice in one DenoisingObjective pass; each pass must run "
                "it once so that every mask draw is paired with its loss"
            )
        batch, heads, seq_len = mask.size(0), self.phi.size(0), self.phi.size(-1)
        device = self.phi.device
        if self.mask_sampling == "sequence":
            shape = (batch, heads, seq_len, seq_len)
            uniform = torch.rand(shape, generator=self._generator, device=device)
        else:
            shape = (heads, seq_len, seq_len)
            uniform = torch.rand(shape, generator=self._generator, device=device)
            uniform = align_masks(uniform, index)
        if self._driven:
            # Links whose Z cannot change the loss: keys the mask hides, padding queries.
            real = mask[:, 0, -1, :]
            relevant = mask.expand(batch, 1, seq_len, seq_len) & real[:, None, :, None]
            self._draw = (uniform, relevant, index)
        with torch.no_grad():
            return uniform < align_masks(torch.sigmoid(self.phi), index)

    # Hooks for DenoisingObjective.
    def begin_step(self, generator: torch.Generator | None) -> None:
        self._generator, self._branch, self._driven, self._draw = generator, "first", True, None

    def use_second_pass(self) -> None:
        self._branch = "second"

    def end_step(self) -> None:
        self._generator, self._branch, self._driven, self._draw = None, "first", False, None

    def estimator_surrogate(self, first: torch.Tensor, second: torch.Tensor | None = None):
        """Scalar whose gradient with respect to ``Phi`` is the ARM (eq. 10) or AR (eq. 11)
        estimate of the gradient of the expected loss, and which has no other gradient.

        ``first`` / ``second``: per-sequence loss terms (summing to the batch loss) of the
        pass with ``Z = 1[U < sigmoid(Phi)]`` / ``Z = 1[U > sigmoid(-Phi)]``.  Per sequence
        ``b`` the estimate is ``(second_b - first_b) (U_b - 1/2)`` (ARM) or
        ``first_b (1 - 2 U_b)`` (AR), summed over the batch.  Entries the loss cannot
        depend on (links hidden by the causal / padding mask, queries at padding) get
        exactly 0, their true gradient, instead of zero-mean noise.
        """
        if self._draw is None:
            return 0.0  # the operator did not run (e.g. BSARec with alpha = 1)
        uniform, relevant, index = self._draw
        if self.estimator == "ARM":
            if second is None:
                raise ValueError("the ARM estimator needs the losses of both passes")
            weight = (second - first).view(-1, 1, 1, 1) * (uniform - 0.5)
        else:
            weight = first.view(-1, 1, 1, 1) * (1.0 - 2.0 * uniform)
        weight = (weight * relevant).detach()
        return (align_masks(self.phi, index) * weight).sum()

    def regularization_loss(self):
        """Sparsity penalty of eq. 8, ``sparsity_scale * sparsity_beta * sum sigmoid(Phi)``."""
        if self.training and not self._driven:
            raise ValueError(
                "attention_operator='denoise' learns its masks with the ARM / AR estimator, "
                "which needs the loss of every forward pass, and this model's "
                "calculate_loss does not run it (PolyRec's contrastive loss mixes "
                "sequences of the batch); use cl_weight: 0 with denoising masks"
            )
        if self.sparsity_beta == 0.0:
            return 0.0
        return self.sparsity_scale * self.sparsity_beta * torch.sigmoid(self.phi).sum()

    def extra_repr(self) -> str:
        heads, seq_len = self.phi.size(0), self.phi.size(-1)
        return (
            f"estimator={self.estimator}, masks={heads}x{seq_len}x{seq_len}, "
            f"sparsity_beta={self.sparsity_beta}, sparsity_scale={self.sparsity_scale:.3g}, "
            f"mask_sampling={self.mask_sampling}"
        )


def jacobian_norm_estimate(
    block_input: torch.Tensor,
    block_output: torch.Tensor,
    positions: torch.Tensor | None = None,
    n_projections: int = 1,
) -> torch.Tensor:
    """Per sequence, an unbiased estimate of ``||J||_F^2`` with ``J = d output / d input``
    of one Transformer block (Rec-Denoiser eq. 12), by random projections (Hutchinson;
    Hoffman et al. 2019): ``||J||_F^2 = E ||eta^T J||^2`` for ``eta ~ N(0, I)``, each
    ``eta^T J`` being one vector-Jacobian product, averaged over ``n_projections``.

    ``positions`` ``(batch, seq_len)`` restricts the rows of ``J`` to real positions'
    outputs (padding outputs are never used); the columns are all inputs.  The graph is
    kept (``create_graph``), so the estimate can be differentiated (double backward).
    Sequences are independent, so one product serves the whole batch.
    """
    if not block_input.requires_grad:
        raise ValueError("the Jacobian regulariser needs block inputs that require grad")
    weight = None if positions is None else positions[..., None].to(block_output.dtype)
    total = block_output.new_zeros(block_output.size(0))
    for _ in range(n_projections):
        eta = torch.randn_like(block_output)
        if weight is not None:
            eta = eta * weight
        (product,) = torch.autograd.grad(
            block_output, block_input, eta, create_graph=True, retain_graph=True
        )
        total = total + product.square().flatten(1).sum(-1)
    return total / n_projections


@dataclass
class DenoisingPass:
    """What one forward pass hands to ``DenoisingObjective``.

    ``contributions``: per-sequence loss terms ``(batch,)`` whose sum is the data loss
    (``loss_b / batch`` for a batch mean); ``block_inputs`` / ``block_outputs``: every
    Transformer block's input and output (only needed with the Jacobian regulariser);
    ``positions``: ``(batch, seq_len)``, True at real items.
    """

    contributions: torch.Tensor
    block_inputs: Sequence[torch.Tensor] = ()
    block_outputs: Sequence[torch.Tensor] = ()
    positions: torch.Tensor | None = None


class DenoisingObjective:
    """Rec-Denoiser's training loss, eq. 13: ``L + beta R_M + gamma R_J``, around any
    model's forward pass ``run_pass() -> DenoisingPass``.

    In training mode, with ``denoise`` operators in the encoder:

    1. one seed per step feeds a private generator from which every operator draws its
       uniform noise ``U`` (so the global RNG, hence dropout, is not disturbed);
    2. pass 1 with ``Z = 1[U < sigmoid(Phi)]``, with autograd: its loss ``L(Z)`` gives
       **all backbone parameters** (embeddings, projections, feed-forward, LayerNorms,
       output layers) their ordinary gradient, an unbiased estimate of the gradient of
       the expected loss since ``Z ~ Bernoulli(sigmoid(Phi))``;
    3. ARM only: pass 2 with the antithetic ``Z' = 1[U > sigmoid(-Phi)]`` under
       ``torch.no_grad()``, replaying pass 1's dropout draws (common random numbers): it
       contributes only its loss value, to the ``Phi`` estimate;
    4. ``Phi`` gets the ARM / AR estimate (``estimator_surrogate``, whose value is
       removed from the loss) plus the gradient of the scaled ``beta * sum sigmoid(Phi)``
       (``sparsity_penalty_scale``); nothing else reaches ``Phi`` (the masks are hard
       thresholds);
    5. ``gamma * R_J`` (``jacobian_gamma > 0``) on pass 1's blocks, mean over the batch,
       gives the backbone parameters a second gradient (double backward); ``Phi`` gets
       none from it (``Z`` is fixed within the pass);
    6. every other component's ``regularization_loss()`` is added, as in the base model.

    The returned value is ``L(Z) + beta R_M + gamma R_J (+ other regularisers)`` of pass 1.
    In evaluation mode, or without ``denoise`` operators (e.g. the Jacobian regulariser
    alone on softmax attention), it is one pass with the same terms.
    """

    def __init__(
        self,
        jacobian_gamma: float = 0.0,
        jacobian_projections: int = 1,
        jacobian_normalization: str = "position",
    ):
        self.jacobian_gamma = _denoise_non_negative(
            jacobian_gamma, "jacobian_gamma", "it is gamma of Rec-Denoiser eq. 13, e.g. 0.001"
        )
        if jacobian_normalization not in JACOBIAN_NORMALIZATIONS:
            raise ValueError(
                f"jacobian_normalization={jacobian_normalization!r} is unknown; choose "
                "'position' (mean over a sequence's real positions of ||J_i||_F^2) or "
                "'sequence' (their sum, the whole block Jacobian)"
            )
        self.jacobian_normalization = jacobian_normalization
        projections = jacobian_projections
        if isinstance(projections, bool) or not isinstance(projections, int) or projections < 1:
            raise ValueError(
                f"jacobian_projections={jacobian_projections!r} must be an integer >= 1: "
                "the number of random projections per block and step, e.g. 1"
            )
        self.jacobian_projections = projections

    def __call__(self, encoder: nn.Module, run_pass: Callable[[], DenoisingPass]):
        operators = [m for m in encoder.modules() if isinstance(m, DenoisingMaskAttention)]
        if not (encoder.training and operators):
            result = run_pass()
            return result.contributions.sum() + self._regularisers(encoder, result)
        estimators = {operator.estimator for operator in operators}
        if len(estimators) > 1:
            raise ValueError(f"all denoise operators must share one estimator, got {estimators}")
        device = operators[0].phi.device
        generator = torch.Generator(device=device)
        generator.manual_seed(int(torch.randint(0, 2**62, ()).item()))
        try:
            for operator in operators:
                operator.begin_step(generator)
            if estimators == {"ARM"}:
                cuda = [] if device.type != "cuda" else [torch.device(device).index or 0]
                with torch.random.fork_rng(devices=cuda):
                    first = run_pass()
                for operator in operators:
                    operator.use_second_pass()
                with torch.no_grad():
                    second = run_pass().contributions
            else:
                first, second = run_pass(), None
            contributions = first.contributions.detach()
            surrogate = sum(
                operator.estimator_surrogate(contributions, second) for operator in operators
            )
            loss = first.contributions.sum()
            if torch.is_tensor(surrogate):
                loss = loss + (surrogate - surrogate.detach())
            return loss + self._regularisers(encoder, first)
        finally:
            for operator in operators:
                operator.end_step()

    def _regularisers(self, encoder: nn.Module, result: DenoisingPass):
        total = 0.0
        if self.jacobian_gamma > 0 and encoder.training and torch.is_grad_enabled():
            total = self.jacobian_gamma * self.jacobian_penalty(result)
        terms = [
            module.regularization_loss()
            for module in encoder.modules()
            if hasattr(module, "regularization_loss")
        ]
        return total + sum(terms)

    def jacobian_penalty(self, result: DenoisingPass) -> torch.Tensor:
        """``R_J = sum_l ||J^(l)||_F^2`` (eq. 12) per sequence, averaged over the batch.

        ``J^(l)`` stacks the rows ``J_i = d f_i / d x`` of the block's real output
        positions ``i`` (section 4.2), so its squared norm grows with the sequence's
        length: 3,300 summed over both blocks for an initialised lastfm model (n = 50, d =
        64), 40% of the CE loss at gamma 0.001, enough to stall training (measured).
        ``jacobian_normalization: position`` (default) uses the mean of ``||J_i||_F^2``
        over the real positions instead (the per-output bound of section 4.2, about 95
        there), so gamma means the same for every length; ``sequence`` keeps the sum.
        """
        if not result.block_inputs:
            raise ValueError("jacobian_gamma > 0 needs the blocks' inputs and outputs")
        penalty = 0.0
        for block_input, block_output in zip(result.block_inputs, result.block_outputs):
            estimate = jacobian_norm_estimate(
                block_input, block_output, result.positions, self.jacobian_projections
            )
            if self.jacobian_normalization == "position":
                if result.positions is None:
                    real = block_output.size(1)
                else:
                    real = result.positions.sum(-1).clamp(min=1).to(estimate.dtype)
                estimate = estimate / real
            penalty = penalty + estimate.mean()
        return penalty


ATTENTION_OPERATORS["denoise"] = Component(
    lambda ctx, **options: DenoisingMaskAttention(
        ctx.max_seq_length, ctx.n_heads, ctx.attn_dropout_prob, **options
    ),
    ("estimator", "sparsity_beta", "mask_per_head", "mask_sampling", "mask_init_prob"),
)
