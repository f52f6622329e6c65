"""SSE-PT: sequential recommendation via personalized Transformer (Wu, Li, Hsieh and
Sharpnack, RecSys 2020)."""

from __future__ import annotations

from recbole_freq.model.abstract_recommender import TransformerRecommender


class SSEPT(TransformerRecommender):
    r"""SSE-PT on the shared Transformer core: SASRec with a personalised input and
    score, regularised by stochastic shared embeddings.

    - embedding (section 3.1): each item's embedding concatenated with the user's,
      ``[v_{s_t}; u_i]`` (``user_embedding_size`` of the ``hidden_size``; the item gets
      the rest), plus learned position embeddings of the full width, LayerNorm and
      dropout (``layers.SequenceEmbedding``);
    - SASRec's causal Transformer blocks (section 3.2) from the shared core;
    - prediction (eq. 5): ``r = <h_t, [v_l; u_i]>``, the last output against the item's
      embedding concatenated with the same user's (``readout`` / ``item_scores_weight``;
      the user term shifts every item's score alike, so it changes losses that are not
      a softmax, not the ranking);
    - stochastic shared embeddings (section 3.3, SSE-SE): in training each row's user is
      replaced by a random user with probability ``sse_user_prob`` (the same replaced
      user in input and score, as the authors' sampler does) and each input item by a
      random item with probability ``sse_item_prob``.

    Settings: the authors' README (``wuliwei9278/SSE-PT``): item and user embeddings of
    50 (hidden 100), 2 blocks, 1 head, dropout 0.2, and the SSE probabilities of its
    documented run: keep the user with probability 0.08 (``sse_user_prob: 0.92``), keep
    an item with 0.9 (``sse_item_prob: 0.1``).  Differences: the core's post-LayerNorm
    blocks and output projection (the authors': SASRec's pre-LayerNorm TensorFlow
    blocks); the authors' sampler also replaces the target at a replaced position,
    here only inputs are replaced; their embedding scaling by ``sqrt(d)`` is absorbed
    by the LayerNorm.  With ``sse_*_prob: 0`` and ``user_embedding_size: 0`` it is the
    core's SASRec.  ``--model=RecDenoiser --backbone=SSE-PT`` is Rec-Denoiser on it.
    """

    token_mixer = "self_attention"
