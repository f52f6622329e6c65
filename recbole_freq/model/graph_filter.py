"""TV-Rec's time-variant graph filter (NeurIPS 2025; code jeongwhanchoi/TV-Rec,
``model/tvrec.py``, built on the BSARec authors' code).

The paper is not among this project's papers: what is written here follows the authors'
``NVRecLayer``.  The sequence of ``L`` positions is padded with ``K - 1`` zeros at its end
and read as the signal on a directed cycle of ``N = L + K - 1`` nodes whose shift ``A``
moves every node's value one node on (``(A x)_t = x_{(t - 1) mod N}``).  Each node ``t``
has its own polynomial filter of order ``K`` in ``A``:

    y_t = sum_{k=0..K} h_{t,k} (A^k x)_t,    h_t = c_t B^,

with ``B^`` the ``M`` complex basis vectors of length ``K + 1`` (``basis``), each
normalised to unit length, and ``c_t`` the node's ``M`` real coefficients
(``coefficients``, of shape ``N x M``).  The authors evaluate it in the graph-Fourier basis
of ``A`` (``torch.linalg.eig``: ``y = Re(V ((H L^T) o V) V^-1 x)``, ``L`` the powers of the
eigenvalues) and, at inference, as the one real ``N x N`` matrix that product makes.  The
two are the same function: ``A^k x`` is real, so ``y_t = sum_k Re(h_{t,k}) x_{(t - k) mod
N}``, a convolution whose taps vary with the position.  Here it is that real ``L x L``
matrix, rebuilt from the weights at every call (training and inference alike; it costs
``L (K + 1) L`` multiply-adds), which the authors' spectral path and their inference
matrix equal to float precision (``tests/test_tvrec.py``).

Two properties of the authors' construction follow, and are kept: the imaginary parts of
``B`` act only through the normalisation and the orthogonality term; and the cycle wraps
once, whatever ``K``: the first position's tap of order ``K`` reads node ``(0 - K) mod N =
L - 1``, the newest position under the authors' left padding (every other tap reads the
position itself, an earlier one or a padding node).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from recbole_freq.model.frequency import FilterMixer

# The authors' basis and coefficients start as N(0, 1) draws scaled by this (and keep it:
# their init_weights touches only Linear, Embedding and LayerNorm).
INITIAL_SCALE = 1e-3


class TimeVariantGraphFilter(nn.Module):
    r"""``y = T x`` over the sequence axis, ``T`` the ``L x L`` matrix of the filter
    ``y_t = sum_k Re(h_{t,k}) x_{(t - k) mod N}`` (module docstring), ``h_t = c_t B^``.

    ``order`` is ``K`` (the authors fix 50), ``basis_size`` is ``M``; ``basis_size`` 0 is
    the authors' ``M = 0`` branch: a fixed identity basis, so every node learns its
    ``K + 1`` taps freely.  ``orthogonality_weight`` is the authors' ``reg_weight``:
    ``regularization_loss`` is ``weight * sum_{part in (Re B, Im B)} ||P P^T - I||_F^2``
    with the rows of each part normalised to unit length (their
    ``orthogonal_regularization``)."""

    def __init__(
        self,
        max_seq_length: int,
        order: int = 50,
        basis_size: int = 8,
        orthogonality_weight: float = 0.0,
    ):
        super().__init__()
        if isinstance(order, bool) or not isinstance(order, int) or order < 1:
            raise ValueError(f"filter_order={order!r} must be a whole number, 1 or more")
        if isinstance(basis_size, bool) or not isinstance(basis_size, int) or basis_size < 0:
            raise ValueError(
                f"basis_size={basis_size!r} must be a whole number, 0 (free taps) or more"
            )
        weight = float(orthogonality_weight)
        if not (math.isfinite(weight) and weight >= 0.0):
            raise ValueError(
                f"orthogonality_weight={orthogonality_weight!r} must be finite and >= 0 "
                "(0 turns the term off)"
            )
        self.length, self.order, self.basis_size = max_seq_length, order, basis_size
        self.orthogonality_weight = weight
        nodes = max_seq_length + order - 1
        if basis_size:
            self.basis = nn.Parameter(torch.randn(basis_size, order + 1, 2) * INITIAL_SCALE)
        else:
            identity = torch.eye(order + 1)
            self.register_buffer(
                "basis", torch.stack([identity, torch.zeros_like(identity)], dim=2), False
            )
        width = basis_size or order + 1
        self.coefficients = nn.Parameter(torch.randn(nodes, width) * INITIAL_SCALE)
        self.register_buffer("shifts", cyclic_shifts(max_seq_length, order), persistent=False)

    def taps(self) -> torch.Tensor:
        """``(L, K + 1)``: ``Re(h_{t,k})`` of the first ``L`` nodes (the others feed only
        the padding the authors cut off)."""
        real, imaginary = self.basis[..., 0], self.basis[..., 1]
        length = (real.square() + imaginary.square()).sum(dim=1, keepdim=True).sqrt()
        return self.coefficients[: self.length] @ (real / length)

    def matrix(self) -> torch.Tensor:
        """The ``L x L`` real matrix of the filter: ``T[t, s] = sum_{k: (t - k) mod N = s}
        Re(h_{t,k})`` (the authors' inference matrix, its rows and columns < ``L``)."""
        return torch.einsum("tk,tks->ts", self.taps(), self.shifts.to(self.coefficients.dtype))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.size(1) != self.length:
            raise ValueError(
                f"the graph filter is built for sequences of {self.length} positions "
                f"(MAX_ITEM_LIST_LENGTH), got {hidden.size(1)}"
            )
        return torch.matmul(self.matrix().to(hidden.dtype), hidden)

    def regularization_loss(self):
        if not (self.basis_size and self.orthogonality_weight):
            return 0.0  # a fixed basis or a weight of 0: nothing to learn from the term
        total = 0.0
        for part in (self.basis[..., 0], self.basis[..., 1]):
            rows = nn.functional.normalize(part, p=2, dim=1)
            gram = rows @ rows.T
            total = (
                total
                + (gram - torch.eye(len(rows), dtype=gram.dtype, device=gram.device)).square().sum()
            )
        return self.orthogonality_weight * total


def cyclic_shifts(length: int, order: int) -> torch.Tensor:
    """``(L, K + 1, L)`` zeros and ones: ``[t, k, s] = 1`` where node ``t``'s tap of order
    ``k`` reads position ``s``, i.e. ``(t - k) mod (L + K - 1) = s < L`` (the padding
    nodes ``>= L`` hold zeros)."""
    nodes = length + order - 1
    t = torch.arange(length)[:, None].expand(length, order + 1)
    k = torch.arange(order + 1)[None, :].expand(length, order + 1)
    source = (t - k) % nodes
    shifts = torch.zeros(length, order + 1, length)
    real = source < length
    shifts[t[real], k[real], source[real]] = 1.0
    return shifts


class GraphFilterMixer(FilterMixer):
    """TV-Rec's token mixer: the padded positions' states set to 0 (the authors' encoder
    does so before every block, so the residual carries the zeros too), then
    ``LayerNorm(x + Dropout(T x))``; the branch ``filter``.  The padding comes with every
    forward pass as the encoder's ``relations`` (``True`` where the item id is 0)."""

    def forward(self, hidden, mask, wanted, relations=None):
        if not (isinstance(relations, torch.Tensor) and relations.dtype == torch.bool):
            raise ValueError(
                "the graph filter mixer needs the rows' padding (item id 0) with every "
                "forward pass (the encoder's relations); build the model with TVRec"
            )
        hidden = hidden.masked_fill(relations[..., None], 0.0)
        return {"filter": self.residual(self.filter(hidden), hidden)}
