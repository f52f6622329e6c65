"""TV-Rec: time-variant convolutional filters for sequential recommendation (NeurIPS 2025;
code jeongwhanchoi/TV-Rec, built on the BSARec authors' code)."""

from __future__ import annotations

import torch

from recbole_freq.model.abstract_recommender import TransformerRecommender
from recbole_freq.utils.options import finite_non_negative, integer_option, setting


class TVRec(TransformerRecommender):
    r"""TV-Rec: every block's token mixer is a time-variant graph filter
    (``graph_filter.TimeVariantGraphFilter``: node ``t`` of a directed cycle over the
    sequence and ``K - 1`` padding nodes applies its own polynomial of order ``K`` in the
    cycle's shift, ``h_t = c_t B^`` from ``M`` shared unit basis vectors), closed by
    dropout, residual and LayerNorm, followed by the point-wise feed-forward network; no
    attention and no position embedding.

    - embedding layer: item embeddings only, LayerNorm and dropout (the authors'
      ``get_sequence_emb(pos_emb=False)``);
    - before every block the padded positions' states are set to 0 (their
      ``NVRecEncoder``), the residual included;
    - prediction: the dot product of the newest position's output with every item
      embedding, trained with cross-entropy over all items, plus ``orthogonality_weight``
      times the orthogonality term of every block's basis (their ``calculate_loss``).

    Settings: ``filter_order`` (``K``, the authors fix 50), ``basis_size`` (their ``M``;
    0 is their free-taps branch), ``orthogonality_weight`` (their ``reg_weight``).  The
    paper is not among this project's papers; what is written here follows the authors'
    ``model/tvrec.py`` and their released logs, whose first lines give the settings of
    ``properties/paper/TVRec/<dataset>.yaml``.  The filter reads fixed positions of the
    window, so the authors' left padding (``sequence_layout: left``, protocol ``bsarec``)
    gives another function than RecBole's right padding; ``tests/test_tvrec.py`` holds
    the left layout to an oracle of the authors' spectral algorithm.
    """

    token_mixer = "graph_filter"
    extra_inputs_unavailable = "its filter reads only the item sequence"

    def encoder_settings(self, config) -> dict:
        settings = super().encoder_settings(config)
        settings["mixer_options"] = {
            "order": integer_option(
                setting(config, "filter_order"), "filter_order", 1, "the authors use 50"
            ),
            "basis_size": integer_option(
                setting(config, "basis_size"), "basis_size", 0, "0 gives every node free taps"
            ),
            "orthogonality_weight": finite_non_negative(
                setting(config, "orthogonality_weight"), "orthogonality_weight",
                "0 turns the term off",
            ),
        }  # fmt: skip
        return settings

    def encoder_inputs(self, item_seq: torch.Tensor, time_seq=None, users=None):
        embedded, mask, _ = super().encoder_inputs(item_seq, time_seq, users)
        return embedded, mask, item_seq == 0
