"""Contrastive pieces the papers' models share: same-target positives (DuoRec's
supervised augmentation, PolyRec eq. 16) and the NT-Xent loss over a batch of pairs
(DuoRec's InfoNCE)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from recbole_freq.utils.options import as_number

SIMILARITIES = ("dot", "cos")


def contrast_settings(tau, sim) -> tuple[float, str]:
    """``(temperature, similarity)`` of an NT-Xent from the ``tau`` and ``sim`` settings,
    or a ValueError naming the bad one."""
    if isinstance(tau, bool) or not as_number(tau) > 0:
        raise ValueError(f"tau={tau!r} must be a number > 0")
    if sim not in SIMILARITIES:
        raise ValueError(f"sim={sim!r} is unknown; choose from {list(SIMILARITIES)}")
    return as_number(tau), sim


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
    """Supervised positives of PolyRec eq. 16 and DuoRec's and FEARec's same-target
    augmentation: for each sequence, another *training* sequence with the same target
    item, drawn uniformly.

    The index is built once from the training dataset: its ``(target, sequence)`` rows
    grouped by target (``rows``, with ``group_start`` / ``group_size`` per item id).  A
    draw is then a few vectorised gathers per batch, on the model's device.  A sequence
    is never paired with itself, nor with an identical copy (another user with the same
    history and target).  ``weighting`` says how identical copies of *other* sequences
    count:

    - ``distinct`` (DuoRec, PolyRec): duplicates are removed from the groups, every
      distinct other sequence is equally likely; a draw picks ``r`` in ``[0, size - 1)``
      and, if member ``r`` is the anchor, takes the last member instead (when the anchor
      is the last member, ``r`` never hits it);
    - ``rows`` (FEARec): every training row counts, as RecBole's FEARec draws (rows of the
      target taken in random order until one's sequence differs from the anchor's): the
      groups keep their duplicates, identical rows side by side, and a draw is uniform
      over the group's rows outside the anchor's block of copies.  The anchor's block is
      found through a hash of ``(target, sequence)`` (two sums modulo ``2^31 - 1`` with
      random weights, unique over the training rows, checked when the index is built)
      and confirmed by comparing the sequences themselves, so that a sequence absent
      from the training rows has no block.

    ``found`` is False where the group holds no other sequence (the target occurs once,
    or only with this history).  Only the dataset given here is indexed; RecBole hands
    models the training split, so validation and test sequences never serve as
    positives.  The sequences are kept by reference (no copy on the CPU) and as
    non-persistent buffers, so they follow the model to its device and stay out of
    checkpoints.
    """

    WEIGHTINGS = ("distinct", "rows")
    _PRIME = 2**31 - 1

    def __init__(
        self, item_seq: torch.Tensor, item_seq_len: torch.Tensor, targets, n_items,
        weighting: str = "distinct",
    ):  # fmt: skip
        super().__init__()
        if weighting not in self.WEIGHTINGS:
            raise ValueError(f"weighting={weighting!r} is unknown; choose from {self.WEIGHTINGS}")
        self.weighting = weighting
        sequences = item_seq.cpu().numpy()
        target_ids = targets.cpu().numpy().astype(np.int64)
        keyed = pd.DataFrame(np.concatenate([target_ids[:, None], sequences], axis=1))
        if weighting == "distinct":
            kept = np.flatnonzero(~keyed.duplicated(keep="first").to_numpy())
            rows = kept[np.argsort(target_ids[kept], kind="stable")]
        else:
            copies = keyed.groupby(list(keyed.columns), sort=False).ngroup().to_numpy()
            rows = np.lexsort((copies, target_ids))  # by target, copies side by side
        size = np.bincount(target_ids[rows], minlength=n_items)
        start = np.concatenate([[0], np.cumsum(size)[:-1]])
        self.register_buffer("sequences", item_seq, persistent=False)
        self.register_buffer("lengths", item_seq_len, persistent=False)
        self.register_buffer("rows", torch.from_numpy(rows), persistent=False)
        self.register_buffer("group_start", torch.from_numpy(start), persistent=False)
        self.register_buffer("group_size", torch.from_numpy(size), persistent=False)
        if weighting == "rows":
            self._index_copies(item_seq, targets, copies[rows])
        # Share of training rows that have a supervised positive (reported in the log).
        self.coverage = float((size[target_ids] > 1).mean()) if len(target_ids) else 0.0

    def _index_copies(self, item_seq, targets, copies_in_order: np.ndarray) -> None:
        """Per block of identical rows (in ``rows`` order): its first position, its size,
        one of its rows and its hash key, sorted by key for ``searchsorted``."""
        positions = np.flatnonzero(np.r_[True, copies_in_order[1:] != copies_in_order[:-1]])
        block_size = np.diff(np.r_[positions, len(copies_in_order)])
        member = self.rows[torch.from_numpy(positions)]
        for salt in range(8):
            weights = torch.from_numpy(
                np.random.default_rng(salt).integers(1, self._PRIME, size=(2, item_seq.size(1) + 1))
            )
            self.register_buffer("hash_weights", weights, persistent=False)
            keys = self._keys(item_seq[member], targets[member].long())
            if keys.unique().numel() == keys.numel():
                break
        else:  # eight salts, each with a collision among distinct rows: not seen
            raise RuntimeError("could not hash the training sequences without collisions")
        order = keys.argsort()
        self.register_buffer("block_keys", keys[order], persistent=False)
        self.register_buffer("block_member", member[order], persistent=False)
        self.register_buffer("block_start", torch.from_numpy(positions)[order], persistent=False)
        self.register_buffer("block_size", torch.from_numpy(block_size)[order], persistent=False)

    def _keys(self, item_seq: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One int64 per row from two sums modulo a prime (no int64 overflow: each term
        is reduced below 2^31 before it is added)."""
        columns = torch.cat([item_seq.long(), targets[:, None]], dim=1) % self._PRIME
        halves = [
            ((columns * weights) % self._PRIME).sum(dim=1) % self._PRIME
            for weights in self.hash_weights
        ]
        return halves[0] * self._PRIME + halves[1]

    @classmethod
    def for_model(cls, model, dataset, weighting: str = "distinct") -> SameTargetSampler:
        """The sampler over the training rows of ``dataset`` for a sequential ``model``."""
        features = dataset.inter_feat
        return cls(
            features[model.ITEM_SEQ],
            features[model.ITEM_SEQ_LEN],
            features[model.ITEM_ID],
            model.n_items,
            weighting,
        )

    def extra_repr(self) -> str:
        if self.weighting == "distinct":
            return f"distinct_sequences={self.rows.numel()}, coverage={self.coverage:.3f}"
        return f"rows={self.rows.numel()}, weighting=rows, coverage={self.coverage:.3f}"

    def forward(self, item_seq: torch.Tensor, targets: torch.Tensor):
        """Training-row indices of the positives, and whether one was ``found``."""
        if item_seq.size(-1) != self.sequences.size(-1):
            raise ValueError(
                f"sequences of length {item_seq.size(-1)} cannot be matched against the "
                f"training sequences of length {self.sequences.size(-1)}"
            )
        if self.weighting == "rows":
            return self._draw_outside_copies(item_seq, targets)
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

    def _draw_outside_copies(self, item_seq, targets):
        size = self.group_size[targets]
        start = self.group_start[targets]
        keys = self._keys(item_seq, targets.long())
        block = torch.searchsorted(self.block_keys, keys).clamp(max=self.block_keys.numel() - 1)
        member = self.block_member[block]
        copies_here = (self.block_keys[block] == keys) & (self.sequences[member] == item_seq).all(
            dim=-1
        )
        copies = torch.where(copies_here, self.block_size[block], 0)
        before_copies = torch.where(copies_here, self.block_start[block] - start, size)
        choices = size - copies
        found = choices > 0
        draw = (torch.rand(targets.shape, device=targets.device) * choices).long()
        draw = draw.minimum(choices - 1).clamp_min(0)
        offset = draw + torch.where(draw >= before_copies, copies, 0)
        pick = (start + offset).clamp(0, self.rows.numel() - 1)
        return self.rows[pick], found

    def positives(self, item_seq, item_seq_len, targets):
        """Positive sequences and lengths; rows without one get their own sequence back,
        i.e. only the dropout view (as the DuoRec, PolyRec and FEARec code do)."""
        rows, found = self(item_seq, targets)
        sequences = torch.where(found[:, None], self.sequences[rows], item_seq)
        lengths = torch.where(found, self.lengths[rows], item_seq_len)
        return sequences, lengths, found


