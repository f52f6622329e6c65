"""Top-k recommendations from a trained checkpoint: ``run_recbole_freq.py --recommend``.

Users and items are RecBole's external tokens (the ids of the ``.inter`` file), never its
internal ids.  The checkpoint is loaded safely (``recbole_freq.checkpoint.loader``) and its
dataset rebuilt from the checkpoint's config, so the model sees the sequences it was
trained to read.

What the model reads (``context``):

- ``next`` (default): each user's whole known history, i.e. the last
  ``MAX_ITEM_LIST_LENGTH`` items of all their interactions in the dataset (training,
  validation and test parts): the recommendation for the item after the last one.
- ``test``: the input of RecBole's test evaluation, i.e. the history before each user's
  held-out test item (the test split's sequence).  Useful to inspect what the evaluation
  ranked; ``--keep_history`` then gives exactly RecBole's
  ``recbole.utils.case_study.full_sort_topk`` on the test loader.

Excluded from the ranking: the padding item and, unless ``keep_history``, every item in
the user's history as read by the context (for ``next`` all items the user interacted
with, for ``test`` all before the test item).  RecBole's own full-sort evaluation of
sequential models excludes only padding (``full_sort_scores`` passes no history for
them), so ``keep_history`` is how to reproduce it.  Where fewer than ``k`` items remain,
fewer are returned.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import torch
from recbole.data.interaction import Interaction

from recbole_freq.utils.command import RECOMMEND_CONTEXTS, RECOMMEND_FORMATS
from recbole_freq.utils.inputs import InputFileError, read_input_text

CONTEXTS = RECOMMEND_CONTEXTS
FORMATS = RECOMMEND_FORMATS


class UnknownUserError(ValueError):
    pass


def parse_user_tokens(users: str) -> list[str]:
    """``users``: an existing file (one token per line; ``#`` starts a comment, at the
    start of a line or after a space) or comma-separated tokens."""
    if os.path.isfile(users):
        try:
            lines = read_input_text(users, "--users file", encoding="utf-8-sig").splitlines()
        except (OSError, InputFileError) as error:
            raise ValueError(f"--users file {users}: cannot be read ({error})") from error
        tokens = [re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip() for line in lines]
        tokens = [token for token in tokens if token]
    else:
        tokens = [token.strip() for token in users.split(",") if token.strip()]
    if not tokens:
        raise ValueError(f"--users {users!r} names no user")
    return list(dict.fromkeys(tokens))  # drop repeats, keep order


class RawIds:
    """The raw ids behind the re-mapped tokens of a dataset that dataset_prep prepared
    from a raw log (``<dataset>.idmap.json``: token ``k`` is ``user[k - 1]``)."""

    def __init__(self, path: Path, dataset):
        try:
            loaded = json.loads(read_input_text(path, "id map"))
            users, items = loaded["user"], loaded["item"]
            if not all(isinstance(v, list) for v in (users, items)):
                raise TypeError("user and item must be lists")
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path} is not a dataset_prep id map ({error})") from error
        self.path = path
        self.raw_user = {str(k): str(v) for k, v in enumerate(users, 1)}
        self.raw_item = {str(k): str(v) for k, v in enumerate(items, 1)}
        self.user_token = {raw: token for token, raw in self.raw_user.items()}
        missing = [
            token
            for field, known in (
                (dataset.uid_field, self.raw_user),
                (dataset.iid_field, self.raw_item),
            )
            for token in dataset.field2id_token[field][1:]
            if str(token) not in known
        ]
        if missing:
            raise ValueError(
                f"{path} does not describe dataset {dataset.dataset_name!r}: token "
                f"{missing[0]!r} has no raw id (prepare the dataset again)"
            )


def known_users(dataset, given: list[str], raw_ids: RawIds | None, from_file=None) -> list[str]:
    """The tokens of the ``given`` users the dataset knows.  A batch never fails because
    of some unknown users: they are skipped and listed in one warning line; only a batch
    with no known user is an error.  Users read ``from_file`` are counted, never quoted:
    the file may hold anything (``--users /etc/shadow``)."""
    if raw_ids is not None:
        unknown = [user for user in given if user not in raw_ids.user_token]
        tokens = [raw_ids.user_token[user] for user in given if user in raw_ids.user_token]
        kind = f"user id(s) (raw ids of the prepared log, mapped through {raw_ids.path.name})"
    else:
        mapping = dataset.field2token_id[dataset.uid_field]
        unknown = [user for user in given if mapping.get(user, 0) == 0]
        tokens = [user for user in given if mapping.get(user, 0) != 0]
        kind = "user token(s) (the user ids of the .inter file)"
    if not unknown:
        return tokens
    if from_file is not None:
        shown, more = f"the lines of {from_file} are not quoted", ""
    else:
        shown = ", ".join(repr(user) for user in unknown[:10])
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
    if not tokens:
        raise UnknownUserError(
            f"all {len(unknown)} {kind} are unknown to dataset {dataset.dataset_name!r}: "
            f"{shown}{more}"
        )
    print(
        f"warning: skipped {len(unknown)} unknown {kind}: {shown}{more}; recommending for "
        f"the other {len(tokens)}",
        file=sys.stderr,
    )
    return tokens


def load_raw_ids(config, dataset, ids: str) -> RawIds | None:
    """The id map to use for ``--ids`` (``auto``: the dataset's, if it has one)."""
    path = Path(config["data_path"]) / f"{config['dataset']}.idmap.json"
    if ids == "tokens" or (ids == "auto" and not path.is_file()):
        return None
    if not path.is_file():
        raise ValueError(
            f"--ids raw: dataset {config['dataset']!r} has no id map ({path}); its tokens "
            "are the raw ids already"
        )
    return RawIds(path, dataset)


def user_ids(dataset, tokens: list[str]) -> np.ndarray:
    """Internal ids of user tokens; ``UnknownUserError`` listing the unknown ones."""
    mapping = dataset.field2token_id[dataset.uid_field]
    unknown = [token for token in tokens if token not in mapping or mapping[token] == 0]
    if unknown:
        shown = ", ".join(repr(t) for t in unknown[:20])
        more = f" and {len(unknown) - 20} more" if len(unknown) > 20 else ""
        raise UnknownUserError(
            f"{len(unknown)} unknown user token(s) for dataset {dataset.dataset_name!r}: "
            f"{shown}{more}. Tokens are the user ids of the .inter file."
        )
    return np.array([mapping[token] for token in tokens], dtype=np.int64)


def _history_rows(split_datasets, context: str):
    """Per split: (split dataset, whether its targets belong to the history)."""
    train, valid, test = split_datasets
    return [(train, True), (valid, True), (test, context == "next")]


def _latest_rows(split_datasets, context: str):
    """Per user id: the split (index) and row of the user's latest row in the splits the
    context reads (-1 where none), and those splits (None where unread)."""
    uid_field = split_datasets[0].uid_field
    n_users = split_datasets[0].user_num
    chosen = [None] * 3
    source = np.full(n_users, -1)
    row = np.full(n_users, -1)
    for index, split in enumerate(split_datasets):
        if context == "test" and index < 2:
            continue
        users = split.inter_feat[uid_field].numpy()
        source[users] = index
        row[users] = np.arange(len(users))  # later rows overwrite: the latest wins
        chosen[index] = split
    return source, row, chosen


def reads_times(model) -> bool:
    """Whether ``model`` reads the rows' timestamps (a plugin model with TiSASRec's
    ``time_intervals``), so a recommendation must give it each history's times."""
    from recbole_freq.model.abstract_recommender import TransformerRecommender

    return isinstance(model, TransformerRecommender) and model.TIME_SEQ is not None


def users_without_rows(split_datasets, uids: np.ndarray, context: str) -> np.ndarray:
    """The users of ``uids`` that no split row holds for ``context``: under ``next``
    those with a single interaction (a row needs one item before its target), under
    ``test`` also those too short for a test row."""
    source, _, _ = _latest_rows(split_datasets, context)
    return uids[source[uids] < 0]


def single_item_histories(config, uids: np.ndarray, fields) -> dict[int, dict[str, np.ndarray]]:
    """For users whom no split row holds (a single interaction): their interactions in
    time order, ``{user id: {field: values}}`` for ``fields`` (the item and time fields
    the model reads), read from the dataset before RecBole turns it into prefix rows.
    Users without any interaction are left out."""
    if not len(uids):
        return {}
    from recbole_freq.compat.data import create_dataset_from_atomic_files

    frame = create_dataset_from_atomic_files(config).inter_feat
    frame = frame[frame[config["USER_ID_FIELD"]].isin(uids)]
    if config["TIME_FIELD"] in frame.columns:
        frame = frame.sort_values(config["TIME_FIELD"], kind="stable")
    return {
        int(user): {field: rows[field].to_numpy() for field in fields}
        for user, rows in frame.groupby(config["USER_ID_FIELD"], sort=False)
    }


def user_inputs(model, split_datasets, uids: np.ndarray, context: str, histories=None):
    """``(item_seq, item_seq_len, extra)`` the model reads for each user of ``uids``;
    ``extra`` holds the other list fields its encoder reads (TiSASRec's timestamps), by
    list-field name.

    Rows are taken from the splits in time order (train, valid, test): the last row of
    a user is their latest prefix and target.  ``next`` appends that target to the prefix
    (dropping the oldest item when the sequence is full); ``test`` uses the test row.
    ``histories`` (``single_item_histories``) gives ``next`` the sequence of a user no
    row holds.
    """
    uid_field = split_datasets[0].uid_field
    max_len = model.max_seq_length
    source, row, chosen = _latest_rows(split_datasets, context)
    from_histories = (source[uids] < 0) & np.isin(uids, list(histories or {}))
    if context == "test":
        from_histories[:] = False
    missing = uids[(source[uids] < 0) & ~from_histories]
    if len(missing):
        dataset = split_datasets[0]
        tokens = dataset.id2token(uid_field, missing[:20])
        raise UnknownUserError(
            f"{len(missing)} user(s) have no {context!r} sequence to read (too few "
            f"interactions for the split): {', '.join(map(str, tokens))}"
        )
    fields = {model.ITEM_SEQ: model.ITEM_ID}  # list field -> field of the target
    if reads_times(model):
        fields[model.TIME_SEQ] = model.INTERVAL_TIME_FIELD
    sequences = {}
    item_seq_len = torch.zeros(len(uids), dtype=torch.long)
    for index, split in enumerate(chosen):
        if split is None:
            continue
        where = np.flatnonzero(source[uids] == index)
        rows = torch.from_numpy(row[uids[where]])
        lengths = split.inter_feat[model.ITEM_SEQ_LEN][rows]
        full = lengths >= max_len
        for list_field, target_field in fields.items():
            prefix = split.inter_feat[list_field][rows]
            if context == "next":
                prefix = torch.where(full[:, None], prefix.roll(-1, dims=1), prefix)
                prefix[torch.arange(len(rows)), torch.where(full, lengths, lengths + 1) - 1] = (
                    split.inter_feat[target_field][rows].to(prefix.dtype)
                )
            if list_field not in sequences:
                sequences[list_field] = prefix.new_zeros((len(uids), max_len))
            sequences[list_field][torch.from_numpy(where)] = prefix
        if context == "next":
            lengths = torch.where(full, lengths, lengths + 1)
        item_seq_len[torch.from_numpy(where)] = lengths
    for position in np.flatnonzero(from_histories):
        history = histories[int(uids[position])]
        for list_field, target_field in fields.items():
            values = torch.as_tensor(history[target_field][-max_len:])
            if list_field not in sequences:
                dtype = torch.long if list_field == model.ITEM_SEQ else torch.float64
                sequences[list_field] = torch.zeros((len(uids), max_len), dtype=dtype)
            sequences[list_field][position, : len(values)] = values
            item_seq_len[position] = len(values)
    item_seq = sequences.pop(model.ITEM_SEQ, torch.zeros(len(uids), max_len, dtype=torch.long))
    return item_seq, item_seq_len, sequences


def user_history(
    split_datasets, uids: np.ndarray, context: str, iid_field, list_field, histories=None
):
    """``(positions, items)``: every item of each user's history (index into ``uids``),
    ``histories`` (``single_item_histories``) included under ``next``."""
    uid_field = split_datasets[0].uid_field
    position = np.full(split_datasets[0].user_num, -1)
    position[uids] = np.arange(len(uids))
    parts_pos, parts_item = [], []
    for split, with_target in _history_rows(split_datasets, context):
        users = split.inter_feat[uid_field].numpy()
        keep = np.flatnonzero(position[users] >= 0)
        if not len(keep):
            continue
        pos = position[users[keep]]
        lists = split.inter_feat[list_field][torch.from_numpy(keep)].numpy()
        rows, cols = np.nonzero(lists)
        parts_pos.append(pos[rows])
        parts_item.append(lists[rows, cols])
        if with_target:
            parts_pos.append(pos)
            parts_item.append(split.inter_feat[iid_field][torch.from_numpy(keep)].numpy())
    if context == "next":
        for user, history in (histories or {}).items():
            if position[user] >= 0:
                items = np.asarray(history[iid_field])
                parts_pos.append(np.full(len(items), position[user]))
                parts_item.append(items)
    if not parts_pos:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    pairs = np.unique(np.stack([np.concatenate(parts_pos), np.concatenate(parts_item)]), axis=1)
    return pairs[0], pairs[1]


@torch.no_grad()
def recommend(
    model,
    split_datasets,
    uids: np.ndarray,
    k: int = 10,
    context: str = "next",
    exclude_history: bool = True,
    batch_size: int = 512,
    progress: bool = False,
    histories=None,
):
    """Top-``k`` internal item ids and scores per user (``(len(uids), k)`` each, rows with
    fewer candidates padded with id 0 and score -inf), batched over users; ``histories``:
    ``single_item_histories`` of the users no split row holds."""
    if context not in CONTEXTS:
        raise ValueError(f"context={context!r} is unknown; choose from {list(CONTEXTS)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"topk={k!r} must be an integer >= 1")
    model.eval()
    device = next(model.parameters()).device
    dataset = split_datasets[0]
    n_items = dataset.item_num
    k = min(k, n_items)
    item_seq, item_seq_len, extra = user_inputs(model, split_datasets, uids, context, histories)
    if exclude_history:
        hist_pos, hist_item = user_history(
            split_datasets, uids, context, model.ITEM_ID, model.ITEM_SEQ, histories
        )
        order = np.argsort(hist_pos, kind="stable")
        hist_pos, hist_item = hist_pos[order], hist_item[order]
    top_items, top_scores = [], []
    starts = range(0, len(uids), batch_size)
    if progress:
        from tqdm import tqdm

        # Shown on a terminal only (disable=None), e.g. for --all_users of a large dataset.
        starts = tqdm(starts, desc="recommending", unit="batch", disable=None, file=sys.stderr)
    for start in starts:
        stop = min(start + batch_size, len(uids))
        batch = Interaction(
            {
                dataset.uid_field: torch.from_numpy(uids[start:stop]),
                model.ITEM_SEQ: item_seq[start:stop],
                model.ITEM_SEQ_LEN: item_seq_len[start:stop],
                **{field: values[start:stop] for field, values in extra.items()},
            }
        ).to(device)
        scores = model.full_sort_predict(batch).view(-1, n_items).float()
        scores[:, 0] = -torch.inf
        if exclude_history:
            lo, hi = np.searchsorted(hist_pos, [start, stop])
            rows = torch.from_numpy(hist_pos[lo:hi] - start).to(device)
            cols = torch.from_numpy(hist_item[lo:hi]).to(device)
            scores[rows, cols] = -torch.inf
        values, indices = torch.topk(scores, k, dim=-1)
        indices = indices.masked_fill(torch.isinf(values), 0)
        top_items.append(indices.cpu())
        top_scores.append(values.cpu())
    return torch.cat(top_items), torch.cat(top_scores)


def format_recommendations(dataset, tokens, items, scores, fmt: str, raw_ids=None) -> str:
    """CSV (``user,rank,item,score``, one row per recommendation) or JSON (a list of
    ``{"user", "items", "scores"}``), in external tokens, or in raw ids through
    ``raw_ids`` (``RawIds``)."""
    if fmt not in FORMATS:
        raise ValueError(f"format={fmt!r} is unknown; choose from {list(FORMATS)}")
    item_tokens = dataset.field2id_token[dataset.iid_field]
    user_name = (lambda t: raw_ids.raw_user[t]) if raw_ids else (lambda t: t)
    item_name = (lambda t: raw_ids.raw_item[t]) if raw_ids else (lambda t: t)
    records = []
    for token, row_items, row_scores in zip(tokens, items.tolist(), scores.tolist()):
        kept = [(item, score) for item, score in zip(row_items, row_scores) if item != 0]
        records.append(
            {
                "user": user_name(token),
                "items": [item_name(str(item_tokens[item])) for item, _ in kept],
                "scores": [round(float(score), 6) for _, score in kept],
            }
        )
    if fmt == "json":
        return json.dumps(records, indent=1) + "\n"
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["user", "rank", "item", "score"])
    for record in records:
        for rank, (item, score) in enumerate(zip(record["items"], record["scores"]), 1):
            writer.writerow([record["user"], rank, item, score])
    return buffer.getvalue()
