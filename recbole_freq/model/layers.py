"""Generic Transformer pieces of the one encoder core every recbole-freq model is built from.

A block is ``token mixer -> feed-forward``; inside self-attention an *attention operator*
turns queries, keys and values into ``A V`` (softmax attention, BSARec eq. 1), and every
sub-layer ends in a *residual path* (dropout + residual + LayerNorm, BSARec eq. 9).  This
module holds the pieces every model shares; each paper's own operators live in
``frequency`` (BSARec), ``polynomial`` (PolyRec) and ``denoising`` (Rec-Denoiser), and
``encoder.build_encoder`` assembles them from configuration.

Tensors are ``(batch, seq_len, hidden)`` unless stated; attention masks are boolean
``(batch, 1, seq_len, seq_len)`` with ``True`` where a query may attend to a key.
Attention may also take ``KeyValueRelations``: embeddings added to its keys and values
per position and per (query, key) pair (TiSASRec's, see ``temporal``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

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


def keeps_float32(method):
    """Run a frequency filter's ``method(self, hidden, ...)`` in float32 outside autocast.

    Under mixed precision (``enable_amp``) autocast would round its DFT matrices and
    spectra to bfloat16 / float16, a relative error of about 1e-2 in ``LFC[X]``; the
    filter is a small part of the step, so it keeps full precision and returns float32.
    """

    @functools.wraps(method)
    def in_float32(self, hidden, *args, **kwargs):
        device_type = hidden.device.type
        if not torch.is_autocast_enabled(device_type):
            return method(self, hidden, *args, **kwargs)
        with torch.autocast(device_type=device_type, enabled=False):
            return method(self, hidden.float(), *args, **kwargs)

    return in_float32


def build_attention_mask(item_seq: torch.Tensor, bidirectional: bool = False) -> torch.Tensor:
    """Boolean mask that hides padding keys (item id 0) and, unless bidirectional, the future.

    Same set of allowed (query, key) pairs as RecBole's ``get_attention_mask``, which
    encodes it as an additive ``0 / -10000`` mask.  A query with no allowed key (an
    all-padding input, e.g. the first row of ``train_rows: window``) is given every key:
    under the additive mask all its scores shift by the same -10000, so its softmax is
    the unmasked one, as in RecBole's and the BSARec authors' models, where a boolean
    mask would give NaN.
    """
    keys_real = (item_seq != 0)[:, None, None, :]
    if bidirectional:
        mask = keys_real
    else:
        seq_len = item_seq.size(-1)
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=item_seq.device).tril()
        mask = keys_real & causal
    return mask | ~mask.any(dim=-1, keepdim=True)


SEQUENCE_LAYOUTS = ("right", "left")


def sequence_extent(item_seq: torch.Tensor) -> torch.Tensor:
    """Per row of a right-padded sequence, the number of slots up to its last non-padding
    item, at least 1: RecBole's ``item_length`` (an empty input, the first row of
    ``train_rows: window``, is one padding item)."""
    slots = torch.arange(1, item_seq.size(1) + 1, device=item_seq.device)
    return (slots * (item_seq != 0)).amax(dim=1).clamp(min=1)


def left_alignment(lengths: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(to_left, to_right)``: gather indices along the sequence axis between RecBole's
    right-padded rows (a row's ``lengths[r]`` slots first, padding after them) and the
    left-padded layout of the BSARec, FMLP-Rec, S3-Rec, SASRec and Rec-Denoiser authors'
    code (padding first, the newest item at position ``seq_len - 1``).  Each is a
    per-row rotation by ``seq_len - length``, so the padding slots move as a block and
    ``x.gather(1, to_left).gather(1, to_right) == x``."""
    positions = torch.arange(seq_len, device=lengths.device)
    shift = (seq_len - lengths.long().clamp(1, seq_len))[:, None]
    to_left = (positions[None, :] - shift) % seq_len
    to_right = (positions[None, :] + shift) % seq_len
    return to_left, to_right


