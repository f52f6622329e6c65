"""How a recommender trains Rec-Denoiser's attention masks (``denoise`` operators,
``model.denoising``): the scale of the sparsity penalty (Algorithm 1, eq. 8), the
masks' own learning rate, and what it reports of the learned masks.

Every ``TransformerRecommender`` has these, so ``attention_operator: denoise`` is one
config line away for any model; for a model without masks they do nothing.
"""

from __future__ import annotations

import logging
import math

from recbole_freq.model.denoising import (
    DenoisingMaskAttention,
    learned_masks,
    sparsity_penalty_scale,
)
from recbole_freq.model.objectives import POSITION_TARGETS
from recbole_freq.utils.options import as_number, setting


def trains_with_eq_4(config) -> bool:
    """Whether the run's protocol computes Rec-Denoiser's loss, eq. 4: binary
    cross-entropy with one negative per target (``train_loss: bce``, set or implied by
    the protocol's rows; ``FreqConfig.protocol_piece``)."""
    return config.protocol_piece("train_loss") == "bce"


def targets_per_row(dataset) -> float:
    """Mean number of targets of a training row: the per-position targets of SASRec's
    rows (``--protocol=sasrec``), else 1."""
    feat = dataset.inter_feat
    if POSITION_TARGETS not in feat.columns or len(dataset) == 0:
        return 1.0
    return float((feat[POSITION_TARGETS] != 0).sum(-1).float().mean())


