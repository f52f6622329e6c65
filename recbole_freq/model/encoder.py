"""``build_encoder``: the one Transformer encoder core, assembled from configuration.

Each paper contributes a piece and the registries below name them, so every combination
is one config line away and no model file carries attention, LayerNorm or feed-forward
code of its own:

- ``TOKEN_MIXERS``: ``self_attention`` (SASRec-style blocks), ``bsa`` (BSARec eq. 5),
  ``filter`` (FMLP-Rec's learnable filter), ``slide_filter`` (SLIME4Rec's band filters;
  ``mixer_options``: ``filter_mixer``, ``dynamic_ratio``, ``slide_mode``),
  ``wavelet_fourier`` (WEARec's adaptive Fourier filter beside a Haar wavelet branch;
  ``mixer_options``: ``adaptive``), and ``adaptive_global_filter`` and ``band_mixture``
  (MUFFIN's global filter and band mixture, scaled by per-sequence gains that come with
  every forward pass as ``relations``; ``mixer_options``: ``num_bands``,
  ``freq_dropout_prob``), and ``graph_filter`` (TV-Rec's time-variant graph filter, the
  rows' padding with every forward pass as ``relations``; ``mixer_options``: ``order``,
  ``basis_size``, ``orthogonality_weight``);
- ``ATTENTION_OPERATORS`` (``attention_operator``): queries, keys and values -> ``A V``
  per head: ``softmax`` (BSARec eq. 1), ``chebyshev`` (PolyRec eq. 10-12), ``denoise``
  (Rec-Denoiser eq. 5), ``frequency_enhanced`` (FEARec's hybrid attention);
- ``RESIDUAL_PATHS`` (``residual``): what closes every sub-layer: ``standard`` (BSARec
  eq. 9) or ``fourier_truncated`` (PolyRec eq. 13);
- ``BLOCK_NORMS`` (``block_norm``): where the LayerNorms sit: ``post`` (after each
  residual, BSARec eq. 9, RecBole's SASRec) or ``sasrec_pre`` (SASRec's own code: each
  sub-layer reads ``LayerNorm(x)``, the residual adds to it, one LayerNorm closes the
  encoder; ``layers.PreNormResidual``);
- ``key_value_relations``: attention takes ``layers.KeyValueRelations`` with every
  forward pass (TiSASRec's time intervals, ``time_intervals`` in the model's config);
  the operators that can use them say so with their component's ``accepts_relations``.

A component's ``config_keys`` are the config keys its factory reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from torch import nn

from recbole_freq.model.band_mixture import (
    AdaptiveGlobalFilter,
    AdaptiveGlobalMixer,
    BandMixtureMixer,
)
from recbole_freq.model.denoising import DenoisingMaskAttention
from recbole_freq.model.frequency import (
    BeyondSelfAttentionMixer,
    FilterMixer,
    FrequencyEnhancedAttention,
    FrequencyRescaler,
    LearnableFilter,
    SlideFilter,
    slime4rec_bands,
)
from recbole_freq.model.graph_filter import GraphFilterMixer, TimeVariantGraphFilter
from recbole_freq.model.layers import (
    FeedForward,
    MultiHeadSelfAttention,
    PreNormResidual,
    SelfAttentionMixer,
    SoftmaxAttention,
    StandardResidual,
    TransformerBlock,
    TransformerEncoder,
)
from recbole_freq.model.polynomial import ChebyshevAttention, fourier_truncated_residual
from recbole_freq.model.wavelet import AdaptiveWaveletFilter


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
    n_layers: int = 1
    sublayer: str = ""  # for residual paths: "attention", "filter" or "feed_forward"


@dataclass(frozen=True)
class Component:
    """A configurable encoder piece: ``factory(context, **options)``, where the options are
    the values of ``config_keys`` passed as keyword arguments of the same names (keys
    absent from the config fall back to the factory's defaults)."""

    factory: Callable[..., nn.Module]
    config_keys: tuple[str, ...] = ()
    accepts_relations: bool = False  # attention operators taking ``KeyValueRelations``


# Attention operators: (query, key, value, mask) -> A V, per head.
ATTENTION_OPERATORS: dict[str, Component] = {
    "softmax": Component(lambda ctx: SoftmaxAttention(ctx.attn_dropout_prob), (), True),
    "chebyshev": Component(
        lambda ctx, poly_order=3, poly_per_head=False: ChebyshevAttention(
            ctx.attn_dropout_prob, poly_order, ctx.n_heads, bool(poly_per_head)
        ),
        ("poly_order", "poly_per_head"),
    ),
    "denoise": Component(
        lambda ctx, **options: DenoisingMaskAttention(
            ctx.max_seq_length, ctx.n_heads, ctx.attn_dropout_prob, **options
        ),
        (
            "estimator",
            "sparsity_beta",
            "mask_per_head",
            "mask_sampling",
            "mask_init_prob",
            "mask_learning",
        ),
        accepts_relations=True,
    ),
    "frequency_enhanced": Component(
        lambda ctx, **options: FrequencyEnhancedAttention(
            ctx.max_seq_length, ctx.layer_index, ctx.n_layers, ctx.attn_dropout_prob, **options
        ),
        ("topk_factor", "global_ratio", "dual_domain", "spatial_ratio", "std"),
    ),
}

# Residual paths: (sublayer_output, sublayer_input) -> next hidden states.
RESIDUAL_PATHS: dict[str, Component] = {
    "standard": Component(
        lambda ctx: StandardResidual(ctx.hidden_size, ctx.hidden_dropout_prob, ctx.layer_norm_eps)
    ),
    "fourier_truncated": Component(
        fourier_truncated_residual, ("trc_alpha", "trc_c", "trc_sublayers", "trc_skip")
    ),
}

# Token mixers without attention, and the model each comes from: they take no attention
# operator and no key-value relations.
ATTENTION_FREE_MIXERS = {
    "filter": "FMLP-Rec",
    "slide_filter": "SLIME4Rec",
    "wavelet_fourier": "WEARec",
    "adaptive_global_filter": "MUFFIN",
    "band_mixture": "MUFFIN",
    "graph_filter": "TV-Rec",
}
TOKEN_MIXERS = ("self_attention", "bsa", *ATTENTION_FREE_MIXERS)
BLOCK_NORMS = ("post", "sasrec_pre")


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
    key_value_relations: bool = False,
    block_norm: str = "post",
    mixer_options: dict | None = None,
) -> TransformerEncoder:
    """Assemble the encoder from configuration (the names are RecBole's config keys)."""
    operator, residual_path = _checked_components(
        n_layers, n_heads, (hidden_dropout_prob, attn_dropout_prob), token_mixer,
        attention_operator, residual, key_value_relations,
    )  # fmt: skip
    _check_block_norm(block_norm, token_mixer, residual)
    if block_norm == "sasrec_pre":
        residual_path = Component(
            lambda ctx: PreNormResidual(
                ctx.hidden_size, ctx.hidden_dropout_prob, ctx.layer_norm_eps
            )
        )
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
            n_layers,
        )

        def residual_for(sublayer: str, context=context, dropout=None) -> nn.Module:
            if dropout is not None:  # a sub-layer whose paper drops out at another rate
                context = replace(context, hidden_dropout_prob=dropout)
            return residual_path.factory(
                replace(context, sublayer=sublayer), **(residual_options or {})
            )

        mixer = _token_mixer(
            token_mixer, context, operator, operator_options or {}, residual_for, alpha, c,
            beta_type, mixer_options or {},
        )  # fmt: skip
        feed_forward = FeedForward(
            hidden_size, inner_size, hidden_act, residual_for("feed_forward")
        )
        blocks.append(
            TransformerBlock(
                mixer, feed_forward, fusion_branches, fusion_weights, learn_fusion_weights
            )
        )
    final_norm = None
    if block_norm == "sasrec_pre":
        final_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
    return TransformerEncoder(blocks, final_norm)


