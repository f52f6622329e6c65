"""Training objectives: how a model's forward pass becomes the loss to minimise.

``PlainObjective`` (every model by default): the data loss of one forward pass plus the
``regularization_loss()`` of every encoder component.  ``DenoisingObjective``
(Rec-Denoiser eq. 13, picked when the encoder has ``denoise`` attention operators or
``jacobian_gamma > 0``): the ARM / AR mask estimators and the Jacobian regulariser
(eq. 12) around the same forward pass.  ``build_objective`` chooses.  ``pair_losses``:
the loss of a (positive, negative) score pair, for the models and the protocols.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from recbole_freq.model.denoising import DenoisingMaskAttention
from recbole_freq.utils.options import finite_non_negative

JACOBIAN_NORMALIZATIONS = ("entry", "position", "sequence")

# The field of a training row that holds a target at every position (SASRec's rows,
# ``train_rows: last_n_all_positions``, written by ``recbole_freq.protocol.rows``): the
# objectives and the sparsity scale count targets from it.
POSITION_TARGETS = "protocol_position_targets"


def pair_losses(kind: str, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """The loss of each (positive, negative) score pair: ``bce``, ``-log s(r_pos) - log(1 -
    s(r_neg))`` as ``softplus(-r_pos) + softplus(r_neg)`` (Rec-Denoiser eq. 4, SASRec's);
    ``bpr``, ``-log(1e-10 + s(r_pos - r_neg))`` (RecBole's ``BPRLoss``, the BSARec
    authors' GRU4Rec).  ``kind`` in either case (``BPR`` is a ``loss_type``)."""
    if kind.lower() == "bpr":
        return -torch.log(1e-10 + torch.sigmoid(positive - negative))
    return nn.functional.softplus(-positive) + nn.functional.softplus(negative)


def jacobian_norm_estimate(
    block_input: torch.Tensor,
    block_output: torch.Tensor,
    positions: torch.Tensor | None = None,
    n_projections: int = 1,
) -> torch.Tensor:
    """Per sequence, an unbiased estimate of ``||J||_F^2`` with ``J = d output / d input``
    of one Transformer block (Rec-Denoiser eq. 12), by random projections (Hutchinson;
    Hoffman et al. 2019): ``||J||_F^2 = E ||eta^T J||^2`` for ``eta ~ N(0, I)``, each
    ``eta^T J`` being one vector-Jacobian product, averaged over ``n_projections``.

    ``positions`` ``(batch, seq_len)`` restricts the rows of ``J`` to real positions'
    outputs (padding outputs are never used); the columns are all inputs.  The graph is
    kept (``create_graph``), so the estimate can be differentiated (double backward).
    Sequences are independent, so one product serves the whole batch.
    """
    if not block_input.requires_grad:
        raise ValueError("the Jacobian regulariser needs block inputs that require grad")
    weight = None if positions is None else positions[..., None].to(block_output.dtype)
    total = block_output.new_zeros(block_output.size(0))
    for _ in range(n_projections):
        eta = torch.randn_like(block_output)
        if weight is not None:
            eta = eta * weight
        (product,) = torch.autograd.grad(
            block_output, block_input, eta, create_graph=True, retain_graph=True
        )
        total = total + product.square().flatten(1).sum(-1)
    return total / n_projections


@dataclass
class DenoisingPass:
    """What one forward pass hands to ``DenoisingObjective``.

    ``contributions``: per-sequence loss terms ``(batch,)`` whose sum is the data loss
    (``loss_b / batch`` for a batch mean); ``block_inputs`` / ``block_outputs``: every
    Transformer block's input and output (only needed with the Jacobian regulariser);
    ``positions``: ``(batch, seq_len)``, True at real items.
    """

    contributions: torch.Tensor
    block_inputs: Sequence[torch.Tensor] = ()
    block_outputs: Sequence[torch.Tensor] = ()
    positions: torch.Tensor | None = None


def component_regularisation(encoder: nn.Module):
    """Sum of the ``regularization_loss()`` terms that encoder components define (e.g. the
    sparsity penalty of a ``denoise`` operator); 0 when none does."""
    terms = [
        module.regularization_loss()
        for module in encoder.modules()
        if hasattr(module, "regularization_loss")
    ]
    return sum(terms) if terms else 0.0


class PlainObjective:
    """One forward pass: its data loss plus every component's ``regularization_loss()``."""

    needs_block_states = False

    def __call__(self, encoder: nn.Module, run_pass: Callable[[], DenoisingPass]):
        result = run_pass()
        return result.contributions.sum() + component_regularisation(encoder)


def build_objective(
    encoder: nn.Module,
    jacobian_gamma: float = 0.0,
    jacobian_projections: int = 1,
    jacobian_normalization: str = "entry",
):
    """``DenoisingObjective`` when the encoder has ``denoise`` operators or the Jacobian
    regulariser is on, else ``PlainObjective``.  The Jacobian options are checked either
    way, so a bad value is refused for every model."""
    objective = DenoisingObjective(jacobian_gamma, jacobian_projections, jacobian_normalization)
    denoising = any(isinstance(m, DenoisingMaskAttention) for m in encoder.modules())
    return objective if denoising or objective.jacobian_gamma > 0 else PlainObjective()


class DenoisingObjective:
    """Rec-Denoiser's training loss, eq. 13: ``L + beta R_M + gamma R_J``, around any
    model's forward pass ``run_pass() -> DenoisingPass``.

    In training mode, with ``denoise`` operators in the encoder:

    1. one seed per step feeds a private generator from which every operator draws its
       uniform noise ``U`` (so the global RNG, hence dropout, is not disturbed);
    2. pass 1 with ``Z = 1[U < sigmoid(Phi)]``, with autograd: its loss ``L(Z)`` gives
       **all backbone parameters** (embeddings, projections, feed-forward, LayerNorms,
       output layers) their ordinary gradient, an unbiased estimate of the gradient of
       the expected loss since ``Z ~ Bernoulli(sigmoid(Phi))``;
    3. ARM only: pass 2 with the antithetic ``Z' = 1[U > sigmoid(-Phi)]`` under
       ``torch.no_grad()``, replaying pass 1's dropout draws (common random numbers): it
       contributes only its loss value, to the ``Phi`` estimate;
    4. ``Phi`` gets the ARM / AR estimate (``estimator_surrogate``, whose value is
       removed from the loss) plus the gradient of the scaled ``beta * sum sigmoid(Phi)``
       (``sparsity_penalty_scale``); nothing else reaches ``Phi`` (the masks are hard
       thresholds);
    5. ``gamma * R_J`` (``jacobian_gamma > 0``) on pass 1's blocks, mean over the batch,
       gives the backbone parameters a second gradient (double backward); ``Phi`` gets
       none from it (``Z`` is fixed within the pass);
    6. every other component's ``regularization_loss()`` is added, as in the base model.

    The returned value is ``L(Z) + beta R_M + gamma R_J (+ other regularisers)`` of pass 1.
    In evaluation mode, or without ``denoise`` operators (e.g. the Jacobian regulariser
    alone on softmax attention), it is one pass with the same terms.
    """

    def __init__(
        self,
        jacobian_gamma: float = 0.0,
        jacobian_projections: int = 1,
        jacobian_normalization: str = "entry",
    ):
        self.jacobian_gamma = finite_non_negative(
            jacobian_gamma, "jacobian_gamma", "it is gamma of Rec-Denoiser eq. 13, e.g. 0.001"
        )
        if jacobian_normalization not in JACOBIAN_NORMALIZATIONS:
            raise ValueError(
                f"jacobian_normalization={jacobian_normalization!r} is unknown; choose "
                "'entry' (mean over a sequence's real positions of ||J_i||_F^2 / d), "
                "'position' (mean of ||J_i||_F^2) or 'sequence' (their sum, the whole "
                "block Jacobian)"
            )
        self.jacobian_normalization = jacobian_normalization
        projections = jacobian_projections
        if isinstance(projections, bool) or not isinstance(projections, int) or projections < 1:
            raise ValueError(
                f"jacobian_projections={jacobian_projections!r} must be an integer >= 1: "
                "the number of random projections per block and step, e.g. 1"
            )
        self.jacobian_projections = projections

    @property
    def needs_block_states(self) -> bool:
        """The Jacobian regulariser needs every block's input and output."""
        return self.jacobian_gamma > 0

    def __call__(self, encoder: nn.Module, run_pass: Callable[[], DenoisingPass]):
        operators = [m for m in encoder.modules() if isinstance(m, DenoisingMaskAttention)]
        if not (encoder.training and operators):
            result = run_pass()
            return result.contributions.sum() + self._regularisers(encoder, result)
        estimators = {operator.estimator for operator in operators}
        if len(estimators) > 1:
            raise ValueError(f"all denoise operators must share one estimator, got {estimators}")
        device = operators[0].phi.device
        generator = torch.Generator(device=device)
        generator.manual_seed(int(torch.randint(0, 2**62, ()).item()))
        try:
            for operator in operators:
                operator.begin_step(generator)
            if all(operator.frozen for operator in operators):
                first, second = run_pass(), None  # nothing to estimate: one pass
            elif estimators == {"ARM"}:
                cuda = [] if device.type != "cuda" else [torch.device(device).index or 0]
                with torch.random.fork_rng(devices=cuda):
                    first = run_pass()
                for operator in operators:
                    operator.use_second_pass()
                with torch.no_grad():
                    second = run_pass().contributions
            else:
                first, second = run_pass(), None
            contributions = first.contributions.detach()
            surrogate = sum(
                operator.estimator_surrogate(contributions, second) for operator in operators
            )
            loss = first.contributions.sum()
            if torch.is_tensor(surrogate):
                loss = loss + (surrogate - surrogate.detach())
            return loss + self._regularisers(encoder, first)
        finally:
            for operator in operators:
                operator.end_step()

    def _regularisers(self, encoder: nn.Module, result: DenoisingPass):
        total = 0.0
        if self.jacobian_gamma > 0 and encoder.training and torch.is_grad_enabled():
            total = self.jacobian_gamma * self.jacobian_penalty(result)
        return total + component_regularisation(encoder)

    def jacobian_penalty(self, result: DenoisingPass) -> torch.Tensor:
        """``R_J = sum_l ||J^(l)||_F^2`` (eq. 12) per sequence, averaged over the batch.

        ``J^(l)`` stacks the rows ``J_i = d f_i / d x`` of the block's real output
        positions ``i`` (section 4.2), so its squared norm grows with the sequence's
        length and the width: 3,300 summed over both blocks for an initialised lastfm
        model (n = 50, d = 64), 40% of the CE loss at gamma 0.001, enough to stall
        training (measured); ``sequence`` keeps that sum.  ``position`` uses the mean of
        ``||J_i||_F^2`` over the real positions (the per-output bound of section 4.2, about
        95 there), which still grows with d: at gamma 0.001 it cost RecDenoiser a third of
        its NDCG@10 on lastfm under the paper's protocol (0.169 against 0.242 without it).
        ``entry`` (default) also divides by d, the mean over the outputs' coordinates, so
        ``R_J`` is about 1 per block for a block that passes its input through and gamma
        weighs it against the per-position loss whatever n and d; the paper's gamma 0.001
        then leaves accuracy where it is (0.2415, ``benchmarks/results/beta-sweep``).
        """
        if not result.block_inputs:
            raise ValueError("jacobian_gamma > 0 needs the blocks' inputs and outputs")
        penalty = 0.0
        for block_input, block_output in zip(result.block_inputs, result.block_outputs):
            estimate = jacobian_norm_estimate(
                block_input, block_output, result.positions, self.jacobian_projections
            )
            if self.jacobian_normalization != "sequence":
                if result.positions is None:
                    real = block_output.size(1)
                else:
                    real = result.positions.sum(-1).clamp(min=1).to(estimate.dtype)
                estimate = estimate / real
            if self.jacobian_normalization == "entry":
                estimate = estimate / block_output.size(-1)
            penalty = penalty + estimate.mean()
        return penalty
