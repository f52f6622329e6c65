"""CL4SRec: contrastive learning for sequential recommendation (Xie et al., ICDE 2022)."""

from __future__ import annotations

from recbole_freq.model.abstract_recommender import TransformerRecommender
from recbole_freq.model.contrastive import contrast_settings, nt_xent, two_augmented_views
from recbole_freq.utils.options import as_number, setting


class CL4SRec(TransformerRecommender):
    r"""CL4SRec on the shared Transformer core: SASRec's encoder and softmax
    cross-entropy over all items, plus a contrastive term between two augmented views
    of every training sequence (the paper's section on its framework).

    - augmentation operators: item crop (ratio eta, ``crop_eta``), item mask (gamma,
      ``mask_gamma``, with a ``[mask]`` token after the catalogue) and item reorder
      (beta, ``reorder_beta``); each sequence gets two views by two different operators
      drawn uniformly (``contrastive.two_augmented_views``);
    - encoder: the shared self-attention core; a view's representation is its last
      position's output;
    - contrastive loss: NT-Xent over the 2N views of a batch, the other 2N - 2 views
      negatives (``contrastive.nt_xent``, temperature ``tau``, similarity ``sim``);
    - multi-task loss ``L = L_main + lmd * L_cl``; ``lmd: 0`` leaves SASRec.

    Defaults (``properties/model/CL4SRec.yaml``): those of the CL4SRec baseline in the
    DuoRec authors' code (RuihongQiu/DuoRec): eta 0.6, gamma 0.3, beta 0.6, lmd 0.1,
    tau 1, dot product.
    """

    token_mixer = "self_attention"
    loss_types = ("CE",)  # L_main is the softmax CE over all items
    extra_item_tokens = 1  # [mask], id n_items: an input of item_mask, never scored
    extra_inputs_unavailable = "its augmented views are encoded without timestamps or users"

    def __init__(self, config, dataset):
        ratios = {
            name: _ratio(setting(config, name), name)
            for name in ("crop_eta", "mask_gamma", "reorder_beta")
        }
        lmd = setting(config, "lmd")
        if isinstance(lmd, bool) or not as_number(lmd) >= 0:
            raise ValueError(f"lmd={lmd!r} must be a number >= 0 (0 turns contrast off)")
        tau, sim = contrast_settings(setting(config, "tau"), setting(config, "sim"))
        super().__init__(config, dataset)
        self.ratios = ratios
        self.lmd, self.tau, self.sim = as_number(lmd), tau, sim
        self.mask_token = self.n_items

    def auxiliary_losses(self) -> list[str]:
        return [f"contrastive term (lmd={self.lmd})"] if self.lmd > 0 else []

    def augmented_views(self, item_seq, item_seq_len):
        """The two augmented views of each sequence (and the operators drawn)."""
        return two_augmented_views(
            item_seq,
            item_seq_len,
            self.ratios["crop_eta"],
            self.ratios["mask_gamma"],
            self.ratios["reorder_beta"],
            self.mask_token,
        )

    def calculate_loss(self, interaction):
        if self.lmd == 0:
            return super().calculate_loss(interaction)
        _, loss = self.last_position_loss(interaction)
        views = self.augmented_views(interaction[self.ITEM_SEQ], interaction[self.ITEM_SEQ_LEN])
        (first, first_len), (second, second_len), _ = views
        contrast = nt_xent(
            self.forward(first, first_len), self.forward(second, second_len), self.tau, self.sim
        )
        return loss + self.lmd * contrast


def _ratio(value, name: str) -> float:
    number = as_number(value)
    if isinstance(value, bool) or not 0 < number <= 1:
        raise ValueError(f"{name}={value!r} must be a proportion in (0, 1]")
    return number
