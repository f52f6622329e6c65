"""Training and evaluation protocols: which rows a model trains on, what a test item is
ranked against, and when training stops.

A protocol is a named bundle of settings, ``properties/protocol/<name>.yaml``, chosen
with ``--protocol=<name>`` (``FreqConfig`` layers its file right above
``overall.yaml``, so model, dataset, paper and user settings still override it).  Its
pieces are independent settings, so each one's effect can be studied alone; they act
through RecBole's own classes (the split datasets, the evaluation sampler, the
``Trainer``) for every sequential model, RecBole's built-ins included:

``history_mask`` (full-sort ranking)
    ``none``: RecBole's sequential ranking, only the padding item is excluded.
    ``zero``: the BSARec / FMLP-Rec / S3-Rec authors' ranking (yehjin-shin/BSARec,
    ``src/trainers.py``, ``iteration``): the score of every item in the user's history
    before the target (validation: ``seq[:-2]``, test: ``seq[:-1]``) is set to 0, and the
    padding item keeps its model score (it is not excluded).
    ``exclude``: the same items are removed from the ranking (score minus infinity), as
    RecBole does for general (non-sequential) recommenders; padding excluded.
``train_rows``
    ``all_prefixes``: RecBole's augmentation, every prefix of the training part (inputs
    truncated to ``MAX_ITEM_LIST_LENGTH`` = n); a user's first item is never a target.
    ``window``: the BSARec authors' rows (``src/dataset.py``, ``RecDataset``): the targets
    are the last n items of the training part, ``seq[-(n+2):-2]``, and each input is cut
    at the window's start, so the first row predicts the window's first item from an
    all-padding input.  RecBole models read the output at ``item_length - 1``, so that
    input is one padding item (``item_length`` 1).
    ``last_n_all_positions``: SASRec's training (kang and McAuley's and Rec-Denoiser's
    code): one row per user, the last n items of the training part but its last as
    input and the next item as the target at every position, binary cross-entropy with
    one negative per position drawn among the items outside the user's training part
    (``ProtocolTrainer``; the model's own ``loss_type`` is not used).  Only for causal
    models (position t sees no later item), which is checked on the first batch.
``eval_negatives`` (sampled evaluation, e.g. ``uni100``)
    ``target_only``: RecBole's ``RepeatableSampler``, which excludes only the target, so
    an item of the user's history can be a negative.
    ``unseen``: negatives are items the user never interacted with (none of the user's
    interactions in the dataset), the SASRec / Rec-Denoiser protocol (Rec-Denoiser
    section 5.1.3).
``stopping_rule``
    ``recbole``: RecBole's ``early_stopping``: an epoch whose rounded validation score
    equals the best counts as an improvement (its checkpoint replaces the best), and
    training stops after ``stopping_step`` + 1 epochs without one.
    ``strict``: the BSARec authors' ``EarlyStopping`` (``src/utils.py``): only a higher
    unrounded score improves, and training stops after ``stopping_step`` epochs without
    one.

Validation and test inputs are the last n items before the target under every choice,
as in RecBole and in the authors' code.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import torch

PIECES = {
    "history_mask": ("none", "zero", "exclude"),
    "train_rows": ("all_prefixes", "window", "last_n_all_positions"),
    "eval_negatives": ("target_only", "unseen"),
    "stopping_rule": ("recbole", "strict"),
}
# The pieces that change the loaders (stopping_rule acts in the trainer only).
DATA_PIECES = ("history_mask", "train_rows", "eval_negatives")
DEFAULT_PROTOCOL = "recbole"
HISTORY_START = "protocol_history_start"
HISTORY_LENGTH = "protocol_history_length"
POSITION_TARGETS = "protocol_position_targets"


class ProtocolError(ValueError):
    """An unknown protocol, or a protocol setting with an unknown value."""


def protocol_dir() -> Path:
    from recbole_freq.config import properties_dir

    return properties_dir() / "protocol"


def protocol_names() -> list[str]:
    return sorted(path.stem for path in protocol_dir().glob("*.yaml"))


def protocol_file(name) -> str:
    """The property file of protocol ``name``; ``ProtocolError`` naming the protocols."""
    path = protocol_dir() / f"{name}.yaml"
    if not isinstance(name, str) or "/" in name or not path.is_file():
        raise ProtocolError(
            f"unknown protocol {name!r}; choose one of {', '.join(protocol_names())} "
            "(properties/protocol/)"
        )
    return str(path)


def protocol_defaults(name: str) -> dict:
    """The settings protocol ``name`` fixes (its property file)."""
    from recbole_freq.config import read_config_file

    return read_config_file(protocol_file(name))


def protocol_settings(config) -> dict:
    """The run's protocol name and pieces, validated: ``ProtocolError`` in one line."""
    name = config["protocol"] or DEFAULT_PROTOCOL
    protocol_file(name)
    settings = {"protocol": name}
    for piece, choices in PIECES.items():
        value = config[piece] if piece in config else choices[0]
        value = choices[0] if value is None else value
        if value not in choices:
            raise ProtocolError(f"{piece}={value!r} is unknown; choose one of {', '.join(choices)}")
        settings[piece] = value
    return settings


