"""WEARec: wavelet-enhanced adaptive frequency filtering for sequential recommendation
(AAAI 2026; code xhy963319431/WEARec, built on the BSARec authors' code)."""

from __future__ import annotations

from recbole_freq.model.abstract_recommender import TransformerRecommender
from recbole_freq.utils.options import setting


class WEARec(TransformerRecommender):
    r"""WEARec: every block's token mixer is an adaptive Fourier filter beside a Haar
    wavelet branch (``wavelet.AdaptiveWaveletFilter``), closed by dropout, residual and
    LayerNorm, followed by the point-wise feed-forward network; no attention.

    - embedding layer: item plus learned position embeddings, LayerNorm and dropout (the
      BSARec authors' ``add_position_embedding``, which WEARec's code inherits);
    - mixer: ``(1 - alpha) Haar_V(X) + alpha irfft(rfft(X) W(x) + b(x))`` per head
      (``n_heads``), ``W`` and ``b`` modulated per sequence by an MLP of the mean token
      (``adaptive``); ``alpha`` fixed (``alpha``);
    - prediction: the dot product of the newest position's output with every item
      embedding, trained with cross-entropy over all items (the authors'
      ``calculate_loss``).

    The paper is not among this project's papers; what is written here follows the
    authors' ``src/model/wearec.py`` and their released logs, whose first lines give the
    settings of ``properties/paper/WEARec/<dataset>.yaml``.  Both branches mix the whole
    window, padding included, and the mean token averages over padding too, so the
    authors' left padding (``sequence_layout: left``, protocol ``bsarec``) gives another
    function than RecBole's right padding; ``tests/test_wearec.py`` holds the left layout
    to an oracle written from the authors' algorithm.
    """

    token_mixer = "wavelet_fourier"

    def encoder_settings(self, config) -> dict:
        settings = super().encoder_settings(config)
        settings.update(
            alpha=float(config["alpha"]),
            mixer_options={"adaptive": bool(setting(config, "adaptive"))},
        )
        return settings
