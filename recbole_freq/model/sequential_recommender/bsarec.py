"""BSARec: beyond self-attention for sequential recommendation (Shin et al., AAAI 2024)."""

from __future__ import annotations

import torch

from recbole_freq.model.abstract_recommender import TransformerRecommender, config_value
from recbole_freq.options import whole_number


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

    Padding: RecBole right-pads sequences where the authors' code left-pads.  The
    frequency filter is circulant (diagonal in the Fourier basis), so it commutes with
    the circular shift between the two layouts; only the labels of the learned position
    embeddings differ.
    """

    token_mixer = "bsa"

    def encoder_settings(self, config) -> dict:
        settings = super().encoder_settings(config)
        settings.update(
            alpha=float(config["alpha"]),
            c=whole_number(config["c"], "c"),
            beta_type=config_value(config, "beta_type", "vector"),
            fusion_branches=("bsa",),
            fusion_weights=(1.0,),
        )
        return settings

    def learned_beta(self) -> list[torch.Tensor]:
        """Per layer, the learned high-frequency scale beta (Fig. 7a): D values or one."""
        return [block.mixer.rescaler.beta.detach().cpu() for block in self.encoder.blocks]