def gather_positions(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``tensor[r, index[r, t], ...]`` along dim 1, for a tensor of any trailing shape."""
    shaped = index.view(index.shape + (1,) * (tensor.dim() - 2)).expand(
        index.shape + tensor.shape[2:]
    )
    return tensor.gather(1, shaped)


@dataclass(frozen=True)
class SequenceLayout:
    """Where a sequence's items sit among the ``n`` positions the encoder sees (position
    embeddings, the attention mask, the frequency filters that mix every position).

    ``right``, RecBole's: items at ``0 .. length - 1`` and padding after them; ``left``,
    the BSARec / FMLP-Rec / SASRec authors' (``[0] * pad_len + input_ids``): padding
    first and the newest item at ``n - 1``.  RecBole's loaders always give right-padded
    rows; with ``left`` the encoder re-lays each row on the way in (``to_encoder``) and
    its outputs back on the way out (``to_data``), so every reader of the outputs (the
    last position at ``item_seq_len - 1``, per-position targets, augmentations) keeps
    RecBole's layout."""

    name: str = SEQUENCE_LAYOUTS[0]

    @classmethod
    def from_config(cls, config) -> SequenceLayout:
        """The run's ``sequence_layout`` (a protocol piece): ``right`` when unset, as in
        configurations stored before the piece existed."""
        name = config["sequence_layout"] or SEQUENCE_LAYOUTS[0]
        if name not in SEQUENCE_LAYOUTS:
            raise ValueError(
                f"sequence_layout={name!r} is unknown; choose one of {', '.join(SEQUENCE_LAYOUTS)}"
            )
        return cls(name)

    def to_encoder(self, item_seq: torch.Tensor, time_seq=None):
        """``(item_seq, time_seq, to_right)``: the rows in this layout, and the gather
        index that puts the encoder's outputs back in RecBole's (None when the two are
        the same)."""
        if self.name == "right":
            return item_seq, time_seq, None
        to_left, to_right = left_alignment(sequence_extent(item_seq), item_seq.size(1))
        if time_seq is not None:
            time_seq = time_seq.gather(1, to_left)
        return item_seq.gather(1, to_left), time_seq, to_right

    @staticmethod
    def to_data(hidden: torch.Tensor, to_right) -> torch.Tensor:
        return hidden if to_right is None else gather_positions(hidden, to_right)


class SequenceEmbedding(nn.Module):
    """Embedding layer, BSARec eq. 4: ``E = Dropout(LayerNorm(M[s] + P))``.

    Without ``positions``, ``E = Dropout(LayerNorm(M[s]))`` (TiSASRec, whose positions
    enter the keys and values of attention instead).  With ``n_users`` and
    ``user_size``, each item's embedding of ``hidden_size - user_size`` is concatenated
    with the user's embedding, ``[M[s_t]; U_u]`` (SSE-PT's personalised input)."""

    def __init__(
        self,
        n_items,
        max_seq_length,
        hidden_size,
        dropout_prob,
        layer_norm_eps,
        positions=True,
        n_users=0,
        user_size=0,
    ):
        super().__init__()
        if user_size and not 0 < user_size < hidden_size:
            raise ValueError(
                f"user_embedding_size={user_size} must lie in (0, hidden_size={hidden_size}): "
                "the item embedding gets the rest of the hidden size"
            )
        self.item_embedding = nn.Embedding(n_items, hidden_size - user_size, padding_idx=0)
        self.user_embedding = nn.Embedding(n_users, user_size) if user_size else None
        self.position_embedding = nn.Embedding(max_seq_length, hidden_size) if positions else None
        self.layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = Dropout(dropout_prob)

    def forward(self, item_seq: torch.Tensor, users: torch.Tensor | None = None) -> torch.Tensor:
        embedded = self.item_embedding(item_seq)
        if self.user_embedding is not None:
            user = self.user_embedding(users)[:, None, :].expand(-1, item_seq.size(1), -1)
            embedded = torch.cat([embedded, user], dim=-1)
        if self.position_embedding is not None:
            positions = torch.arange(item_seq.size(1), device=item_seq.device)
            embedded = embedded + self.position_embedding(positions)
        return self.dropout(self.layer_norm(embedded))


