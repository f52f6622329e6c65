"""FBSARec: cross fusion of BSARec's branch features (thesis, section 3.4)."""

from __future__ import annotations

from recbole_freq.model.sequential_recommender.bsarec import BSARec
from recbole_freq.utils.options import setting


class FBSARec(BSARec):
    r"""BSARec whose feed-forward network sees several branch features, summed with weights.

    Per layer, ``X^{l+1} = sum_b w_b FFN(F_b)`` for the branches ``b`` in
    ``fusion_branches`` among ``bsa`` (the fused ``S`` of eq. 4 of the thesis / eq. 5
    of BSARec), ``sa`` (self-attention features ``A X``) and ``ib`` (inductive-bias
    features ``A_IB X``), each after its own residual path; the feed-forward network is
    shared by the branches.  The thesis' appendix tables 1-6 are the combinations
    ``[sa]``, ``[ib]``, ``[sa, ib]``, ``[bsa, sa]``, ``[bsa, ib]`` and ``[bsa, sa, ib]``;
    ``[bsa]`` with weight 1 is exactly BSARec.  ``fusion_weights`` default to equal
    weights summing to 1 and are learned when ``learn_fusion_weights`` is true.
    """

    def encoder_settings(self, config) -> dict:
        settings = super().encoder_settings(config)
        branches = setting(config, "fusion_branches")
        if isinstance(branches, str):
            branches = [name.strip() for name in branches.split(",") if name.strip()]
        settings.update(
            fusion_branches=tuple(branches),
            fusion_weights=config["fusion_weights"],
            learn_fusion_weights=bool(setting(config, "learn_fusion_weights")),
        )
        return settings