class LearnedMaskTraining:
    """The mask-training half of ``TransformerRecommender`` (a mixin: ``self.encoder``
    and ``self.bidirectional`` are the recommender's)."""

    def scale_sparsity_penalties(self, config, dataset) -> None:
        """Put every ``denoise`` operator's eq. 8 penalty on the scale of the batch-mean
        loss (``sparsity_normalization``, see ``denoising.sparsity_penalty_scale``); N is the
        number of training rows of ``dataset``, the training split the model is built
        with.  ``auto`` (the default) is Algorithm 1, ``batch_targets`` (beta once per
        mini-batch against the loss summed over its targets), when the model trains with
        its backbone paper's per-target loss (``paper_loss_targets_per_row``: eq. 4's BCE
        under ``train_loss: bce``, e.g. ``--protocol=sasrec``; BERT4Rec's cloze loss), and
        ``train_examples`` otherwise (e.g. CE over all items at the last position)."""
        operators = [m for m in self.encoder.modules() if isinstance(m, DenoisingMaskAttention)]
        if not operators:
            return
        paper_targets = self.paper_loss_targets_per_row(config, dataset)
        normalization = setting(config, "sparsity_normalization")
        if normalization == "auto":
            normalization = "train_examples" if paper_targets is None else "batch_targets"
        self.sparsity_normalization = normalization
        scale = sparsity_penalty_scale(
            normalization,
            len(dataset),
            config["train_batch_size"],
            targets_per_row(dataset) if paper_targets is None else paper_targets,
        )
        self.sparsity_scale = scale
        for operator in operators:
            operator.sparsity_scale = scale

    def paper_loss_targets_per_row(self, config, dataset) -> float | None:
        """The mean number of targets a training row adds to the loss when the model
        trains with its backbone paper's per-target loss, on which Algorithm 1 adds
        ``beta R_M`` once per mini-batch; ``None`` for another loss.  Here: eq. 4's BCE
        (``train_loss: bce``, SASRec's per-position rows)."""
        return targets_per_row(dataset) if trains_with_eq_4(config) else None

    def read_mask_learning_rate(self, config) -> None:
        """``mask_learning_rate`` (None: ``learning_rate``), checked; see
        ``optimizer_parameter_groups``."""
        rate = setting(config, "mask_learning_rate")
        if rate is not None:
            number = as_number(rate)
            if isinstance(rate, bool) or not 0.0 < number < math.inf:
                raise ValueError(
                    f"mask_learning_rate={rate!r} must be a number > 0: the optimizer's "
                    "learning rate for the masks' Phi (unset: learning_rate), e.g. 0.1"
                )
            rate = number
        self.mask_learning_rate = rate

    def optimizer_parameter_groups(self) -> list[dict] | None:
        """Parameter groups for the trainer's optimizer (``protocol.trainer.FreqTrainer``), or None
        for one group at ``learning_rate``: with ``mask_learning_rate`` set, the ``denoise``
        masks' ``Phi`` get their own rate.  Why: under Adam a parameter moves about one
        learning rate per step whatever its gradient's scale, so at ``learning_rate``
        0.001 a mask needs more than 2,000 steps to fall from its initial keep probability
        0.9 (``Phi`` 2.2) to the pruning threshold 0.5 (``Phi`` 0), more than a small
        dataset trains to early stopping; the paper trains ``Phi`` and ``Theta`` jointly
        (Algorithm 1) and gives no rate for ``Phi``."""
        masks = [m.phi for m in self.encoder.modules() if isinstance(m, DenoisingMaskAttention)]
        if self.mask_learning_rate is None or not masks:
            return None
        chosen = {id(parameter) for parameter in masks}
        rest = [parameter for parameter in self.parameters() if id(parameter) not in chosen]
        return [{"params": rest}, {"params": masks, "lr": self.mask_learning_rate}]

    def learned_masks(self) -> list[dict]:
        """Per attention layer with ``denoise`` masks, the inference mask and what it
        prunes (``denoising.learned_masks``)."""
        return learned_masks(self.encoder, self.bidirectional)

    def epoch_report(self) -> dict:
        """Kept with each epoch of the run history (``protocol.trainer.FreqTrainer``) and
        logged, so pruning can be followed through training, not only at the best epoch:
        per layer with learned masks, the share of links the inference mask prunes and the
        mean keep probability; empty for a model without masks."""
        masks = self.learned_masks()
        if not masks:
            return {}
        return {
            "pruned_fraction": [round(entry["pruned_fraction"], 4) for entry in masks],
            "keep_probability_mean": [round(entry["keep_probability_mean"], 4) for entry in masks],
        }

    def analysis_report(self, batches) -> dict:
        """What ``--analyze`` shows of this model beyond the spectra and attention maps it
        measures itself (``jobs.analyze.measures``): the learned ``denoise`` masks, per
        layer (none for a model without them).  A paper's model adds its own (BSARec's
        beta, PolyRec's order contributions); ``batches`` are the evaluation batches
        analysed."""
        masks = self.learned_masks()
        if not masks:
            return {}
        return {
            "rec_denoiser_masks": [
                {
                    "layer": entry["layer"] + 1,
                    "pruned_fraction": float(entry["pruned_fraction"]),
                    "prediction_row_pruned_fraction": float(
                        entry["prediction_row_pruned_fraction"]
                    ),
                    "mask": entry["mask"].numpy().round(4).tolist(),
                }
                for entry in masks
            ]
        }

    def run_summary(self) -> dict:
        """Added to the run summary by ``quick_start.run``: the learned masks of the
        (best) model, JSON-ready, and their pruned fractions (also logged)."""
        masks = self.learned_masks()
        logger = logging.getLogger()
        for entry in masks:
            logger.info(
                f"denoising masks, layer {entry['layer']}: pruned fraction "
                f"{entry['pruned_fraction']:.3f} (prediction row "
                f"{entry['prediction_row_pruned_fraction']:.3f})"
            )
        if not masks:
            return {}
        return {
            "sparsity_normalization": self.sparsity_normalization,
            "sparsity_scale": self.sparsity_scale,  # beta's factor on the batch-mean loss
            "mask_learning_rate": self.mask_learning_rate,
            "learned_masks": [
                {
                    "layer": entry["layer"],
                    "pruned_fraction": entry["pruned_fraction"],
                    "pruned_fraction_per_head": entry["pruned_fraction_per_head"],
                    "prediction_row_pruned_fraction": entry["prediction_row_pruned_fraction"],
                    "keep_probability_mean": entry["keep_probability_mean"],
                    "mask": entry["mask"].numpy().round(4).tolist(),
                }
                for entry in masks
            ],
        }