# --- CL4SRec's augmentation operators (Xie et al., ICDE 2022) ---------------
#
# Sequences are RecBole's: items left-aligned, padding (0) after ``length`` items.  Each
# operator works on a whole batch with torch's global generator, so a seeded run
# augments the same way every time.


def _uniform_int(high: torch.Tensor) -> torch.Tensor:
    """One uniform integer in ``[0, high]`` per entry."""
    return (torch.rand(high.shape, device=high.device) * (high + 1)).long().minimum(high)


def item_crop(item_seq, lengths, eta: float):
    """Item crop: a random contiguous sub-sequence of ``max(1, floor(eta * n))`` items,
    moved to the front.  (The DuoRec code's CL4SRec keeps ``floor(eta * n)``, which is 0
    for short sequences and leaves no item to encode; one item is kept instead.)"""
    keep = (lengths.double() * eta).floor().long().clamp(1, None).minimum(lengths)
    begin = _uniform_int(lengths - keep)
    positions = torch.arange(item_seq.size(1), device=item_seq.device)
    source = (begin[:, None] + positions).clamp(max=item_seq.size(1) - 1)
    cropped = item_seq.gather(1, source)
    return cropped.masked_fill(positions >= keep[:, None], 0), keep


def item_mask(item_seq, lengths, gamma: float, mask_token: int):
    """Item mask: ``floor(gamma * n)`` of the n items, drawn without replacement, replaced
    by the ``[mask]`` token."""
    count = (lengths.double() * gamma).floor().long()
    positions = torch.arange(item_seq.size(1), device=item_seq.device)
    real = positions < lengths[:, None]
    keys = torch.rand(item_seq.shape, device=item_seq.device).masked_fill(~real, 2.0)
    rank = keys.argsort(dim=1).argsort(dim=1)
    return item_seq.masked_fill(rank < count[:, None], mask_token), lengths