def _test_mode(config) -> str:
    mode = config["eval_args"]["mode"]
    return str(mode.get("test", mode) if isinstance(mode, dict) else mode)


def protocol_label(config) -> str:
    """The protocol a result was produced under: its name, plus every piece (and the
    test ranking mode) that differs from what the named protocol fixes, e.g.
    ``bsarec`` or ``bsarec+history_mask=none``."""
    settings = protocol_settings(config)
    name = settings["protocol"]
    fixed = protocol_defaults(name)
    changed = []
    for piece, choices in PIECES.items():
        if settings[piece] != fixed.get(piece, choices[0]):
            changed.append(f"{piece}={settings[piece]}")
    fixed_mode = (fixed.get("eval_args") or {}).get("mode", "full")
    fixed_mode = fixed_mode.get("test", "full") if isinstance(fixed_mode, dict) else fixed_mode
    if _test_mode(config) != fixed_mode:
        changed.append(f"mode={_test_mode(config)}")
    return "+".join([name, *changed])


def protocol_record(config) -> dict:
    """What every summary, checkpoint and search result keeps about its protocol."""
    return {"label": protocol_label(config), **protocol_settings(config)}


# --------------------------------------------------------------------------- data side


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
    from recbole.data.interaction import Interaction

    uid_field = train.uid_field
    suffix = train.config["LIST_SUFFIX"]
    length_field = train.config["ITEM_LIST_LENGTH_FIELD"]
    max_len = train.field2seqlen[histories.item_field + suffix]
    users = np.flatnonzero(histories.length > 0)
    train_len = histories.length[users] - valid_test_rows[users]
    keep = train_len > 0
    users, train_len = users[keep], train_len[keep]
    window = np.minimum(train_len, n)
    window_start = histories.start[users] + train_len - window
    rows = int(window.sum())
    row_user = np.repeat(users, window)
    first_row = np.concatenate([[0], np.cumsum(window)[:-1]])
    offset = np.arange(rows) - np.repeat(first_row, window)  # items before the target
    target = np.repeat(window_start, window) + offset
    input_start = np.repeat(window_start, window)
    columns = np.arange(max_len)
    in_input = columns[None, :] < offset[:, None]
    gather = np.where(in_input, input_start[:, None] + columns[None, :], 0)
    in_input_t = torch.from_numpy(in_input)
    new = {
        uid_field: torch.from_numpy(row_user).to(train.inter_feat[uid_field].dtype),
        # An empty input is one padding item: RecBole models read position length - 1.
        length_field: torch.from_numpy(np.maximum(offset, 1)).to(
            train.inter_feat[length_field].dtype
        ),
    }
    for field, flat in histories.values.items():
        new[field] = flat[torch.from_numpy(target)]
        lists = flat[torch.from_numpy(gather)]
        mask = in_input_t.view(in_input_t.shape + (1,) * (lists.dim() - 2))
        new[field + suffix] = torch.where(mask, lists, torch.zeros_like(lists))
    return Interaction(new)


