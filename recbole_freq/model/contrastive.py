"""Contrastive pieces the papers' models share: same-target positives (DuoRec's
supervised augmentation, PolyRec eq. 16) and the NT-Xent loss over a batch of pairs
(DuoRec's InfoNCE)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

SIMILARITIES = ("dot", "cos")


def nt_xent(
    first: torch.Tensor, second: torch.Tensor, temperature: float = 1.0, similarity: str = "dot"
):
    r"""NT-Xent over ``N`` pairs (SimCLR; DuoRec's contrastive regularisation, the
    ``info_nce`` of the DuoRec and BSARec authors' code).

    Row i of ``first`` and row i of ``second`` are a positive pair.  Each of the 2N
    representations is an anchor whose negatives are the other 2N - 2 (everything but
    itself and its partner), and the loss is the mean over the 2N anchors of

        -log( exp(sim(z_a, z_p) / tau) / sum_{k != a} exp(sim(z_a, z_k) / tau) )

    with ``sim`` the dot product or the cosine.  Same-target rows of the batch stay
    negatives, as in DuoRec.
    """
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity={similarity!r} is unknown; choose from {list(SIMILARITIES)}")
    n = first.size(0)
    z = torch.cat([first, second])
    if similarity == "cos":
        z = F.normalize(z, dim=-1)
    logits = (z @ z.t()) / temperature
    self_pairs = torch.eye(2 * n, dtype=torch.bool, device=z.device)
    logits = logits.masked_fill(self_pairs, float("-inf"))
    partners = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(logits, partners)


class SameTargetSampler(nn.Module):
    """Supervised positives of PolyRec eq. 16 and DuoRec's same-target augmentation: for
    each sequence, another
    *training* sequence with the same target item, drawn uniformly.

    The index is built once from the training dataset: its distinct ``(target,
    sequence)`` rows, grouped by target (``rows``, with ``group_start`` / ``group_size``
    per item id).  A draw is then a few vectorised gathers per batch, on the model's
    device.  A sequence is never paired with itself, nor with an identical copy (another
    user with the same history and target): duplicates are removed from the groups, and
    a draw lands uniformly on the *other* members of the anchor's group: pick ``r`` in
    ``[0, size - 1)``; if member ``r`` is the anchor, take the last member instead (when
    the anchor is the last member, ``r`` never hits it).  ``found`` is False where the
    group holds no other sequence (the target occurs once, or only with this history).

    Only the dataset given here is indexed; RecBole hands models the training split, so
    validation and test sequences never serve as positives.  The sequences are kept by
    reference (no copy on the CPU) and as non-persistent buffers, so they follow the
    model to its device and stay out of checkpoints.
    """

    def __init__(self, item_seq: torch.Tensor, item_seq_len: torch.Tensor, targets, n_items):
        super().__init__()
        sequences = item_seq.cpu().numpy()
        target_ids = targets.cpu().numpy().astype(np.int64)
        keyed = pd.DataFrame(np.concatenate([target_ids[:, None], sequences], axis=1))
        distinct = np.flatnonzero(~keyed.duplicated(keep="first").to_numpy())
        rows = distinct[np.argsort(target_ids[distinct], kind="stable")]
        size = np.bincount(target_ids[rows], minlength=n_items)
        start = np.concatenate([[0], np.cumsum(size)[:-1]])
        self.register_buffer("sequences", item_seq, persistent=False)
        self.register_buffer("lengths", item_seq_len, persistent=False)
        self.register_buffer("rows", torch.from_numpy(rows), persistent=False)
        self.register_buffer("group_start", torch.from_numpy(start), persistent=False)
        self.register_buffer("group_size", torch.from_numpy(size), persistent=False)
        # Share of training rows that have a supervised positive (reported in the log).
        self.coverage = float((size[target_ids] > 1).mean()) if len(target_ids) else 0.0

    def extra_repr(self) -> str:
        return f"distinct_sequences={self.rows.numel()}, coverage={self.coverage:.3f}"

    def forward(self, item_seq: torch.Tensor, targets: torch.Tensor):
        """Training-row indices of the positives, and whether one was ``found``."""
        if item_seq.size(-1) != self.sequences.size(-1):
            raise ValueError(
                f"sequences of length {item_seq.size(-1)} cannot be matched against the "
                f"training sequences of length {self.sequences.size(-1)}"
            )
        size = self.group_size[targets]
        start = self.group_start[targets]
        last_row = self.rows.numel() - 1
        choices = (size - 1).clamp_min(1)
        offset = (torch.rand(targets.shape, device=targets.device) * choices).long()
        first = (start + offset.minimum(choices - 1)).clamp(0, last_row)
        is_anchor = (self.sequences[self.rows[first]] == item_seq).all(dim=-1)
        pick = torch.where(is_anchor, start + size - 1, first).clamp(0, last_row)
        found = (size > 1) | ((size == 1) & ~is_anchor)
        return self.rows[pick], found

    def positives(self, item_seq, item_seq_len, targets):
        """Positive sequences and lengths; rows without one get their own sequence back,
        i.e. only the dropout view (as the DuoRec and PolyRec code do)."""
        rows, found = self(item_seq, targets)
        sequences = torch.where(found[:, None], self.sequences[rows], item_seq)
        lengths = torch.where(found, self.lengths[rows], item_seq_len)
        return sequences, lengths, found
