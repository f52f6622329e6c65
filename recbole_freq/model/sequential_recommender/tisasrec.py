"""TiSASRec: time interval aware self-attention for sequential recommendation (Li, Wang
and McAuley, WSDM 2020)."""

from __future__ import annotations

from recbole_freq.model.abstract_recommender import TransformerRecommender


class TiSASRec(TransformerRecommender):
    r"""TiSASRec on the shared Transformer core: SASRec's blocks whose attention adds
    absolute-position and time-interval embeddings to its keys and values.

    - embedding: the item embeddings alone (section 3.3; ``input_position_embedding:
      False``), LayerNorm and dropout;
    - relation matrix (section 3.2): the personalised, clipped intervals
      ``r_ij = min(|t'_i - t'_j|, k)`` of each row's timestamps
      (``temporal.time_interval_matrix``; ``time_span`` k);
    - time-interval-aware attention (eq. 4-5): ``e_ij = q_i (k_j + R^K_ij + P^K_j)^T /
      sqrt(d)`` and ``z_i = sum_j a_ij (v_j + R^V_ij + P^V_j)`` with position and
      interval embeddings shared by the layers (``temporal.TimeIntervalRelations``,
      ``layers.attention_probabilities`` / ``attend``), causal as SASRec;
    - point-wise feed-forward network (eq. 6) and prediction by the dot product of the
      last position's output with every item embedding (eq. 8).

    The blocks are the core's (post-LayerNorm residual paths and an output projection, as
    RecBole's SASRec), not the authors' pre-LayerNorm TensorFlow blocks; the attention is
    theirs.  Any self-attention model of the plugin takes the same attention with
    ``time_intervals: True`` (``--model=RecDenoiser --backbone=TiSASRec`` does).  With
    all position and interval embeddings 0 and input positions on, it is the core's
    SASRec (the tests check both).

    Times: the source's real times in seconds (``REAL_TIME_FIELD``, the ``real_time``
    column that ``dataset_prep`` writes for raw logs) when the dataset has them, else the
    ``TIME_FIELD`` list; the log says which.  On datasets whose times only order the
    interactions (the one-line format) every interval is the position distance, and the
    model says so in the log (``temporal``).
    """

    token_mixer = "self_attention"