def last_n_rows(train, histories: UserHistories, valid_test_rows: np.ndarray, n: int):
    """SASRec's training rows: per user with at least two training items, the input
    ``T[:-1][-n:]`` of its training part ``T`` and the targets ``T[1:][-n:]`` aligned
    with it (``POSITION_TARGETS``, zero-padded); the row's own target fields are those
    of ``T[-1]``.  Returns an ``Interaction``."""
    from recbole.data.interaction import Interaction

    uid_field = train.uid_field
    suffix = train.config["LIST_SUFFIX"]
    length_field = train.config["ITEM_LIST_LENGTH_FIELD"]
    max_len = train.field2seqlen[histories.item_field + suffix]
    users = np.flatnonzero(histories.length > 0)
    train_len = histories.length[users] - valid_test_rows[users]
    keep = train_len >= 2
    users, train_len = users[keep], train_len[keep]
    inputs = np.minimum(train_len - 1, n)
    first_input = histories.start[users] + train_len - 1 - inputs
    columns = np.arange(max_len)
    in_input = columns[None, :] < inputs[:, None]
    gather = np.where(in_input, first_input[:, None] + columns[None, :], 0)
    mask = torch.from_numpy(in_input)
    new = {
        uid_field: torch.from_numpy(users).to(train.inter_feat[uid_field].dtype),
        length_field: torch.from_numpy(inputs).to(train.inter_feat[length_field].dtype),
    }
    last = torch.from_numpy(histories.start[users] + train_len - 1)
    for field, flat in histories.values.items():
        new[field] = flat[last]
        lists = flat[torch.from_numpy(gather)]
        shaped = mask.view(mask.shape + (1,) * (lists.dim() - 2))
        new[field + suffix] = torch.where(shaped, lists, torch.zeros_like(lists))
    items = histories.items
    targets = items[torch.from_numpy(np.where(in_input, gather + 1, 0))]
    new[POSITION_TARGETS] = torch.where(mask, targets, torch.zeros_like(targets))
    return Interaction(new)


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
        used = np.empty(len(user_ids), dtype=object)
        for row, (user, item) in enumerate(zip(user_ids.tolist(), item_ids.tolist())):
            used[row] = self.user_items[user] | {item}
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


# ------------------------------------------------------------------------- trainer side


class _RecordingEvaluator:
    """RecBole's ``Evaluator`` that keeps the last top-k structure it evaluated (the
    per-user hits ``ProtocolTrainer.per_user_ranks`` reads)."""

    def __init__(self, evaluator):
        self.evaluator = evaluator
        self.last_topk = None

    def evaluate(self, struct):
        self.last_topk = struct["rec.topk"] if "rec.topk" in struct else None
        return self.evaluator.evaluate(struct)

    def __getattr__(self, name):
        return getattr(self.evaluator, name)


class _MetricSettings(dict):
    """The few settings RecBole's ``Evaluator`` reads, with more decimal places."""