def _check_block_norm(block_norm, token_mixer, residual) -> None:
    if block_norm not in BLOCK_NORMS:
        raise ValueError(f"block_norm={block_norm!r} is unknown; choose from {list(BLOCK_NORMS)}")
    if block_norm == "sasrec_pre" and (token_mixer != "self_attention" or residual != "standard"):
        raise ValueError(
            "block_norm='sasrec_pre' is SASRec's block: it needs self-attention and the "
            f"standard residual (this model has token_mixer={token_mixer!r}, "
            f"residual={residual!r}); use block_norm: post"
        )


def _checked_components(
    n_layers, n_heads, dropouts, token_mixer, attention_operator, residual, key_value_relations
):
    """``(attention operator, residual path)`` of the registries, after the settings that
    no encoder can be built with are refused, one line each."""
    hidden_dropout_prob, attn_dropout_prob = dropouts
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
    if key_value_relations and token_mixer in ATTENTION_FREE_MIXERS:
        raise ValueError(
            f"time_intervals=True needs attention, and token_mixer={token_mixer!r} "
            f"({ATTENTION_FREE_MIXERS[token_mixer]}) has none; use a self-attention model"
        )
    if key_value_relations and not operator.accepts_relations:
        accepting = sorted(name for name, c in ATTENTION_OPERATORS.items() if c.accepts_relations)
        raise ValueError(
            f"time_intervals=True is not available with attention_operator="
            f"{attention_operator!r}; use one of {accepting}"
        )
    return operator, residual_path


