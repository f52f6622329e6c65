"""Rec-Denoiser's trainable binary attention masks (Chen et al., "Denoising Self-Attentive
Sequential Recommendation", RecSys 2022, section 4): masks on the attention probabilities
(eq. 5) as an attention operator, learned with the unbiased ARM / AR estimators (eq.
10-11) under the sparsity penalty (eq. 8).  The training loss that drives them (eq. 13)
is ``objectives.DenoisingObjective``."""

from __future__ import annotations

import torch
from torch import nn

from recbole_freq.model.layers import Dropout, attend, attention_probabilities
from recbole_freq.utils.options import as_number, finite_non_negative

MASK_ESTIMATORS = ("ARM", "AR")
MASK_SAMPLING = ("batch", "sequence")
MASK_LEARNING = ("learned", "frozen")
SPARSITY_NORMALIZATIONS = ("train_examples", "batch_targets", "batch", "none")  # and auto


def sparsity_penalty_scale(
    normalization, train_examples: int, batch_size: int, targets_per_row: float = 1.0
) -> float:
    """Factor that puts eq. 8's ``beta * sum sigmoid(Phi)`` on the scale of a loss that is
    a *mean* over the mini-batch's targets (RecBole's losses and ours; SASRec's code
    averages its per-position BCE over the batch's target positions).

    Eq. 4 *sums* the BCE over sequences and positions, and eq. 13 adds ``beta R_M`` once;
    ``R_M`` depends on no input.  Divided by the count of summed targets that reads:

    - ``train_examples``: ``1 / N``, N the training rows of one epoch; eq. 13 over the
      whole training set, so beta weighs against the loss of every training row.  At the
      paper's beta the masks feel almost no pressure (1 / 49,281 on lastfm);
    - ``batch_targets``: ``1 / (batch_size * targets_per_row)``, Algorithm 1 read
      literally: per mini-batch, eq. 4's sum over the batch's targets plus ``beta R_M``
      (``targets_per_row``: the mean number of targets of a training row, e.g. 15.3 on
      average per user under --protocol=sasrec on lastfm, 1 for one-target rows, the
      expected scored masked positions for BERT4Rec's cloze rows);
    - ``batch``: ``1 / batch_size``, the same per training row rather than per target;
    - ``none``: 1, beta added as is to the batch-mean loss.  With masks that can move
      (``mask_learning_rate``), beta 0.001 already pruned every link on lastfm (measured).
    """
    if normalization not in SPARSITY_NORMALIZATIONS:
        raise ValueError(
            f"sparsity_normalization={normalization!r} is unknown; choose 'auto' "
            "(batch_targets under eq. 4's BCE, else train_examples), 'train_examples' "
            "(beta / N training rows), 'batch_targets' (beta / the targets of a mini-batch, "
            "Algorithm 1 on eq. 4's sum), 'batch' (beta / train_batch_size) or 'none' "
            "(beta added as is to the batch-mean loss)"
        )
    if normalization == "none":
        return 1.0
    count = train_examples if normalization == "train_examples" else batch_size
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(
            f"sparsity_normalization={normalization!r} needs a positive number of "
            f"{'training rows' if normalization == 'train_examples' else 'rows per batch'}, "
            f"got {count!r}"
        )
    if normalization == "batch_targets":
        if not targets_per_row > 0.0:
            raise ValueError(
                f"sparsity_normalization='batch_targets' needs a positive number of "
                f"targets per training row, got {targets_per_row!r}"
            )
        return 1.0 / (count * targets_per_row)
    return 1.0 / count


def _denoise_estimator(value) -> str:
    name = str(value).upper() if isinstance(value, str) else value
    if name not in MASK_ESTIMATORS:
        raise ValueError(
            f"estimator={value!r} is unknown; choose 'ARM' (Rec-Denoiser eq. 10: two "
            "antithetic forward passes, low variance) or 'AR' (eq. 11: one pass)"
        )
    return name