class ProtocolTrainer:
    """Mixin over RecBole's trainer class of the model (``protocol_trainer``): the history
    mask in full-sort ranking and the stopping rule.  With RecBole's choices every method
    is RecBole's own."""

    def _init_protocol(self, config):
        self.evaluator = _RecordingEvaluator(self.evaluator)
        settings = protocol_settings(config)
        self.history_mask = settings["history_mask"]
        self.stopping_rule = settings["stopping_rule"]
        self.train_rows = settings["train_rows"]
        self._causality_checked = False
        if self.train_rows == "last_n_all_positions":
            check_plain_objective(self.model, config)
        self._eval_histories = None
        self._strict_best = None
        if self.stopping_rule == "strict":
            from recbole.evaluator import Evaluator

            # The authors stop after `patience` epochs without improvement; RecBole's
            # `early_stopping` after stopping_step + 1.
            self.stopping_step = max(int(config["stopping_step"]) - 1, 0)
            view = _MetricSettings(
                metrics=config["metrics"],
                topk=config["topk"],
                metric_decimal_place=12,
                tail_ratio=config["tail_ratio"],
            )
            self._unrounded_evaluator = Evaluator(view)

    def _train_epoch(self, train_data, epoch_idx, loss_func=None, show_progress=False):
        if self.train_rows == "last_n_all_positions" and loss_func is None:
            self._train_items = train_data._dataset
            loss_func = self.all_positions_loss
        return super()._train_epoch(
            train_data, epoch_idx, loss_func=loss_func, show_progress=show_progress
        )

    def all_positions_loss(self, interaction):
        """SASRec's loss (its ``model.py``; Rec-Denoiser eq. 4): at every position with a
        target, ``-log s(r_pos) - log(1 - s(r_neg))`` with one negative drawn among the
        items outside the user's training part, averaged over those positions."""
        model = self.model
        if not self._causality_checked:
            check_causal(model, interaction)
            self._causality_checked = True
        targets = interaction[POSITION_TARGETS]
        negatives = position_negatives(self._train_items, interaction, targets, model)
        output = all_position_output(model, interaction)
        return position_bce(output, targets, negatives, item_embedding_weight(model))

    def evaluate(self, eval_data, load_best_model=True, model_file=None, show_progress=False):
        self._eval_histories = getattr(eval_data._dataset, "protocol_histories", None)
        self._eval_data = eval_data
        return super().evaluate(eval_data, load_best_model, model_file, show_progress)

    def per_user_ranks(self) -> dict | None:
        """Each user's rank of the target in the last evaluation, from RecBole's own top-k
        structure (``rec.topk``): ``{"users": tokens, "rank": ranks, "topk": k}`` with
        rank 0 where the target is not in the top ``k`` (the largest cut-off); ``None``
        if no top-k metric was computed."""
        topk = self.evaluator.last_topk
        if topk is None:
            return None
        hits = topk[:, :-1].bool()
        first = hits.int().argmax(dim=1) + 1
        ranks = torch.where(hits.any(dim=1), first, torch.zeros_like(first))
        loader = self._eval_data
        dataset = loader._dataset
        if hasattr(loader, "uid_list") and getattr(loader, "neg_sample_num", 0):
            users = np.asarray(loader.uid_list)
        else:
            users = dataset.inter_feat[dataset.uid_field].numpy()
        if len(users) != len(ranks):
            return None
        tokens = dataset.id2token(dataset.uid_field, users)
        return {
            "users": [str(token) for token in tokens],
            "rank": ranks.tolist(),
            "topk": hits.size(1),
        }

    def _full_sort_batch_eval(self, batched_data):
        if self.history_mask == "none":
            return super()._full_sort_batch_eval(batched_data)
        interaction, _, positive_u, positive_i = batched_data
        histories = self._eval_histories
        if histories is None or HISTORY_LENGTH not in interaction:
            raise ProtocolError(
                f"history_mask={self.history_mask} needs loaders built by "
                "quick_start.load_splits (they carry each row's history)"
            )
        rows, items = history_index(interaction, histories)
        if self.history_mask == "exclude":
            return super()._full_sort_batch_eval(
                (interaction, (rows, items), positive_u, positive_i)
            )
        scores = self.model.full_sort_predict(interaction.to(self.device))
        scores = scores.view(-1, self.tot_item_num).clone()
        scores[rows.to(scores.device), items.to(scores.device)] = 0.0
        return interaction, scores, positive_u, positive_i

    def _valid_epoch(self, valid_data, show_progress=False):
        if self.stopping_rule != "strict":
            return super()._valid_epoch(valid_data, show_progress=show_progress)
        rounded, self.evaluator = self.evaluator, self._unrounded_evaluator
        try:
            score, result = super()._valid_epoch(valid_data, show_progress=show_progress)
        finally:
            self.evaluator = rounded
        previous = self.best_valid_score if self._strict_best is None else self._strict_best
        bigger = self.valid_metric_bigger
        if (score > previous) if bigger else (score < previous):
            self._strict_best = score
        else:
            self._strict_best = previous
        # RecBole's early_stopping, called next, counts `score >= best` as an improvement;
        # against the float just after the previous best that is exactly `score > best`.
        self.best_valid_score = math.nextafter(previous, math.inf if bigger else -math.inf)
        return score, result

    def fit(self, *args, **kwargs):
        best_score, best_result = super().fit(*args, **kwargs)
        if self.stopping_rule == "strict" and self._strict_best is not None:
            self.best_valid_score = best_score = self._strict_best
        return best_score, best_result


