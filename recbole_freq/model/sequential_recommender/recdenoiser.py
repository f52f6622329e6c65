"""Rec-Denoiser (Chen et al., RecSys 2022) on a SASRec backbone, and the shared base of
the denoising models."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from recbole.utils import InputType

from recbole_freq.model.abstract_recommender import (
    TransformerRecommender,
    component_options,
    config_value,
)
from recbole_freq.model.layers import (
    ATTENTION_OPERATORS,
    DenoisingMaskAttention,
    DenoisingObjective,
    DenoisingPass,
    build_attention_mask,
)
from recbole_freq.model.sequential_recommender.bsarec import _as_int

DENOISING_LOSSES = ("CE", "BPR", "BCE")


class DenoisingRecommender(TransformerRecommender):
    """Shared base: a backbone of the shared Transformer core whose training loss goes
    through ``DenoisingObjective`` (Rec-Denoiser eq. 13), so ``attention_operator:
    denoise`` masks are learned with the ARM / AR estimator and ``jacobian_gamma`` adds
    the Jacobian regulariser.  Subclasses give the backbones (``backbone`` config key ->
    token mixer) and ``training_pass``.

    Losses (``loss_type``): ``CE`` over all items, ``BPR``, or ``BCE`` with one sampled
    negative per positive (eq. 4); BPR / BCE need sampled negatives.  L2 (eq. 4's alpha)
    is RecBole's ``weight_decay``.
    """

    backbones: dict[str, str] = {}  # backbone name -> token mixer
    default_backbone = ""
    other_model = ""  # named in the error for another model's backbone
    other_backbones: tuple[str, ...] = ()
    loss_types = DENOISING_LOSSES
    # RecBole infers the data format from loss_type and knows CE / BPR only; BCE, like
    # BPR, takes one sampled negative per positive.  (Without sampling it is unused.)
    input_type = InputType.PAIRWISE

    def __init__(self, config, dataset):
        super().__init__(config, dataset)
        self.objective = DenoisingObjective(
            config_value(config, "jacobian_gamma", 0.0),
            config_value(config, "jacobian_projections", 1),
        )

    def _backbone(self, name) -> str:
        if name in self.backbones:
            return name
        hint = ""
        if name in self.other_backbones:
            hint = f"; for a {name} backbone use --model={self.other_model}"
        raise ValueError(
            f"backbone={name!r} is unknown for {type(self).__name__}; choose from "
            f"{sorted(self.backbones)}{hint}"
        )

    def encoder_settings(self, config) -> dict:
        # Called by the base constructor: the backbone decides the token mixer.
        self.backbone = self._backbone(config_value(config, "backbone", self.default_backbone))
        self.token_mixer = self.backbones[self.backbone]
        settings = super().encoder_settings(config)
        operator = config_value(config, "attention_operator", "denoise")
        settings["attention_operator"] = operator
        settings["operator_options"] = component_options(config, ATTENTION_OPERATORS, operator)
        if self.token_mixer == "bsa":  # BSARec's beyond-self-attention layer, eq. 5-7
            settings.update(
                alpha=float(config_value(config, "alpha", 0.9)),
                c=_as_int(config_value(config, "c", 3), "c"),
                beta_type=config_value(config, "beta_type", "vector"),
                fusion_branches=("bsa",),
                fusion_weights=(1.0,),
            )
        return settings

    # --- training -------------------------------------------------------------------

    def calculate_loss(self, interaction):
        return self.objective(self.encoder, lambda: self.training_pass(interaction))

    def training_pass(self, interaction) -> DenoisingPass:
        raise NotImplementedError

    def run_encoder(self, item_seq: torch.Tensor):
        """Embedding and every block's output; returns (block inputs, block outputs)."""
        mask = build_attention_mask(item_seq, self.bidirectional)
        embedded = self.embedding(item_seq)
        outputs = self.encoder(embedded, mask, output_all_layers=True)
        return [embedded, *outputs[:-1]], outputs

    @staticmethod
    def pointwise_losses(loss_type, pos_score, neg_score=None, logits=None, targets=None):
        """Unreduced loss per positive: CE over ``logits``, BPR as RecBole's ``BPRLoss``,
        or BCE of eq. 4 (``-log s(pos) - log(1 - s(neg))``)."""
        if loss_type == "CE":
            return F.cross_entropy(logits, targets, reduction="none")
        if loss_type == "BPR":
            return -torch.log(1e-10 + torch.sigmoid(pos_score - neg_score))
        return F.softplus(-pos_score) + F.softplus(neg_score)

    # --- inspection -----------------------------------------------------------------

    def learned_masks(self) -> list[dict]:
        """Per attention layer with ``denoise`` masks, the deterministic inference mask
        (section 4.1.2) and what it prunes.

        ``mask`` / ``keep_probability``: ``(heads, n, n)`` tensors (one head unless
        ``mask_per_head``), row = query, column = key, laid out as in the paper's
        left-padded sequences: index ``n - 1`` is the most recent item, whose row is the
        one that predicts the next item (see ``layers.mask_alignment_index``); links the
        causal mask forbids are 0.  ``pruned_fraction``: share of the allowed links that
        the inference mask removes; ``prediction_row_pruned_fraction`` the same for row
        ``n - 1`` (which past items the prediction may use).
        """
        masks = []
        for layer, block in enumerate(self.encoder.blocks):
            operator = block.mixer.attention.operator
            if not isinstance(operator, DenoisingMaskAttention):
                continue
            with torch.no_grad():
                keep = operator.keep_probability().detach().cpu()
                mask = operator.inference_mask().detach().cpu()
            allowed = torch.ones_like(mask, dtype=torch.bool)
            if not self.bidirectional:
                allowed = allowed.tril()
            mask = mask * allowed
            kept = (mask > 0) & allowed
            masks.append(
                {
                    "layer": layer,
                    "mask": mask,
                    "keep_probability": keep * allowed,
                    "pruned_fraction": 1.0 - kept.sum().item() / allowed.sum().item(),
                    "prediction_row_pruned_fraction": 1.0
                    - kept[:, -1].sum().item() / allowed[:, -1].sum().item(),
                }
            )
        return masks

    def run_summary(self) -> dict:
        """Added to the run summary by ``quick_start.run``: the learned masks of the
        (best) model, JSON-ready, and their pruned fractions (also logged)."""
        masks = self.learned_masks()
        logger = logging.getLogger()
        for entry in masks:
            logger.info(
                f"Rec-Denoiser layer {entry['layer']}: pruned fraction "
                f"{entry['pruned_fraction']:.3f} (prediction row "
                f"{entry['prediction_row_pruned_fraction']:.3f})"
            )
        return {
            "learned_masks": [
                {
                    "layer": entry["layer"],
                    "pruned_fraction": entry["pruned_fraction"],
                    "prediction_row_pruned_fraction": entry["prediction_row_pruned_fraction"],
                    "mask": entry["mask"].numpy().round(4).tolist(),
                }
                for entry in masks
            ]
        }


class RecDenoiser(DenoisingRecommender):
    r"""Rec-Denoiser on a left-to-right SASRec backbone (Chen et al., RecSys 2022).

    - backbone: SASRec's embedding (eq. 1) and Transformer blocks (eq. 2-3) from the
      shared core, causal attention; ``backbone: BSARec`` uses BSARec's
      beyond-self-attention layer instead (``alpha``, ``c``, ``beta_type``);
    - differentiable masks ``M = A * Z`` (eq. 5) in every attention layer: ``attention_
      operator: denoise`` (``softmax`` gives the plain backbone, e.g. for the Jacobian
      regulariser alone); ``mask_per_head``, ``mask_sampling``, ``mask_init_prob``;
    - ``estimator``: ``ARM`` (eq. 10) or ``AR`` (eq. 11); sparsity ``sparsity_beta``
      (eq. 8); Jacobian regulariser ``jacobian_gamma`` with ``jacobian_projections``
      random projections per block (eq. 12); total loss eq. 13;
    - prediction ``<F_t, T_i>`` at the last position; loss CE, BPR or BCE (eq. 4).

    Which parameters get which gradients: see ``layers.DenoisingObjective``.  With all
    masks 1 (``Phi = +inf``) and ``sparsity_beta = jacobian_gamma = 0`` this is exactly
    SASRec (tests compare it with RecBole's SASRec on shared weights).
    """

    backbones = {"SASRec": "self_attention", "BSARec": "bsa"}
    default_backbone = "SASRec"
    other_model = "BERT4RecDenoiser"
    other_backbones = ("BERT4Rec",)

    def training_pass(self, interaction) -> DenoisingPass:
        item_seq = interaction[self.ITEM_SEQ]
        inputs, outputs = self.run_encoder(item_seq)
        seq_output = self.gather_indexes(outputs[-1], interaction[self.ITEM_SEQ_LEN] - 1)
        pos_items = interaction[self.POS_ITEM_ID]
        if self.loss_type == "CE":
            logits = seq_output @ self.item_embedding.weight.t()
            losses = self.pointwise_losses("CE", None, logits=logits, targets=pos_items)
        else:
            pos_score = (seq_output * self.item_embedding(pos_items)).sum(-1)
            neg_items = interaction[self.NEG_ITEM_ID]
            neg_score = (seq_output * self.item_embedding(neg_items)).sum(-1)
            losses = self.pointwise_losses(self.loss_type, pos_score, neg_score)
        return DenoisingPass(losses / losses.numel(), inputs, outputs, item_seq != 0)