def mask_alignment_index(mask: torch.Tensor) -> torch.Tensor:
    """``(batch, seq_len)``: the row (and column) of the ``n x n`` mask parameters that
    each position of each sequence uses.

    Rec-Denoiser's ``Phi`` is indexed as in the authors' left-padded layout, where row
    ``n - 1`` is always the most recent item (the query that predicts the next one) and
    column ``n - 1 - k`` the k-th item before it.  A row whose newest item sits at
    position ``end - 1`` is shifted by ``n - end``: RecBole's right-padded rows by
    ``n - len``, rows in the authors' layout (``sequence_layout: left``) not at all;
    positions after the newest item (right padding, never attended to, never scored)
    reuse index ``n - 1``.  ``end`` is read off the boolean attention mask: its last
    query row allows exactly the real keys (every key for an all-padding row).
    """
    seq_len = mask.size(-1)
    slots = torch.arange(1, seq_len + 1, device=mask.device)
    ends = (mask[:, 0, -1, :] * slots).amax(-1)
    positions = torch.arange(seq_len, device=mask.device)
    return (positions + (seq_len - ends)[:, None]).clamp(max=seq_len - 1)


def align_masks(canonical: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Per-sequence view ``(batch, heads, n, n)`` of ``(heads, n, n)`` mask values laid out
    as in ``mask_alignment_index`` (a gather; its gradient scatters back)."""
    return canonical[:, index[:, :, None], index[:, None, :]].transpose(0, 1)


class DenoisingMaskAttention(nn.Module):
    """Attention with Rec-Denoiser's differentiable masks, eq. 5: ``M = A * Z``, ``M V``.

    ``A`` is the softmax attention (restricted to the causal / padding mask) and ``Z`` a
    binary mask with ``Z ~ Bernoulli(sigmoid(Phi))`` (eq. 8-9); ``Phi`` is one ``n x n``
    parameter per layer (``mask_per_head=False``, the paper) or per head, indexed as in
    ``mask_alignment_index``.  ``M`` is not renormalised (eq. 5); attention dropout acts
    on ``M``.  With ``KeyValueRelations`` (``--backbone=TiSASRec``) ``A`` is TiSASRec's
    time-interval-aware attention and ``M`` weighs its values with their relation terms.

    - Training: ``Z`` is drawn from uniform noise ``U``: ``1[U < sigmoid(Phi)]``, or for
      the second antithetic pass of ARM ``1[U > sigmoid(-Phi)]`` (eq. 10); ``U`` is one
      ``n x n`` draw per mini-batch and layer (``mask_sampling=batch``, Algorithm 1) or
      one per sequence (``sequence``: still unbiased, lower variance).  ``Z`` is a hard
      threshold, so no gradient reaches ``Phi`` through the forward pass; ``Phi`` learns
      from ``estimator_surrogate`` (run by ``DenoisingObjective``) and from the sparsity
      penalty ``regularization_loss() = sparsity_scale * sparsity_beta * sum
      sigmoid(Phi)`` (eq. 8; ``sparsity_scale`` from ``sparsity_penalty_scale``, set by
      the model, 1 for an operator on its own).
    - Inference (``eval()``): the deterministic mask ``sigmoid(Phi)`` where it exceeds 0.5
      and 0 elsewhere (section 4.1.2), see ``inference_mask``.

    ``sigmoid(Phi)`` starts at ``mask_init_prob`` (the paper gives no value; 0.9 starts
    close to the backbone).  ``mask_learning: frozen`` (an ablation, not in the paper)
    keeps ``Phi`` there: the same draws of ``Z`` and the same inference mask rule, but no
    estimator and no sparsity gradient, so training drops random links at the initial
    rate and learns nothing about which links are noise.  Outside ``DenoisingObjective`` a training forward pass draws
    fresh masks from the global RNG, but the base model's loss cannot train ``Phi``: the
    estimators need the loss of each pass, so ``regularization_loss`` refuses that use.
    """

    def __init__(
        self,
        max_seq_length: int,
        n_heads: int,
        dropout_prob: float,
        estimator: str = "ARM",
        sparsity_beta: float = 0.0,
        mask_per_head: bool = False,
        mask_sampling: str = "batch",
        mask_init_prob: float = 0.9,
        mask_learning: str = "learned",
    ):
        super().__init__()
        if mask_learning not in MASK_LEARNING:
            raise ValueError(
                f"mask_learning={mask_learning!r} is unknown; choose 'learned' (Phi trained "
                "by the ARM / AR estimator and the sparsity penalty, the paper) or 'frozen' "
                "(Phi kept at mask_init_prob: random link dropping, an ablation)"
            )
        self.frozen = mask_learning == "frozen"
        self.estimator = _denoise_estimator(estimator)
        self.sparsity_beta = finite_non_negative(
            sparsity_beta, "sparsity_beta", "it is beta of Rec-Denoiser eq. 8, e.g. 0.01"
        )
        if mask_per_head not in (True, False):
            raise ValueError(f"mask_per_head={mask_per_head!r} must be True or False")
        if mask_sampling not in MASK_SAMPLING:
            raise ValueError(
                f"mask_sampling={mask_sampling!r} is unknown; choose 'batch' (one mask per "
                "mini-batch and layer, Algorithm 1) or 'sequence' (one per sequence)"
            )
        init = as_number(mask_init_prob)
        if not 0.0 < init < 1.0:
            raise ValueError(
                f"mask_init_prob={mask_init_prob!r} must lie in (0, 1): the initial keep "
                "probability sigmoid(Phi), e.g. 0.9"
            )
        self.mask_sampling = mask_sampling
        self.sparsity_scale = 1.0
        heads = n_heads if mask_per_head else 1
        logit = torch.logit(torch.tensor(init, dtype=torch.float64)).item()
        self.phi = nn.Parameter(
            torch.full((heads, max_seq_length, max_seq_length), logit),
            requires_grad=not self.frozen,
        )
        self.dropout = Dropout(dropout_prob)
        self._generator: torch.Generator | None = None
        self._branch = "first"
        self._driven = False
        self._draw = None  # (U aligned per sequence, relevant entries, alignment index)

    def keep_probability(self) -> torch.Tensor:
        """``sigmoid(Phi)``, ``(heads, n, n)``: the probability of keeping each link."""
        return torch.sigmoid(self.phi)

    def inference_mask(self) -> torch.Tensor:
        """Deterministic mask of section 4.1.2: ``sigmoid(Phi)`` where ``> 0.5``, else 0."""
        keep = torch.sigmoid(self.phi)
        return keep * (keep > 0.5)

    def forward(self, query, key, value, mask, relations=None):
        probs = attention_probabilities(query, key, mask, relations)
        index = mask_alignment_index(mask)
        if self.training:
            keep = self._sample(mask, index)
        else:
            keep = align_masks(self.inference_mask(), index)
        return attend(self.dropout(probs * keep.to(probs.dtype)), value, relations)

    def _sample(self, mask: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        if self._branch == "second":
            if self._draw is None:
                raise RuntimeError("the second ARM pass found no draw of the first pass")
            uniform = self._draw[0]
            with torch.no_grad():
                return uniform > align_masks(torch.sigmoid(-self.phi), index)
        if self._driven and self._draw is not None:
            raise RuntimeError(
                "the encoder ran twice in one DenoisingObjective pass; each pass must run "
                "it once so that every mask draw is paired with its loss"
            )
        batch, heads, seq_len = mask.size(0), self.phi.size(0), self.phi.size(-1)
        device = self.phi.device
        if self.mask_sampling == "sequence":
            shape = (batch, heads, seq_len, seq_len)
            uniform = torch.rand(shape, generator=self._generator, device=device)
        else:
            shape = (heads, seq_len, seq_len)
            uniform = torch.rand(shape, generator=self._generator, device=device)
            uniform = align_masks(uniform, index)
        if self._driven:
            # Links whose Z cannot change the loss: keys the mask hides, padding queries.
            real = mask[:, 0, -1, :]
            relevant = mask.expand(batch, 1, seq_len, seq_len) & real[:, None, :, None]
            self._draw = (uniform, relevant, index)
        with torch.no_grad():
            return uniform < align_masks(torch.sigmoid(self.phi), index)

    # Hooks for DenoisingObjective.
    def begin_step(self, generator: torch.Generator | None) -> None:
        self._generator, self._branch, self._driven, self._draw = generator, "first", True, None

    def use_second_pass(self) -> None:
        self._branch = "second"

    def end_step(self) -> None:
        self._generator, self._branch, self._driven, self._draw = None, "first", False, None

    def estimator_surrogate(self, first: torch.Tensor, second: torch.Tensor | None = None):
        """Scalar whose gradient with respect to ``Phi`` is the ARM (eq. 10) or AR (eq. 11)
        estimate of the gradient of the expected loss, and which has no other gradient.

        ``first`` / ``second``: per-sequence loss terms (summing to the batch loss) of the
        pass with ``Z = 1[U < sigmoid(Phi)]`` / ``Z = 1[U > sigmoid(-Phi)]``.  Per sequence
        ``b`` the estimate is ``(second_b - first_b) (U_b - 1/2)`` (ARM) or
        ``first_b (1 - 2 U_b)`` (AR), summed over the batch.  Entries the loss cannot
        depend on (links hidden by the causal / padding mask, queries at padding) get
        exactly 0, their true gradient, instead of zero-mean noise.
        """
        if self._draw is None or self.frozen:
            return 0.0  # the operator did not run (e.g. BSARec with alpha = 1), or Phi is fixed
        uniform, relevant, index = self._draw
        if self.estimator == "ARM":
            if second is None:
                raise ValueError("the ARM estimator needs the losses of both passes")
            weight = (second - first).view(-1, 1, 1, 1) * (uniform - 0.5)
        else:
            weight = first.view(-1, 1, 1, 1) * (1.0 - 2.0 * uniform)
        weight = (weight * relevant).detach()
        return (align_masks(self.phi, index) * weight).sum()

    def regularization_loss(self):
        """Sparsity penalty of eq. 8, ``sparsity_scale * sparsity_beta * sum sigmoid(Phi)``."""
        if self.training and not self._driven:
            raise ValueError(
                "attention_operator='denoise' learns its masks with the ARM / AR estimator, "
                "which needs the loss of every forward pass, and this model's "
                "calculate_loss does not train through objectives.DenoisingObjective"
            )
        if self.sparsity_beta == 0.0 or self.frozen:
            return 0.0
        return self.sparsity_scale * self.sparsity_beta * torch.sigmoid(self.phi).sum()

    def extra_repr(self) -> str:
        heads, seq_len = self.phi.size(0), self.phi.size(-1)
        return (
            f"estimator={self.estimator}, masks={heads}x{seq_len}x{seq_len}, "
            f"sparsity_beta={self.sparsity_beta}, sparsity_scale={self.sparsity_scale:.3g}, "
            f"mask_sampling={self.mask_sampling}" + (", frozen" if self.frozen else "")
        )


def learned_masks(encoder: nn.Module, bidirectional: bool) -> list[dict]:
    """Per attention layer with ``denoise`` masks, the deterministic inference mask
    (section 4.1.2) and what it prunes.

    ``mask`` / ``keep_probability``: ``(heads, n, n)`` tensors (one head unless
    ``mask_per_head``), row = query, column = key, laid out as in the paper's
    left-padded sequences: index ``n - 1`` is the most recent item, whose row is the
    one that predicts the next item (see ``mask_alignment_index``); links the
    causal mask forbids are 0.  ``pruned_fraction``: share of the allowed links that
    the inference mask removes (``pruned_fraction_per_head``: per head's mask, one
    entry unless ``mask_per_head``); ``prediction_row_pruned_fraction`` the same for row
    ``n - 1`` (which past items the prediction may use); ``keep_probability_mean``: the
    mean ``sigmoid(Phi)`` of the allowed links (how far the masks are from the threshold).
    """
    masks = []
    for layer, block in enumerate(encoder.blocks):
        attention = getattr(block.mixer, "attention", None)  # a filter mixer has none
        operator = getattr(attention, "operator", None)
        if not isinstance(operator, DenoisingMaskAttention):
            continue
        with torch.no_grad():
            keep = operator.keep_probability().detach().cpu()
            mask = operator.inference_mask().detach().cpu()
        allowed = torch.ones_like(mask, dtype=torch.bool)
        if not bidirectional:
            allowed = allowed.tril()
        mask = mask * allowed
        kept = (mask > 0) & allowed
        per_head = 1.0 - kept.flatten(1).sum(1) / allowed.flatten(1).sum(1)
        masks.append(
            {
                "layer": layer,
                "mask": mask,
                "keep_probability": keep * allowed,
                "pruned_fraction": 1.0 - kept.sum().item() / allowed.sum().item(),
                "pruned_fraction_per_head": [float(value) for value in per_head],
                "prediction_row_pruned_fraction": 1.0
                - kept[:, -1].sum().item() / allowed[:, -1].sum().item(),
                "keep_probability_mean": (keep * allowed).sum().item() / allowed.sum().item(),
            }
        )
    return masks