class StandardResidual(nn.Module):
    """Residual path ``LayerNorm(x + Dropout(f(x)))`` that closes every sub-layer (eq. 9)."""

    def __init__(self, hidden_size, dropout_prob, layer_norm_eps):
        super().__init__()
        self.dropout = Dropout(dropout_prob)
        self.layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)

    def forward(self, sublayer_output: torch.Tensor, sublayer_input: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(sublayer_input + self.dropout(sublayer_output))


class PreNormResidual(nn.Module):
    """The residual path of SASRec's own code (Kang and McAuley, ``model.py``): the
    sub-layer reads its input through a LayerNorm, ``y = LayerNorm(x)``, and the residual
    is added to that normalised input, ``y + Dropout(f(y))``, with no LayerNorm after it;
    the encoder closes with one LayerNorm (``block_norm: sasrec_pre``).  In the attention
    sub-layer only the queries are normalised, the keys and values read ``x`` itself, as
    there.  ``normalise`` is the LayerNorm the sub-layer applies first."""

    normalises_input = True

    def __init__(self, hidden_size, dropout_prob, layer_norm_eps):
        super().__init__()
        self.input_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = Dropout(dropout_prob)

    def normalise(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.input_norm(hidden)

    def forward(self, sublayer_output: torch.Tensor, normalised_input: torch.Tensor):
        return normalised_input + self.dropout(sublayer_output)


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
        # The draws become the scaled mask in place (rand >= p as 1.0 / 0.0, then times
        # 1 / (1 - p)): the same values as a boolean mask cast to x's type, without the
        # boolean tensor and the cast's copy.
        mask = torch.rand_like(x).ge_(self.p).mul_(1.0 / (1.0 - self.p))
        return x * mask

    def extra_repr(self) -> str:
        return f"p={self.p}"


@dataclass(frozen=True)
class KeyValueRelations:
    """Embeddings added to the keys and values of attention, split into heads: per key
    position, ``position_key`` / ``position_value`` ``(heads, seq_len, head_size)``
    (TiSASRec eq. 4-5: ``P^K_j``, ``P^V_j``); per (query, key) pair, the bucket
    ``pair_bucket[b, i, j]`` ``(batch, seq_len, seq_len)`` of a table of bucket
    embeddings ``bucket_key`` / ``bucket_value`` ``(heads, buckets, head_size)``, so that
    ``R^K_ij = bucket_key[:, pair_bucket[b, i, j]]`` (and ``R^V`` alike).

    The pair embeddings are never gathered into ``(batch, n, n, hidden)`` tensors:
    ``q_i . R^K_ij`` is entry ``pair_bucket[i, j]`` of ``q_i R^{K T}`` and ``sum_j a_ij
    R^V_ij`` is ``(sum of a_ij per bucket) R^V``, which takes ``O(batch n (n + buckets))``
    memory instead of ``O(batch n^2 hidden)``."""

    position_key: torch.Tensor
    position_value: torch.Tensor
    pair_bucket: torch.Tensor
    bucket_key: torch.Tensor
    bucket_value: torch.Tensor

    def index_for(self, heads: int) -> torch.Tensor:
        """``pair_bucket`` broadcast to ``(heads, batch, n, n)``."""
        return self.pair_bucket.unsqueeze(0).expand(heads, *self.pair_bucket.shape)


def _heads_first(tensor: torch.Tensor) -> torch.Tensor:
    """``(batch, heads, n, k)`` -> ``(heads, batch * n, k)``: one large matrix product per
    head instead of one small one per (row, head)."""
    batch, heads, n, k = tensor.shape
    return tensor.transpose(0, 1).reshape(heads, batch * n, k)


def attention_probabilities(query, key, mask, relations=None) -> torch.Tensor:
    """``A = softmax(Q K^T / sqrt(d))`` restricted to the allowed keys, BSARec eq. 1;
    with ``relations``, TiSASRec eq. 5: ``e_ij = q_i (k_j + R^K_ij + P^K_j)^T / sqrt(d)``,
    its interval term read from the per-bucket products ``q_i R^{K T}``."""
    if relations is not None:
        key = key + relations.position_key
    scores = torch.matmul(query, key.transpose(-1, -2))
    if relations is not None:
        batch, heads, n, _ = query.shape
        per_bucket = torch.matmul(_heads_first(query), relations.bucket_key.transpose(-1, -2))
        per_bucket = per_bucket.view(heads, batch, n, -1)
        scores = scores + per_bucket.gather(-1, relations.index_for(heads)).transpose(0, 1)
    scores = scores * query.size(-1) ** -0.5
    return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)


def attend(probs, value, relations=None) -> torch.Tensor:
    """``A V``; with ``relations``, TiSASRec eq. 4: ``z_i = sum_j a_ij (v_j + R^V_ij +
    P^V_j)``, its interval term as each row's probabilities summed per bucket times
    ``R^V``."""
    if relations is None:
        return torch.matmul(probs, value)
    batch, heads, n, _ = probs.shape
    buckets = relations.bucket_value.size(-2)
    per_bucket = probs.new_zeros(heads, batch, n, buckets)
    per_bucket.scatter_add_(-1, relations.index_for(heads), probs.transpose(0, 1))
    intervals = torch.matmul(per_bucket.view(heads, batch * n, buckets), relations.bucket_value)
    output = torch.matmul(probs, value + relations.position_value)
    return output + intervals.view(heads, batch, n, -1).transpose(0, 1)


def explicit_in_training(device: torch.device, dropout_p: float) -> bool:
    """Whether training attention on ``device`` computes ``A`` explicitly rather than
    with the fused kernel (``SoftmaxAttention``)."""
    if device.type == "cpu":
        return dropout_p > 0
    return device.type == "cuda" and torch.are_deterministic_algorithms_enabled()


class SoftmaxAttention(nn.Module):
    """Attention operator ``softmax(Q K^T / sqrt(d)) V`` (BSARec eq. 1, per head).

    Dropout acts on the attention probabilities as in RecBole's and the authors'
    implementations.  With ``relations`` it is TiSASRec's time-interval-aware attention
    (eq. 4-5), computed explicitly (``attention_probabilities``, ``attend``).  Inference
    and GPU training use PyTorch's fused ``scaled_dot_product_attention``, with two
    exceptions that compute ``A`` explicitly: CPU training with dropout (the fused
    kernel's CPU fallback draws its dropout mask with the slow ``bernoulli_``) and CUDA
    training under deterministic algorithms (``deterministic: True``): the fused
    kernel's backward on CUDA (memory-efficient attention) adds in a varying order, so
    two runs with one seed would part (torch warns and goes on).  Both paths give the
    same function (tests compare them with an unfused oracle).
    """

    def __init__(self, dropout_prob: float):
        super().__init__()
        self.dropout = Dropout(dropout_prob)

    def forward(self, query, key, value, mask, relations=None):
        if relations is not None:
            probs = attention_probabilities(query, key, mask, relations)
            return attend(self.dropout(probs), value, relations)
        if self.training and explicit_in_training(query.device, self.dropout.p):
            return torch.matmul(self.dropout(attention_probabilities(query, key, mask)), value)
        return F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=mask,
            dropout_p=self.dropout.p if self.training else 0.0,
        )


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

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor, relations=None) -> torch.Tensor:
        batch, seq_len, width = hidden.shape
        skip = hidden
        if getattr(self.residual, "normalises_input", False):
            # SASRec's pre-LN block: queries from LayerNorm(x), keys and values from x.
            skip = self.residual.normalise(hidden)
            weight, bias = self.qkv.weight, self.qkv.bias
            query = F.linear(skip, weight[:width], bias[:width])
            query = query.view(batch, seq_len, self.n_heads, self.head_size).transpose(1, 2)
            kv = F.linear(hidden, weight[width:], bias[width:])
            kv = kv.view(batch, seq_len, 2, self.n_heads, self.head_size)
            key, value = kv.permute(2, 0, 3, 1, 4).unbind(0)
        else:
            qkv = self.qkv(hidden).view(batch, seq_len, 3, self.n_heads, self.head_size)
            query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        if relations is None:
            context = self.operator(query, key, value, mask)
        else:  # only operators with ``accepts_relations`` are built with relations
            context = self.operator(query, key, value, mask, relations)
        context = context.transpose(1, 2).reshape(batch, seq_len, -1)
        return self.residual(self.dense(context), skip)


