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


class FrequencyRescaler(nn.Module):
    """Attentive inductive bias with frequency rescaler, BSARec eq. 7.

    ``A_IB X = LFC[X] + beta * HFC[X]`` along the sequence axis.  Following the
    authors' code, the paper's ``c`` keeps ``c // 2 + 1`` rfft bins (the frequency-0 bin
    and ``c // 2`` more), ``HFC = X - LFC``, and ``beta = sqrt_beta ** 2`` stays
    non-negative; ``sqrt_beta`` starts from a standard normal draw.  ``beta_type``
    ``vector`` learns one beta per hidden dimension, ``scalar`` one per layer.
    """

    def __init__(self, seq_len: int, c: int, hidden_size: int, beta_type: str = "vector"):
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
        self.c = c
        self.low_bins = low_bins
        width = hidden_size if beta_type == "vector" else 1
        self.sqrt_beta = nn.Parameter(torch.randn(1, 1, width))
        self.register_buffer("low_pass", low_pass_projector(seq_len, low_bins), persistent=False)

    @property
    def beta(self) -> torch.Tensor:
        return self.sqrt_beta.square().flatten()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        low = torch.matmul(self.low_pass, hidden)
        return low + self.sqrt_beta.square() * (hidden - low)


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
        branches = tuple(branches or mixer.default_branches)
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