def history_index(interaction, histories: UserHistories):
    """``(rows, items)``: every item of each row's history before its target."""
    starts = interaction[HISTORY_START].long().cpu()
    lengths = interaction[HISTORY_LENGTH].long().cpu()
    rows = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    offsets = torch.cumsum(lengths, 0) - lengths
    within = torch.arange(int(lengths.sum())) - torch.repeat_interleave(offsets, lengths)
    items = histories.items[torch.repeat_interleave(starts, lengths) + within]
    return rows, items.long()


_TRAINER_CLASSES: dict[type, type] = {}


def protocol_trainer(config, model):
    """RecBole's trainer for ``model`` (``get_trainer``) with ``ProtocolTrainer`` mixed in."""
    from recbole.utils import get_trainer

    base = get_trainer(config["MODEL_TYPE"], config["model"])
    cls = _TRAINER_CLASSES.get(base)
    if cls is None:
        cls = type(base.__name__, (ProtocolTrainer, base), {"__module__": __name__})
        _TRAINER_CLASSES[base] = cls
    trainer = cls(config, model)
    trainer._init_protocol(config)
    return trainer


# ------------------------------------------------- SASRec-style training (all positions)


def check_plain_objective(model, config) -> None:
    """The per-position loss is computed here, not by the model: a model whose training
    objective adds more (Rec-Denoiser's masks and Jacobian term, PolyRec's contrastive
    term) would silently lose it, so it is refused."""
    objective = getattr(model, "objective", None)
    if objective is not None and type(objective).__name__ != "PlainObjective":
        raise ProtocolError(
            f"train_rows=last_n_all_positions trains with SASRec's per-position loss, "
            f"which does not apply {config['model']}'s {type(objective).__name__}; use "
            "train_rows=all_prefixes or window"
        )
    if float(config["cl_weight"] or 0) > 0:
        raise ProtocolError(
            f"train_rows=last_n_all_positions trains with SASRec's per-position loss, "
            f"which has no contrastive term (cl_weight={config['cl_weight']}); set "
            "cl_weight=0 or use train_rows=all_prefixes or window"
        )


def item_embedding_weight(model) -> torch.Tensor:
    embedding = getattr(model, "item_embedding", None)
    if not isinstance(embedding, torch.nn.Embedding):
        raise ProtocolError(
            f"train_rows=last_n_all_positions scores items with the model's item_embedding; "
            f"{type(model).__name__} has none"
        )
    return embedding.weight


def all_position_output(model, interaction) -> torch.Tensor:
    """``(batch, n, hidden)``: the model's output at every position.  Plugin models
    expose ``encode``; RecBole's sequential models read the last position with
    ``gather_indexes`` inside ``forward``, which is bypassed for this call."""
    item_seq = interaction[model.ITEM_SEQ]
    if callable(getattr(model, "encode", None)):
        return model.encode(item_seq)
    model.gather_indexes = lambda output, index: output
    try:
        output = model.forward(item_seq, interaction[model.ITEM_SEQ_LEN])
    finally:
        del model.gather_indexes
    if output.dim() != 3 or output.size(1) != item_seq.size(1):
        raise ProtocolError(
            f"train_rows=last_n_all_positions needs every position's output, and "
            f"{type(model).__name__}.forward does not give it (it does not read its last "
            "position with gather_indexes); use train_rows=all_prefixes or window"
        )
    return output


