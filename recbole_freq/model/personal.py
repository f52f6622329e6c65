"""SSE-PT's additions to a sequence's input and score (Wu, Li, Hsieh and Sharpnack,
"SSE-PT: Sequential Recommendation Via Personalized Transformer", RecSys 2020).

``SSEPTInputs`` is one part of every ``TransformerRecommender``, so any model of the
plugin takes SSE-PT's user embedding or its stochastic shared embeddings with one
config line (``user_embedding_size``, ``sse_user_prob``, ``sse_item_prob``); with all
three at 0 it changes nothing.  ``SSEPT`` is the core's SASRec with them on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from recbole_freq.utils.options import as_number, setting


def probability(value, name: str) -> float:
    """A probability in [0, 1), or a one-line error naming the setting."""
    number = as_number(value)
    if isinstance(value, bool) or not 0.0 <= number < 1.0:
        raise ValueError(f"{name}={value!r} must be a probability in [0, 1) (0: off)")
    return number


def stochastic_shared(ids: torch.Tensor, prob: float, n_ids: int) -> torch.Tensor:
    """SSE-SE (Wu et al., NeurIPS 2019), as SSE-PT's sampler applies it: each id replaced
    with probability ``prob`` by one drawn uniformly from ``1 .. n_ids - 1`` (torch's
    global generator)."""
    replace = torch.rand(ids.shape, device=ids.device) < prob
    random_ids = torch.randint(1, n_ids, ids.shape, device=ids.device)
    return torch.where(replace, random_ids, ids)


def user_embedding_size(config, model_name: str, unavailable: str) -> int:
    """``user_embedding_size`` (0: none, ``half``: half of ``hidden_size``, SSE-PT's
    split), checked; ``unavailable`` says why the model cannot take users ('' if it
    can)."""
    size = setting(config, "user_embedding_size")
    if size == "half":
        size = config["hidden_size"] // 2
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(
            f"user_embedding_size={size!r} must be an integer >= 0 (0: no user embedding) or half"
        )
    if size and unavailable:
        raise ValueError(
            f"user_embedding_size={size} is not available for {model_name}: {unavailable}"
        )
    return size


@dataclass(frozen=True)
class SSEPTInputs:
    """SSE-PT's personalised input and score and its stochastic shared embeddings.

    - personalised input (section 3.1): each item's embedding concatenated with the
      user's, ``[v_{s_t}; u_i]`` (``user_size`` of the hidden size; the user embedding
      is ``layers.SequenceEmbedding.user_embedding``);
    - personalised score (eq. 5): ``r = <h_t, [v_l; u_i]>``, read as ``[h_I, <h_U,
      u>]`` against ``[e_i; 1]`` (``readout``, ``score_weight``);
    - stochastic shared embeddings (section 3.3, SSE-SE): in training each row's user
      is replaced by a random user with probability ``user_prob`` (the same user in
      input and score) and each input item by a random item with ``item_prob``.
    """

    user_size: int = 0
    user_prob: float = 0.0
    item_prob: float = 0.0

    @classmethod
    def from_config(cls, config, model_name: str, unavailable: str) -> SSEPTInputs:
        size = user_embedding_size(config, model_name, unavailable)
        user_prob = probability(setting(config, "sse_user_prob"), "sse_user_prob")
        item_prob = probability(setting(config, "sse_item_prob"), "sse_item_prob")
        if user_prob and not size:
            raise ValueError(
                f"sse_user_prob={user_prob} replaces user embeddings, and the model "
                "has none: set user_embedding_size > 0 (SSE-PT) or sse_user_prob: 0"
            )
        return cls(size, user_prob, item_prob)

    @property
    def personalised(self) -> bool:
        return self.user_size > 0

    def users(self, users: torch.Tensor, n_users: int, training: bool) -> torch.Tensor:
        """The rows' users as the input and score read them (section 3.3 in training)."""
        if training and self.user_prob > 0:
            return stochastic_shared(users, self.user_prob, n_users)
        return users

    def items(self, item_seq: torch.Tensor, n_items: int, training: bool) -> torch.Tensor:
        """The input items, in training each replaced with probability ``item_prob``
        (padding stays padding)."""
        if not (training and self.item_prob > 0):
            return item_seq
        replaced = stochastic_shared(item_seq, self.item_prob, n_items)
        return torch.where(item_seq > 0, replaced, item_seq)

    def score_weight(self, item_weight: torch.Tensor) -> torch.Tensor:
        """The embeddings items are scored with: personalised, each gets a last entry 1
        that ``readout``'s user term meets: ``<h, [e_i; u]> = <[h_I, <h_U, u>], [e_i;
        1]>``."""
        if not self.personalised:
            return item_weight
        return torch.cat([item_weight, item_weight.new_ones(len(item_weight), 1)], dim=1)

    def readout(self, hidden: torch.Tensor, user: torch.Tensor | None) -> torch.Tensor:
        """What each position scores items with: the hidden state, or, personalised,
        ``[h_I, <h_U, u>]`` for the rows' user embeddings ``user``."""
        if not self.personalised:
            return hidden
        item_size = hidden.size(-1) - self.user_size
        if hidden.dim() == 3:
            user = user[:, None, :]
        user_term = (hidden[..., item_size:] * user).sum(-1, keepdim=True)
        return torch.cat([hidden[..., :item_size], user_term], dim=-1)
