"""The data side of a protocol: each user's history rebuilt from RecBole's splits, the
training rows of ``train_rows``, the history fields of the evaluation rows
(``history_mask``) and the evaluation sampler of ``eval_negatives``."""

from __future__ import annotations

import copy

import numpy as np
import torch

from recbole_freq.model.objectives import POSITION_TARGETS
from recbole_freq.protocol.pieces import (
    DATA_PIECES,
    PIECES,
    ProtocolError,
    protocol_label,
    protocol_settings,
)

HISTORY_START = "protocol_history_start"
HISTORY_LENGTH = "protocol_history_length"


class UserHistories:
    """Every user's interactions in time order, rebuilt from RecBole's split datasets
    (a user's rows are contiguous and time-ordered in each split; a row's target is the
    next interaction after its input), as flat per-field arrays:
    ``values[field][start[u]:start[u] + length[u]]`` are user ``u``'s interactions."""

    def __init__(self, values: dict, start: np.ndarray, length: np.ndarray, item_field: str):
        self.values = values
        self.start = start
        self.length = length
        self.item_field = item_field

    @property
    def items(self) -> torch.Tensor:
        return self.values[self.item_field]

    @classmethod
    def from_splits(cls, splits):
        """``splits``: RecBole's (train, valid, test) datasets of one sequential dataset.
        Also returns, per split, each row's position in its user's history (the number
        of interactions before its target)."""
        first = splits[0]
        uid_field, item_field = first.uid_field, first.iid_field
        suffix = first.config["LIST_SUFFIX"]
        fields = [
            name
            for name in first.inter_feat.columns
            if name != uid_field and name + suffix in first.inter_feat.columns
        ]
        users = np.concatenate([split.inter_feat[uid_field].numpy() for split in splits])
        order = np.argsort(users, kind="stable")  # train, then valid, then test rows
        sorted_users = users[order]
        user_num = first.user_num
        rows_per_user = np.bincount(users, minlength=user_num)
        length = np.where(rows_per_user > 0, rows_per_user + 1, 0)
        start = np.concatenate([[0], np.cumsum(length)[:-1]])
        row_start = np.concatenate([[0], np.cumsum(rows_per_user)[:-1]])
        position = np.empty(len(users), dtype=np.int64)
        position[order] = np.arange(len(users)) - row_start[sorted_users]
        # A row at position p has its target at index p + 1 of its user's history.
        target_slot = start[users] + position + 1
        first_rows = order[row_start[np.unique(users)]] if len(users) else order
        values = {}
        for field in fields:
            column = torch.cat([split.inter_feat[field] for split in splits])
            lists = torch.cat([split.inter_feat[field + suffix] for split in splits])
            flat = column.new_zeros((int(length.sum()),) + tuple(column.shape[1:]))
            flat[torch.from_numpy(target_slot)] = column
            first_users = users[first_rows]
            flat[torch.from_numpy(start[first_users])] = lists[torch.from_numpy(first_rows), 0]
            values[field] = flat
        histories = cls(values, start, length, item_field)
        bounds = np.cumsum([0] + [len(split) for split in splits])
        positions = [position[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        return histories, positions

    def items_of(self, starts, lengths):
        """``(rows, items)``: for each row ``r``, the ``lengths[r]`` items of the flat
        history from position ``starts[r]`` (every item a row index selects)."""
        starts = torch.as_tensor(starts).long().cpu()
        lengths = torch.as_tensor(lengths).long().cpu()
        rows = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
        offsets = torch.cumsum(lengths, 0) - lengths
        within = torch.arange(int(lengths.sum())) - torch.repeat_interleave(offsets, lengths)
        return rows, self.items[torch.repeat_interleave(starts, lengths) + within].long()

    def item_sets(self) -> list[set]:
        """Per user id, the set of items of the user's history (computed once)."""
        if getattr(self, "_item_sets", None) is None:
            items = self.items.numpy()
            starts, lengths = self.start.tolist(), self.length.tolist()
            self._item_sets = [set(items[s : s + n].tolist()) for s, n in zip(starts, lengths)]
        return self._item_sets


def window_rows(train, histories: UserHistories, valid_test_rows: np.ndarray, n: int):
    """The BSARec authors' training rows (``src/dataset.py``): per user the last ``n``
    items of the training part, each predicted from the items before it inside that
    window.  ``valid_test_rows[u]``: how many of user ``u``'s interactions are validation
    or test targets (they follow the training part).  Returns an ``Interaction``."""
    users, train_len = _training_parts(histories, valid_test_rows, shortest=1)
    window = np.minimum(train_len, n)
    window_start = histories.start[users] + train_len - window
    first_row = np.concatenate([[0], np.cumsum(window)[:-1]])
    offset = np.arange(int(window.sum())) - np.repeat(first_row, window)  # items before
    input_start = np.repeat(window_start, window)
    # An empty input is one padding item: RecBole models read position length - 1.
    new, _ = _rows(
        train, histories, np.repeat(users, window), input_start, offset, input_start + offset
    )
    new[train.config["ITEM_LIST_LENGTH_FIELD"]].clamp_(min=1)
    return _interaction(new)


def last_n_rows(train, histories: UserHistories, valid_test_rows: np.ndarray, n: int):
    """SASRec's training rows: per user with at least two training items, the input
    ``T[:-1][-n:]`` of its training part ``T`` and the targets ``T[1:][-n:]`` aligned
    with it (``POSITION_TARGETS``, zero-padded); the row's own target fields are those
    of ``T[-1]``.  Returns an ``Interaction``."""
    users, train_len = _training_parts(histories, valid_test_rows, shortest=2)
    inputs = np.minimum(train_len - 1, n)
    last = histories.start[users] + train_len - 1
    new, gather = _rows(train, histories, users, last - inputs, inputs, last)
    in_input = gather >= 0
    targets = histories.items[torch.from_numpy(np.where(in_input, gather + 1, 0))]
    new[POSITION_TARGETS] = torch.where(
        torch.from_numpy(in_input), targets, torch.zeros_like(targets)
    )
    return _interaction(new)


def _training_parts(histories: UserHistories, valid_test_rows: np.ndarray, shortest: int):
    """``(users, training part lengths)`` of the users with at least ``shortest``
    training items."""
    users = np.flatnonzero(histories.length > 0)
    train_len = histories.length[users] - valid_test_rows[users]
    keep = train_len >= shortest
    return users[keep], train_len[keep]


def _rows(train, histories: UserHistories, users, input_start, input_length, target):
    """The columns of training rows whose input is ``input_length`` interactions from
    flat position ``input_start`` (right-padded) and whose target fields are those of
    flat position ``target``; also the flat position of every input slot (-1: padding)."""
    uid_field = train.uid_field
    suffix = train.config["LIST_SUFFIX"]
    length_field = train.config["ITEM_LIST_LENGTH_FIELD"]
    max_len = train.field2seqlen[histories.item_field + suffix]
    columns = np.arange(max_len)
    in_input = columns[None, :] < input_length[:, None]
    gather = np.where(in_input, input_start[:, None] + columns[None, :], -1)
    mask = torch.from_numpy(in_input)
    new = {
        uid_field: torch.from_numpy(users).to(train.inter_feat[uid_field].dtype),
        length_field: torch.from_numpy(input_length).to(train.inter_feat[length_field].dtype),
    }
    slots = torch.from_numpy(np.maximum(gather, 0))
    for field, flat in histories.values.items():
        new[field] = flat[torch.from_numpy(target)]
        lists = flat[slots]
        shaped = mask.view(mask.shape + (1,) * (lists.dim() - 2))
        new[field + suffix] = torch.where(shaped, lists, torch.zeros_like(lists))
    return new, gather


class UnseenSampler:
    """Stands in for RecBole's ``RepeatableSampler`` of an evaluation loader: negatives
    drawn from the same distribution, rejected while they are any item of the user's
    history (RecBole's own rejection loop, ``sample_by_key_ids``)."""

    def __init__(self, sampler, user_items: list[set]):
        self.sampler = copy.copy(sampler)
        self.user_items = user_items
        self.phase = sampler.phase

    def sample_by_user_ids(self, user_ids, item_ids, num):
        sampler = self.sampler
        # A row's target is one of its user's interactions, so it is in the set too.
        used = np.empty(len(user_ids), dtype=object)
        used[:] = [self.user_items[user] for user in user_ids.tolist()]
        sampler.used_ids = used
        return sampler.sample_by_key_ids(np.arange(len(user_ids)), num)

    def __getattr__(self, name):
        return getattr(self.sampler, name)


def use_protocol_negatives(config, loader) -> None:
    """Give a sampled evaluation loader the run's ``eval_negatives`` (its dataset must
    carry ``protocol_histories``, set by ``apply_protocol``); full-sort loaders and
    ``target_only`` keep RecBole's sampler."""
    if protocol_settings(config)["eval_negatives"] != "unseen":
        return
    if not getattr(loader, "neg_sample_num", 0) or isinstance(loader._sampler, UnseenSampler):
        return
    item_sets = loader._dataset.protocol_histories.item_sets()
    seen_most = max((len(items) for items in item_sets), default=0)
    catalogue = loader._dataset.item_num - 1  # id 0 is padding
    if seen_most >= catalogue:
        raise ProtocolError(
            f"eval_negatives=unseen: a user of {config['dataset']!r} interacted with all "
            f"{catalogue} items, leaving no unseen item to sample; use "
            "eval_negatives=target_only"
        )
    loader._sampler = UnseenSampler(loader._sampler, item_sets)


def check_prefix_rows(config, datasets, histories: UserHistories, positions) -> None:
    """A pre-split dataset (``benchmark_filename``) gives the rows themselves, and the
    users' histories are rebuilt from them as from RecBole's own split: that needs
    RecBole's rows, one per prefix of each user's sequence, in time order, each input the
    interactions before its target (the last ``n`` of them, ``n`` the longest input of
    the files).  ``ProtocolError`` naming the first row that is not."""
    first = datasets[0]
    list_field = first.iid_field + config["LIST_SUFFIX"]
    length_field = config["ITEM_LIST_LENGTH_FIELD"]
    longest = first.field2seqlen[list_field]
    for part, split, position in zip(config["benchmark_filename"], datasets, positions):
        feat = split.inter_feat
        users = feat[split.uid_field].numpy()
        expected = np.minimum(position + 1, longest)
        starts = histories.start[users] + position + 1 - expected
        rows, items = histories.items_of(starts, expected)
        within = torch.arange(len(rows)) - torch.repeat_interleave(
            torch.cumsum(torch.from_numpy(expected), 0) - torch.from_numpy(expected),
            torch.from_numpy(expected),
        )
        given = feat[list_field].long()
        wrong_item = torch.zeros(len(users), dtype=torch.bool)
        wrong_item[rows[given[rows, within] != items]] = True
        wrong = wrong_item.numpy() | (feat[length_field].numpy() != expected)
        if wrong.any():
            row = int(np.flatnonzero(wrong)[0])
            user = split.id2token(split.uid_field, users[row])
            raise ProtocolError(
                f"benchmark_filename: row {row + 1} of the {part!r} file (user {user}) is not "
                f"the prefix before its target that protocol {protocol_label(config)} needs "
                "(one row per prefix of each user's sequence, in time order, as RecBole's "
                "own split writes them); use protocol=recbole to train on the rows as given"
            )


def apply_protocol(config, dataset, splits):
    """The run's protocol applied to RecBole's loaders (``data_preparation``'s result):
    history fields on the evaluation rows, the training rows, the evaluation sampler.
    Returns the (train, valid, test) loaders; with every piece at RecBole's choice they
    are returned unchanged."""
    from recbole.data.utils import create_samplers, get_dataloader
    from recbole.utils import ModelType

    settings = protocol_settings(config)
    if all(settings[piece] == PIECES[piece][0] for piece in DATA_PIECES):
        return splits
    if config["MODEL_TYPE"] != ModelType.SEQUENTIAL:
        raise ProtocolError(
            f"protocol {protocol_label(config)}: history_mask, train_rows and eval_negatives "
            f"apply to sequential models; {config['model']} is not one (use protocol=recbole)"
        )
    train_data, valid_data, test_data = splits
    datasets = [loader._dataset for loader in splits]
    histories, positions = UserHistories.from_splits(datasets)
    if config["benchmark_filename"]:
        check_prefix_rows(config, datasets, histories, positions)
    for split, position in zip(datasets[1:], positions[1:]):
        users = split.inter_feat[split.uid_field].numpy()
        split.inter_feat.update(
            _interaction(
                {
                    HISTORY_START: torch.from_numpy(histories.start[users]),
                    HISTORY_LENGTH: torch.from_numpy(position + 1),
                }
            )
        )
        split.protocol_histories = histories
    for loader in (valid_data, test_data):
        use_protocol_negatives(config, loader)
    if settings["train_rows"] != "all_prefixes":
        user_num = dataset.user_num
        later = sum(
            np.bincount(split.inter_feat[split.uid_field].numpy(), minlength=user_num)
            for split in datasets[1:]
        )
        build = window_rows if settings["train_rows"] == "window" else last_n_rows
        rows = build(datasets[0], histories, later, config["MAX_ITEM_LIST_LENGTH"])
        train_dataset = datasets[0].copy(rows)
        # The user's training part, for the negatives of last_n_all_positions.
        train_dataset.protocol_histories = histories
        train_dataset.protocol_train_length = histories.length - later
        train_sampler = create_samplers(config, dataset, [train_dataset, *datasets[1:]])[0]
        train_data = get_dataloader(config, "train")(
            config, train_dataset, train_sampler, shuffle=config["shuffle"]
        )
    return train_data, valid_data, test_data


def _interaction(columns):
    from recbole.data.interaction import Interaction

    return Interaction(columns)
