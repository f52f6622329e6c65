"""PolyRec: polynomial attention for enhanced sequential recommendation (Ji et al.)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from recbole_freq.model.abstract_recommender import TransformerRecommender
from recbole_freq.model.contrastive import SameTargetSampler
from recbole_freq.model.objectives import DenoisingObjective
from recbole_freq.model.polynomial import ChebyshevAttention
from recbole_freq.utils.options import as_number, setting


class PolyRec(TransformerRecommender):
    r"""PolyRec on the shared Transformer core (paper section 3).

    - embedding layer: eq. 1-2 (the core's ``Dropout(LayerNorm(E + P))``);
    - polynomial attention ``sum_k w_k T_k(A) V`` with Chebyshev ``T_k``, eq. 10-12:
      ``attention_operator: chebyshev`` (``poly_order`` K, ``poly_per_head``), see
      ``polynomial.ChebyshevAttention``;
    - truncated residual connection, eq. 13: ``residual: fourier_truncated``
      (``trc_alpha``, ``trc_c``, ``trc_sublayers``), see ``polynomial.TruncatedResidual``;
    - prediction eq. 14 and cross-entropy over all items (eq. 15 names a binary
      cross-entropy but calls the loss cross-entropy on a softmax; we use the softmax
      CE as the core and DuoRec do);
    - contrastive regularisation, eq. 16-18: ``L = L_Rec + lambda L_CLReg``
      (``cl_weight`` lambda, ``cl_temperature``), see ``contrastive_loss``.

    Ablations of Table 3 are configuration: (a) w/o CL ``cl_weight: 0``, (b) w/o TRC
    ``residual: standard``, (c) w/o PA ``attention_operator: softmax``.
    ``order_contributions`` measures each order's share per layer (section 4.5).
    """

    token_mixer = "self_attention"
    extra_inputs_unavailable = (
        "its same-target views are other rows' items, encoded without timestamps or users"
    )

    def __init__(self, config, dataset):
        # Checked before the (slower) encoder build so that bad input fails fast.
        cl_weight = _non_negative(setting(config, "cl_weight"), "cl_weight")
        cl_temperature = _non_negative(
            setting(config, "cl_temperature"), "cl_temperature", strict=True
        )
        super().__init__(config, dataset)
        if cl_weight > 0 and isinstance(self.objective, DenoisingObjective):
            raise ValueError(
                "the denoising objective (attention_operator='denoise' or jacobian_gamma > "
                "0) needs the loss of every sequence of a forward pass, and PolyRec's "
                "contrastive loss mixes sequences of the batch; use cl_weight: 0 with it"
            )
        self.cl_weight, self.cl_temperature = cl_weight, cl_temperature
        self.positive_sampler = None
        if self.cl_weight > 0:
            self.positive_sampler = SameTargetSampler.for_model(self, dataset)

    def auxiliary_losses(self) -> list[str]:
        return [f"contrastive term (cl_weight={self.cl_weight})"] if self.positive_sampler else []

    def calculate_loss(self, interaction):
        item_seq = interaction[self.ITEM_SEQ]
        item_seq_len = interaction[self.ITEM_SEQ_LEN]
        targets = interaction[self.POS_ITEM_ID]
        if self.positive_sampler is None:
            # Without CL, the core's loss: denoising masks and the Jacobian regulariser
            # (Rec-Denoiser) then combine with PolyRec by configuration.
            return super().calculate_loss(interaction)
        positive_seq, positive_len, _ = self.positive_sampler.positives(
            item_seq, item_seq_len, targets
        )
        # One encoder pass over anchors and positives together: same result as two
        # passes (dropout masks are drawn per element), with larger, faster products.
        both = self.forward(
            torch.cat([item_seq, positive_seq]), torch.cat([item_seq_len, positive_len])
        )
        seq_output, positive_output = both.split(item_seq.size(0))
        loss = self.recommendation_loss(seq_output, interaction) + self.regularization_loss()
        return loss + self.cl_weight * self.contrastive_loss(seq_output, positive_output, targets)

    def recommendation_loss(self, seq_output, interaction):
        """Eq. 14-15: softmax cross-entropy over all items (or BPR, as in the core)."""
        pos_items = interaction[self.POS_ITEM_ID]
        if self.loss_type == "BPR":
            neg_items = interaction[self.NEG_ITEM_ID]
            pos_score = (seq_output * self.item_embedding(pos_items)).sum(-1)
            neg_score = (seq_output * self.item_embedding(neg_items)).sum(-1)
            return self.pointwise_losses("BPR", pos_score, neg_score).mean()
        logits = seq_output @ self.item_scores_weight.t()
        return self.pointwise_losses("CE", None, logits=logits, targets=pos_items).mean()

    def contrastive_loss(self, anchor, positive, targets):
        """InfoNCE of eq. 16-17 with in-batch negatives.

        ``anchor`` is the training pass's last-position output (eq. 17, a dropout view
        of the sequence), ``positive`` that of its same-target positive, encoded with
        fresh dropout (a dropout view of the positive; for rows without a supervised
        positive, a second dropout view of the sequence itself).  ``sim`` is the dot
        product (eq. 16) divided by ``cl_temperature`` (1 = the paper's plain dot
        product).  Row i's negatives are the other rows' positives, except those with
        the same target: they are positives of the same item, not negatives.
        """
        logits = anchor @ positive.t() / self.cl_temperature
        same_item = targets[:, None] == targets[None, :]
        same_item.fill_diagonal_(False)
        logits = logits.masked_fill(same_item, float("-inf"))
        labels = torch.arange(anchor.size(0), device=anchor.device)
        return F.cross_entropy(logits, labels)

    def polynomial_operators(self) -> list[ChebyshevAttention]:
        operators = [m for m in self.encoder.modules() if isinstance(m, ChebyshevAttention)]
        if not operators:
            raise ValueError(
                "this PolyRec uses no polynomial attention (attention_operator is not "
                "'chebyshev'); set attention_operator: chebyshev to inspect orders"
            )
        return operators

    def polynomial_coefficients(self) -> list[torch.Tensor]:
        """Per layer, the learned ``w`` of eq. 12: ``(1, K + 1)``, or ``(n_heads, K + 1)``
        with ``poly_per_head``."""
        return [op.coefficients.detach().cpu().clone() for op in self.polynomial_operators()]

    @torch.no_grad()
    def order_contributions(self, data, max_batches: int | None = None) -> torch.Tensor:
        """Magnitude of each order's contribution per layer (section 4.5, Fig. 6).

        ``data``: one batch (a RecBole ``Interaction``) or an iterable of them, e.g. a
        RecBole data loader.  Returns ``(n_layers, K + 1)``: entry ``[l, k]`` is the mean
        over real tokens of ``|| w_k T_k(A) V ||`` (all heads' values concatenated,
        before the output projection) in layer ``l``, measured in evaluation mode.
        Orders whose share stays small after training add little; a smaller K will do.
        """
        operators = self.polynomial_operators()
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        for operator in operators:
            operator.start_recording()
        try:
            for index, batch in enumerate(_batches(data)):
                if max_batches is not None and index >= max_batches:
                    break
                batch = batch.to(device)
                self.forward(batch[self.ITEM_SEQ], batch[self.ITEM_SEQ_LEN])
        finally:
            result = torch.stack([operator.stop_recording() for operator in operators])
            self.train(was_training)
        return result

    def analysis_report(self, batches) -> dict:
        """``--analyze``: each order's contribution per layer and the learned coefficients
        (section 4.5, Fig. 6)."""
        return {**super().analysis_report(batches), **_polyrec_analysis(self, batches)}


def _polyrec_analysis(model, batches) -> dict:
    try:
        contributions = model.order_contributions(batches)
    except ValueError:  # PolyRec without polynomial attention: nothing to show
        return {}
    return {
        "polyrec_order_contributions": contributions.tolist(),
        "polyrec_coefficients": [w.tolist() for w in model.polynomial_coefficients()],
    }


def _batches(data) -> Iterable:
    if hasattr(data, "interaction"):  # a single RecBole Interaction
        yield data
        return
    for batch in data:
        # Evaluation loaders yield (interaction, history, positive_u, positive_i).
        yield batch[0] if isinstance(batch, tuple) else batch


def _non_negative(value, name: str, strict: bool = False) -> float:
    number = as_number(value)
    if isinstance(value, bool) or not (number > 0 if strict else number >= 0):
        bound = "> 0" if strict else ">= 0 (0 turns contrastive learning off)"
        raise ValueError(f"{name}={value!r} must be a number {bound}")
    return number
