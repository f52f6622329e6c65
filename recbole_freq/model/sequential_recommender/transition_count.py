"""TransitionCount: what a lookup of observed successors achieves on a split, the count
baseline every comparison can stand beside."""

from __future__ import annotations

import torch
from recbole.model.abstract_recommender import SequentialRecommender
from recbole.utils import InputType

from recbole_freq.model.objectives import POSITION_TARGETS
from recbole_freq.utils.options import integer_option, setting


class TransitionCount(SequentialRecommender):
    r"""Scores each item by how often it followed the row's newest items in training.

    ``N(i, c)`` counts the transitions ``i -> c`` the training rows teach: a row's last
    input item followed by its target, and under per-position training rows
    (``train_rows: last_n_all_positions``) every input position followed by its
    position's target.  Every prefix a row (protocol ``recbole``) counts each consecutive
    pair of a user's training part exactly once.  Validation and test items are never
    counted: the counts are taken from the training split the model is built with.

    A row whose last ``k`` items (``count_last_k``; 1 = the newest item alone) are
    ``i_1 .. i_k`` scores candidate ``c`` as ``sum_j N(i_j, c)``, and ties are broken by
    popularity, ``P(c) = sum_i N(i, c)`` (how often ``c`` is a training target):
    ``score(c) = sum_j N(i_j, c) (P_max + 1) + P(c)``.  Both parts are whole numbers, so
    the order is exactly "most transitions first, then the more popular item".  An item
    never seen after the row's items is ranked by popularity alone.

    Nothing is learned by gradient: the counts are fixed when the model is built, and
    the trainer runs one epoch that only validates (``learns_by_gradient``).
    """

    input_type = InputType.POINTWISE
    # The trainer evaluates such a model once instead of training it (FreqTrainer).
    learns_by_gradient = False
    # It reads the rows as the data set stores them (RecBole's right-padded rows), so
    # any sequence_layout gives the same scores.
    reads_stored_rows = True

    def __init__(self, config, dataset):
        super().__init__(config, dataset)
        self.last_k = integer_option(
            setting(config, "count_last_k"),
            "count_last_k",
            1,
            "it is how many of the row's newest items vote for their successors, e.g. 1 or 5",
        )
        sources, targets = training_transitions(dataset, self.ITEM_SEQ, self.ITEM_SEQ_LEN)
        pairs, counts = torch.stack([sources, targets]).unique(dim=1, return_counts=True)
        self.register_buffer("transition_pairs", pairs)
        self.register_buffer("transition_counts", counts.to(torch.float64))
        popularity = torch.zeros(self.n_items, dtype=torch.float64)
        popularity.index_add_(0, pairs[1], counts.to(torch.float64))
        self.register_buffer("popularity", popularity)
        # RecBole's trainer builds an optimizer over the model's parameters, and an empty
        # list is refused; like RecBole's Pop, one parameter that no score depends on.
        self.fake_loss = torch.nn.Parameter(torch.zeros(1))
        self._successors = None

    def successors(self) -> torch.Tensor:
        """``N`` transposed, ``(n_items, n_items)`` sparse: row ``c``, column ``i`` holds
        ``N(i, c)``, so that ``N^T @ q`` sums the counts of the items marked in ``q``."""
        if self._successors is None or self._successors.device != self.transition_pairs.device:
            self._successors = torch.sparse_coo_tensor(
                self.transition_pairs.flip(0),
                self.transition_counts,
                (self.n_items, self.n_items),
                check_invariants=True,
            ).coalesce()
        return self._successors

    def recent_items(self, item_seq, item_seq_len) -> torch.Tensor:
        """``(batch, n_items)``: how many times each item is among the row's last
        ``count_last_k`` items (padding, item 0, is never a source)."""
        offsets = torch.arange(self.last_k, device=item_seq.device)
        positions = item_seq_len.long().unsqueeze(1) - 1 - offsets
        valid = positions >= 0
        items = item_seq.gather(1, positions.clamp(min=0)).masked_fill(~valid, 0)
        marked = torch.zeros(
            item_seq.size(0), self.n_items, dtype=torch.float64, device=items.device
        )
        marked.scatter_add_(1, items, valid.to(torch.float64))
        marked[:, 0] = 0
        return marked

    def forward(self, item_seq, item_seq_len) -> torch.Tensor:
        """Every item's score for each row, ``(batch, n_items)``, in float64 (exact)."""
        votes = torch.sparse.mm(self.successors(), self.recent_items(item_seq, item_seq_len).t())
        return votes.t() * (self.popularity.max() + 1) + self.popularity

    def calculate_loss(self, interaction):
        return self.fake_loss.sum()

    def full_sort_predict(self, interaction):
        return self.forward(interaction[self.ITEM_SEQ], interaction[self.ITEM_SEQ_LEN])

    def predict(self, interaction):
        scores = self.full_sort_predict(interaction)
        return scores.gather(1, interaction[self.ITEM_ID].long().unsqueeze(1)).squeeze(1)


def training_transitions(dataset, item_seq_field: str, item_seq_len_field: str):
    """``(sources, targets)`` of every transition the training rows of ``dataset`` teach
    (``TransitionCount``); pairs whose source is padding are left out."""
    features = dataset.inter_feat
    item_seq = features[item_seq_field]
    if POSITION_TARGETS in features.columns:
        position_targets = features[POSITION_TARGETS]
        keep = (position_targets != 0) & (item_seq != 0)
        return item_seq[keep], position_targets[keep]
    lengths = features[item_seq_len_field].long()
    last = item_seq.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    targets = features[dataset.iid_field]
    keep = (lengths > 0) & (last != 0)
    return last[keep], targets[keep]