def _token_mixer(
    kind, context, operator, operator_options, residual_for, alpha, c, beta_type, mixer_options
):
    """The token mixer of one block: FMLP-Rec's learnable filter (``filter``), SLIME4Rec's
    band filters (``slide_filter``), MUFFIN's filters (``adaptive_global_filter``,
    ``band_mixture``), TV-Rec's time-variant graph filter (``graph_filter``), WEARec's
    adaptive wavelet filter (``wavelet_fourier``, ``n_heads`` heads, ``alpha`` the Fourier
    branch's weight), self-attention with ``operator`` (``self_attention``), or BSARec's
    attention beside the frequency rescaler (``bsa``, eq. 5)."""
    hidden_size, max_seq_length = context.hidden_size, context.max_seq_length
    if kind == "filter":
        return FilterMixer(LearnableFilter(max_seq_length, hidden_size), residual_for("filter"))
    if kind == "slide_filter":
        options = dict(mixer_options)
        bands = slime4rec_bands(
            context.layer_index, context.n_layers, max_seq_length,
            options.get("filter_mixer", "G"), float(options.get("dynamic_ratio", 0.8)),
            options.get("slide_mode", "four"),
        )  # fmt: skip
        # the authors' filter layer drops out at attn_dropout_prob
        residual = residual_for("filter", dropout=context.attn_dropout_prob)
        return FilterMixer(SlideFilter(max_seq_length, hidden_size, bands), residual)
    if kind in ("adaptive_global_filter", "band_mixture"):
        residual = residual_for("filter", dropout=float(mixer_options["freq_dropout_prob"]))
        if kind == "band_mixture":
            bands = int(mixer_options["num_bands"])
            return BandMixtureMixer(max_seq_length, hidden_size, bands, residual)
        return AdaptiveGlobalMixer(AdaptiveGlobalFilter(max_seq_length, hidden_size), residual)
    if kind == "graph_filter":
        graph_filter = TimeVariantGraphFilter(
            max_seq_length, int(mixer_options.get("order", 50)),
            int(mixer_options.get("basis_size", 8)),
            float(mixer_options.get("orthogonality_weight", 0.0)),
        )  # fmt: skip
        return GraphFilterMixer(graph_filter, residual_for("filter"))
    if kind == "wavelet_fourier":
        wavelet = AdaptiveWaveletFilter(
            max_seq_length, hidden_size, context.n_heads, alpha,
            bool(mixer_options.get("adaptive", True)),
        )  # fmt: skip
        return FilterMixer(wavelet, residual_for("filter"))
    attention = MultiHeadSelfAttention(
        hidden_size,
        context.n_heads,
        operator.factory(context, **operator_options),
        residual_for("attention"),
    )
    if kind == "bsa":
        rescaler = FrequencyRescaler(max_seq_length, c, hidden_size, beta_type)
        return BeyondSelfAttentionMixer(attention, rescaler, residual_for("filter"), alpha)
    return SelfAttentionMixer(attention)
