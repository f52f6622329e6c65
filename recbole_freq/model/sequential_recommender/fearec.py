"""FEARec: frequency enhanced hybrid attention network for sequential recommendation (Du
et al., SIGIR 2023)."""

from __future__ import annotations

import torch

from recbole_freq.model.contrastive import nt_xent
from recbole_freq.model.sequential_recommender.duorec import DuoRec

# fredom_type -> the pairs of views whose spectra the frequency-domain term compares
FREQUENCY_PAIRS = {
    "us_x": (("dropout view", "same-target view"),),
    "us": (("sequence", "dropout view"), ("sequence", "same-target view")),
    "un": (("sequence", "dropout view"),),
    "su": (("sequence", "same-target view"),),
}
FREQUENCY_WEIGHT = 0.1  # the authors' fixed weight of the frequency-domain term


class FEARec(DuoRec):
    r"""FEARec on the shared Transformer core: DuoRec's objective around blocks whose
    attention is FEARec's hybrid attention.

    - encoder: SASRec's post-LN blocks with ``attention_operator: frequency_enhanced``
      (``frequency.FrequencyEnhancedAttention``: the frequency ramp's band per layer,
      auto-correlation over time delays, and with ``dual_domain`` time-domain attention
      over the same band mixed in with ``spatial_ratio``);
    - contrastive regularisation: DuoRec's (``contrast``, ``lmd``, ``lmd_sem``, ``tau``,
      ``sim``), the same-target positives counted as training rows
      (``SameTargetSampler`` with ``weighting: rows``), the distribution of RecBole's
      FEARec, which draws the rows of the target until one's sequence differs;
    - frequency-domain regulariser (``fredom``, only with ``contrast: us_x``, as in the
      authors' code): ``0.1 * mean |rfft(a) - rfft(b)|`` with the real FFT taken over the
      hidden dimension of the two views' last-position outputs, ``fredom_type`` picking
      the pair (``us_x``: dropout view and same-target view; ``us`` adds sequence and
      dropout view, then sequence and same-target view; ``un`` and ``su`` one of those).

    RecBole 1.2.1's ``FEARec`` computes the same function: given its weights, this class
    gives its scores, losses and gradients (``tests/test_fearec.py``).  It draws its
    positives with a Python loop per row and aggregates ``k`` rolled copies of the
    values per layer; here both are a few batched tensor operations.
    """

    positive_weighting = "rows"

    def __init__(self, config, dataset):
        self.fredom = bool(config["fredom"])
        fredom_type = config["fredom_type"]
        if fredom_type in ("None", "none"):
            fredom_type = None
        if self.fredom and fredom_type not in FREQUENCY_PAIRS:
            raise ValueError(
                f"fredom_type={fredom_type!r} is unknown; choose from {sorted(FREQUENCY_PAIRS)}"
                " (or fredom: False)"
            )
        if config["use_filter"]:
            raise ValueError(
                "use_filter=True names a learnable filter that FEARec's code never defines "
                "(RecBole's FEARec stops at self.complex_weight); leave it False"
            )
        self.fredom_type = fredom_type
        super().__init__(config, dataset)
        if self.frequency_regularised and self.positive_sampler is None:
            self.positive_sampler = self.build_positive_sampler(dataset)

    @property
    def frequency_regularised(self) -> bool:
        """Whether the frequency-domain term enters (only inside ``contrast: us_x``)."""
        return self.fredom and self.contrast == "us_x"

    def auxiliary_losses(self) -> list[str]:
        terms = super().auxiliary_losses()
        if self.frequency_regularised:
            terms.append(
                f"frequency-domain term (fredom_type={self.fredom_type}, {FREQUENCY_WEIGHT})"
            )
        return terms

    def calculate_loss(self, interaction):
        if not self.auxiliary_losses():
            return super().calculate_loss(interaction)
        seq_output, loss = self.last_position_loss(interaction)

        if self.unsupervised:
            loss = loss + self.lmd * nt_xent(
                seq_output, self.dropout_view(interaction), self.tau, self.sim
            )
        if self.contrast == "us_x" and (self.supervised or self.frequency_regularised):
            views = {
                "sequence": seq_output,
                "dropout view": self.dropout_view(interaction),
                "same-target view": self.same_target_view(interaction),
            }
            if self.supervised:
                loss = loss + self.lmd_sem * nt_xent(
                    views["dropout view"], views["same-target view"], self.tau, self.sim
                )
            if self.frequency_regularised:
                loss = loss + self.frequency_term(views)
        elif self.supervised:
            loss = loss + self.lmd_sem * nt_xent(
                seq_output, self.same_target_view(interaction), self.tau, self.sim
            )
        return loss

    def frequency_term(self, views: dict) -> torch.Tensor:
        """``0.1 * mean |rfft(a) - rfft(b)|`` over the pairs ``fredom_type`` names, the
        real FFT over the hidden dimension (orthonormal), in float32."""
        spectra = {
            name: torch.fft.rfft(view.float(), dim=1, norm="ortho") for name, view in views.items()
        }
        return sum(
            FREQUENCY_WEIGHT * (spectra[a] - spectra[b]).abs().flatten().mean()
            for a, b in FREQUENCY_PAIRS[self.fredom_type]
        )
