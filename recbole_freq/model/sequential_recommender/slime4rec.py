"""SLIME4Rec: contrastive enhanced slide filter mixer for sequential recommendation
(Du et al., ICDE 2023; code sudaada/SLIME4Rec, on RecBole and DuoRec's code)."""

from __future__ import annotations

from recbole_freq.model.sequential_recommender.duorec import DuoRec
from recbole_freq.utils.options import setting


class SLIME4Rec(DuoRec):
    r"""SLIME4Rec: DuoRec's objective over a filter mixer instead of attention.

    - encoder: each block's token mixer is the slide filter (``frequency.SlideFilter``,
      token mixer ``slide_filter``): the sequence's orthonormal rfft times a learnable
      complex filter kept to a band of bins that slides with the layer
      (``frequency.slime4rec_bands``: ``filter_mixer`` ``G`` the dynamic band of
      ``dynamic_ratio`` of the bins, ``L`` the static band, ``M`` both, ``slide_mode``),
      transformed back, with dropout at ``attn_dropout_prob`` (the authors' filter
      layer), residual and LayerNorm; then the feed-forward network;
    - prediction and loss: DuoRec's (``duorec.DuoRec``): CE over all items plus the
      NT-Xent of ``contrast`` (``us_x``, as the authors' ``seq.yaml``), ``lmd``,
      ``lmd_sem``, ``tau``, ``sim``, same-target positives from the training rows.

    The authors' code (``recbole/model/layers.py``, ``FilterMixerLayer``, ``Encoder``)
    also declares SimGCL noise on every layer's input and a SimGRACE "vice" model; both
    are off in their settings (``simgcl_lambda: 0``, ``simgrace_eta: 0``, and the vice
    model's output never enters the loss), so neither is built here, nor their other
    switches left at their defaults (``residual: True``, ``dense: False``).  RecBole's
    right padding is the authors' layout (their code is RecBole's).
    """

    token_mixer = "slide_filter"

    def encoder_settings(self, config) -> dict:
        settings = super().encoder_settings(config)
        settings["mixer_options"] = {
            "filter_mixer": setting(config, "filter_mixer"),
            "dynamic_ratio": float(setting(config, "dynamic_ratio")),
            "slide_mode": setting(config, "slide_mode"),
        }
        return settings
