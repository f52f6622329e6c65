"""FMLP-Rec: filter-enhanced MLP for sequential recommendation (Zhou et al., WWW 2022)."""

from __future__ import annotations

from recbole_freq.model.abstract_recommender import TransformerRecommender


class FMLPRec(TransformerRecommender):
    r"""FMLP-Rec: the encoder's token mixer is a learnable filter, not self-attention.

    - embedding layer: item plus learned position embeddings, LayerNorm and dropout, as
      SASRec's (and BSARec eq. 4);
    - filter layer of every filter-enhanced block: the sequence's orthonormal real FFT
      times a learnable complex filter, transformed back, with dropout, residual and
      LayerNorm (``LearnableFilter`` / ``FilterMixer``, token mixer ``filter``);
    - point-wise feed-forward network with its residual path, as in a Transformer;
    - prediction: the dot product of the last position's output with every item
      embedding.

    Loss: the authors train with binary cross-entropy, one negative per row drawn
    outside the row (Woeee/FMLP-Rec, ``trainers.py``; the BSARec authors' baseline does
    the same), so ``properties/model/FMLPRec.yaml`` sets the protocol piece
    ``train_loss: bce``; ``--train_loss=model`` trains with ``loss_type`` (CE) instead.

    The filter mixes every position with every other (it is not causal), so the model
    cannot train with ``train_rows: last_n_all_positions``.
    """

    token_mixer = "filter"