class SelfAttentionMixer(nn.Module):
    """Token mixer of SASRec-style blocks: offers the branch ``sa`` = ``A X``."""

    branches = ("sa",)
    default_branches = ("sa",)

    def __init__(self, attention: MultiHeadSelfAttention):
        super().__init__()
        self.attention = attention

    def forward(self, hidden, mask, wanted: Sequence[str], relations=None):
        return {"sa": self.attention(hidden, mask, relations)}


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
        if getattr(self.residual, "normalises_input", False):
            hidden = self.residual.normalise(hidden)
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

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor, relations=None) -> torch.Tensor:
        features = self.mixer(hidden, mask, self.branches, relations)
        if self._plain:
            return self.feed_forward(features[self.branches[0]])
        fused = 0
        for weight, name in zip(self.fusion_weights, self.branches):
            fused = fused + weight * self.feed_forward(features[name])
        return fused


class TransformerEncoder(nn.Module):
    """A stack of ``TransformerBlock`` s; optionally returns every layer's output.

    ``final_norm``: a LayerNorm after the last block (pre-LN blocks, ``block_norm:
    sasrec_pre``, as SASRec's ``last_layernorm``); it is part of the last layer's output.
    """

    def __init__(self, blocks: Sequence[TransformerBlock], final_norm: nn.Module | None = None):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = final_norm

    def forward(self, hidden, mask, output_all_layers: bool = False, relations=None):
        outputs = []
        for block in self.blocks:
            hidden = block(hidden, mask, relations)
            outputs.append(hidden)
        if self.final_norm is not None:
            hidden = outputs[-1] = self.final_norm(hidden)
        return outputs if output_all_layers else hidden


def init_weights(module: nn.Module, initializer_range: float) -> None:
    """RecBole's and the authors' initialisation: N(0, initializer_range) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        module.weight.data.normal_(mean=0.0, std=initializer_range)
    elif isinstance(module, nn.LayerNorm):
        module.bias.data.zero_()
        module.weight.data.fill_(1.0)
    if isinstance(module, nn.Linear) and module.bias is not None:
        module.bias.data.zero_()
