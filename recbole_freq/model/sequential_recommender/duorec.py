"""DuoRec: contrastive learning for the representation degeneration problem in sequential
recommendation (Qiu et al., WSDM 2022)."""

from __future__ import annotations

from recbole_freq.model.abstract_recommender import TransformerRecommender
from recbole_freq.model.contrastive import SameTargetSampler, contrast_settings, nt_xent
from recbole_freq.utils.options import as_number, setting

# contrast: which pairs the NT-Xent sees (the DuoRec authors' ``contrast`` / ``ssl``).
CONTRASTS = {
    "us_x": "a dropout view of the sequence against a same-target sequence",
    "us": "the sequence against a dropout view and against a same-target sequence",
    "un": "the sequence against a dropout view of itself",
    "su": "the sequence against a same-target sequence",
}


class DuoRec(TransformerRecommender):
    r"""DuoRec on the shared Transformer core: SASRec's encoder and softmax cross-entropy
    over all items, plus contrastive regularisation of the sequence representation.

    - encoder and prediction: SASRec's (token mixer ``self_attention``), the last
      position's output ``h`` scored by the dot product with every item embedding;
    - model-level augmentation: encoding the same sequence again with fresh dropout
      masks gives a second view ``h'`` (the unsupervised positive);
    - semantic augmentation: another training sequence with the same target item gives
      ``h_s`` (the supervised positive; ``contrastive.SameTargetSampler``, which, as the
      authors' code, falls back to the sequence itself when no other has its target);
    - contrastive regularisation: NT-Xent over the batch (``contrastive.nt_xent``:
      temperature ``tau``, similarity ``sim``), every other view in the batch a
      negative.

    ``L = L_rec + lmd * NT-Xent(h, h') + lmd_sem * NT-Xent(h, h_s)`` with ``contrast: us``;
    ``un`` keeps only the first term, ``su`` only the second, and ``us_x`` (the default
    of the DuoRec code and of the BSARec authors' baseline) uses
    ``lmd_sem * NT-Xent(h', h_s)``: the dropout view against the same-target view.
    ``contrast: ~`` (or zero weights) leaves SASRec.
    """

    token_mixer = "self_attention"
    loss_types = ("CE",)  # DuoRec's L_rec is the softmax CE over all items
    positive_weighting = "distinct"  # contrastive.SameTargetSampler's weighting
    extra_inputs_unavailable = (
        "its same-target views are other rows' items, encoded without timestamps or users"
    )

    def __init__(self, config, dataset):
        contrast = config["contrast"]  # DuoRec.yaml's us_x unless set; ~ is no contrast
        if contrast in ("None", "none"):
            contrast = None
        if contrast is not None and contrast not in CONTRASTS:
            raise ValueError(
                f"contrast={contrast!r} is unknown; choose from {sorted(CONTRASTS)} or ~ (none)"
            )
        lmd = _weight(setting(config, "lmd"), "lmd")
        lmd_sem = _weight(setting(config, "lmd_sem"), "lmd_sem")
        tau, sim = contrast_settings(setting(config, "tau"), setting(config, "sim"))
        super().__init__(config, dataset)
        self.contrast, self.lmd, self.lmd_sem = contrast, lmd, lmd_sem
        self.tau, self.sim = tau, sim
        self.positive_sampler = None
        if self.supervised:
            self.positive_sampler = self.build_positive_sampler(dataset)

    def build_positive_sampler(self, dataset) -> SameTargetSampler:
        """Same-target positives over the training rows of ``dataset``."""
        return SameTargetSampler.for_model(self, dataset, self.positive_weighting)

    @property
    def unsupervised(self) -> bool:
        """Whether the sequence meets its dropout view (``lmd``'s term)."""
        return self.contrast in ("us", "un") and self.lmd > 0

    @property
    def supervised(self) -> bool:
        """Whether a same-target view enters (``lmd_sem``'s term)."""
        return self.contrast in ("us", "su", "us_x") and self.lmd_sem > 0

    def auxiliary_losses(self) -> list[str]:
        if not (self.unsupervised or self.supervised):
            return []
        return [
            f"contrastive term (contrast={self.contrast}, lmd={self.lmd}, lmd_sem={self.lmd_sem})"
        ]

    def dropout_view(self, interaction):
        """The batch encoded again: another draw of the dropout masks (``h'``)."""
        return self.forward(interaction[self.ITEM_SEQ], interaction[self.ITEM_SEQ_LEN])

    def same_target_view(self, interaction):
        """Same-target training sequences of the batch, drawn and encoded (``h_s``)."""
        positive_seq, positive_len, _ = self.positive_sampler.positives(
            interaction[self.ITEM_SEQ],
            interaction[self.ITEM_SEQ_LEN],
            interaction[self.POS_ITEM_ID],
        )
        return self.forward(positive_seq, positive_len)

    def calculate_loss(self, interaction):
        if not self.auxiliary_losses():
            return super().calculate_loss(interaction)
        seq_output, loss = self.last_position_loss(interaction)

        def contrastive(first, second):
            return nt_xent(first, second, self.tau, self.sim)

        if self.unsupervised:
            loss = loss + self.lmd * contrastive(seq_output, self.dropout_view(interaction))
        if self.supervised and self.contrast == "us_x":
            loss = loss + self.lmd_sem * contrastive(
                self.dropout_view(interaction), self.same_target_view(interaction)
            )
        elif self.supervised:
            loss = loss + self.lmd_sem * contrastive(seq_output, self.same_target_view(interaction))
        return loss


def _weight(value, name: str) -> float:
    number = as_number(value)
    if isinstance(value, bool) or not number >= 0:
        raise ValueError(f"{name}={value!r} must be a number >= 0 (0 turns its term off)")
    return number
