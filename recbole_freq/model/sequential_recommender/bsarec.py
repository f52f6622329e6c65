"""BSARec: beyond self-attention for sequential recommendation (Shin et al., AAAI 2024)."""

from __future__ import annotations

import torch

from recbole_freq.model.abstract_recommender import TransformerRecommender
from recbole_freq.utils.options import setting, whole_number


class BSARec(TransformerRecommender):
    r"""BSARec: every layer mixes self-attention with an attentive inductive bias.

    - embedding layer: eq. 4;
    - beyond-self-attention layer ``S = alpha A_IB X + (1 - alpha) A X``: eq. 5, with
      multi-head self-attention eq. 6 (``attention_operator``, default softmax);
    - attentive inductive bias ``A_IB X = LFC[X] + beta HFC[X]``: eq. 7, the low band
      being the lowest ``c // 2 + 1`` bins of the orthonormal real FFT along the
      sequence, as in the authors' code; ``beta_type`` ``vector`` (D values per layer)
      or ``scalar`` (Table 3 ablation); beta is kept non-negative as ``sqrt_beta ** 2``;
    - feed-forward network and layer output: eq. 8-9; prediction eq. 10; CE loss eq. 11
      (``loss_type: BPR`` as an option).

    Ablations (Table 3/7): ``alpha: 0`` is "only A", ``alpha: 1`` "only A_IB",
    ``beta_type: scalar`` "scalar beta".

    Padding (``sequence_layout``): the authors' code left-pads every row and numbers
    positions ``0 .. n-1`` across the padded row, so the newest item always takes the
    last position embedding; RecBole right-pads.  The two give different functions for
    every row shorter than ``n``: the filter, unmasked, mixes the padding positions'
    embeddings into every position, and those embeddings (and the causal attention
    states at padded positions) depend on where the padding sits.  The circulant filter
    commutes with a circular shift, but the position embeddings do not shift with it.
    ``--protocol=bsarec`` (and ``--paper``) use ``left``, the authors' layout;
    ``tests/test_models.py`` holds the model to an oracle written from their algorithm.
    """

    token_mixer = "bsa"

    def encoder_settings(self, config) -> dict:
        settings = super().encoder_settings(config)
        settings.update(
            alpha=float(config["alpha"]),
            c=whole_number(config["c"], "c"),
            beta_type=setting(config, "beta_type"),
            fusion_branches=("bsa",),
            fusion_weights=(1.0,),
        )
        return settings

    def learned_beta(self) -> list[torch.Tensor]:
        """Per layer, the learned high-frequency scale beta (Fig. 7a): D values or one."""
        return [block.mixer.rescaler.beta.detach().cpu() for block in self.encoder.blocks]

    def analysis_report(self, batches) -> dict:
        """``--analyze``: the learned beta of every layer (Fig. 7a)."""
        beta = [value.tolist() for value in self.learned_beta()]
        return {"bsarec_beta": beta, **super().analysis_report(batches)}