def check_causal(model, interaction) -> None:
    """Position t must not see later items, or training every position at once would
    show the model its targets: changing the last input item of a row must leave the
    outputs of the positions before it unchanged (checked once, without dropout)."""
    lengths = interaction[model.ITEM_SEQ_LEN]
    row = int(torch.argmax(lengths))
    last = int(lengths[row]) - 1
    if last < 1:
        return
    item_seq = interaction[model.ITEM_SEQ][row : row + 1].clone()
    changed = item_seq.clone()
    changed[0, last] = 1 + int(item_seq[0, last]) % (model.n_items - 1)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            single = interaction[row : row + 1]
            single.update(_interaction({model.ITEM_SEQ: item_seq}))
            before = all_position_output(model, single)[0, :last]
            single.update(_interaction({model.ITEM_SEQ: changed}))
            after = all_position_output(model, single)[0, :last]
    finally:
        model.train(was_training)
    if not torch.allclose(before, after, rtol=1e-4, atol=1e-5):
        raise ProtocolError(
            f"train_rows=last_n_all_positions needs a causal model (position t must not see "
            f"later items); {type(model).__name__}'s earlier outputs changed when a later "
            "item did (e.g. a frequency filter over the whole sequence); use "
            "train_rows=all_prefixes or window"
        )


def position_negatives(train_dataset, interaction, targets, model) -> torch.Tensor:
    """One negative per target position, uniform over the items outside the user's
    training part (SASRec's ``random_neq``), drawn with torch's global generator."""
    histories = train_dataset.protocol_histories
    train_length = train_dataset.protocol_train_length
    users = interaction[model.USER_ID].long().cpu().numpy()
    starts = torch.from_numpy(histories.start[users])
    lengths = torch.from_numpy(train_length[users])
    rows = torch.repeat_interleave(torch.arange(len(users)), lengths)
    offsets = torch.cumsum(lengths, 0) - lengths
    within = torch.arange(int(lengths.sum())) - torch.repeat_interleave(offsets, lengths)
    seen_items = histories.items[torch.repeat_interleave(starts, lengths) + within].long()
    seen = torch.zeros(len(users), model.n_items, dtype=torch.bool)
    seen[rows, seen_items] = True
    seen[:, 0] = True
    if seen.all(dim=1).any():
        raise ProtocolError(
            "train_rows=last_n_all_positions: a user's training part holds every item, "
            "leaving no negative to draw; use train_rows=all_prefixes or window"
        )
    targets_cpu = targets.cpu()
    negatives = torch.randint(1, model.n_items, targets_cpu.shape)
    redraw = seen.gather(1, negatives) & (targets_cpu > 0)
    while redraw.any():
        negatives[redraw] = torch.randint(1, model.n_items, (int(redraw.sum()),))
        redraw = seen.gather(1, negatives) & (targets_cpu > 0)
    return torch.where(targets_cpu > 0, negatives, torch.zeros_like(negatives)).to(targets.device)


def position_bce(output, targets, negatives, item_weight) -> torch.Tensor:
    """Mean over target positions of ``softplus(-r_pos) + softplus(r_neg)``, i.e.
    ``-log s(r_pos) - log(1 - s(r_neg))``."""
    import torch.nn.functional as F

    positions = targets > 0
    hidden = output[positions]
    positive = (hidden * item_weight[targets[positions]]).sum(-1)
    negative = (hidden * item_weight[negatives[positions]]).sum(-1)
    return (F.softplus(-positive) + F.softplus(negative)).mean()