def item_reorder(item_seq, lengths, beta: float):
    """Item reorder: the items of a random contiguous window of ``floor(beta * n)`` items are
    shuffled; the rest stay in place."""
    count = (lengths.double() * beta).floor().long()
    begin = _uniform_int(lengths - count)
    positions = torch.arange(item_seq.size(1), device=item_seq.device)
    inside = (positions >= begin[:, None]) & (positions < (begin + count)[:, None])
    window_keys = begin[:, None] + torch.rand(item_seq.shape, device=item_seq.device) * count[
        :, None
    ].clamp(min=1)
    keys = torch.where(inside, window_keys, positions.to(window_keys.dtype).expand_as(window_keys))
    return item_seq.gather(1, keys.argsort(dim=1)), lengths


def two_augmented_views(item_seq, lengths, eta: float, gamma: float, beta: float, mask_token: int):
    """Two views per sequence, made by two different operators drawn uniformly from
    crop / mask / reorder (as the DuoRec code's CL4SRec draws them); a sequence of one
    item is its own view twice.  Returns ``((seq_1, len_1), (seq_2, len_2), operators)``
    with ``operators`` the ``(batch, 2)`` choices (0 crop, 1 mask, 2 reorder, -1 none)."""
    batch = item_seq.size(0)
    first = torch.randint(0, 3, (batch,), device=item_seq.device)
    second = (first + torch.randint(1, 3, (batch,), device=item_seq.device)) % 3
    operators = torch.stack([first, second], dim=1).masked_fill((lengths <= 1)[:, None], -1)
    candidates = [
        item_crop(item_seq, lengths, eta),
        item_mask(item_seq, lengths, gamma, mask_token),
        item_reorder(item_seq, lengths, beta),
    ]
    views = []
    for column in range(2):
        chosen_seq, chosen_len = item_seq.clone(), lengths.clone()
        for index, (sequence, length) in enumerate(candidates):
            rows = operators[:, column] == index
            chosen_seq[rows], chosen_len[rows] = sequence[rows], length[rows]
        views.append((chosen_seq, chosen_len))
    return views[0], views[1], operators
