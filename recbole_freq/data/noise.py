"""Synthetic noise for robustness experiments (Rec-Denoiser section 5.3, Fig. 2).

``noise_ratio`` replaces that fraction of the *training* interactions with items drawn
uniformly from the items that are not in the user's validation or test part (nor the
replaced item itself).  Exactly ``round(noise_ratio * N)`` of the ``N`` training
interactions (all items of each user's training part: the first item, which RecBole
never uses as a target, included) are chosen uniformly without replacement, with a NumPy
generator seeded by ``noise_seed`` (default: ``seed``), so a run is reproducible and two
models given the same seed see the same corrupted data.

Where it acts: on the datasets RecBole has already split (leave-one-out), after
``data_preparation``.  RecBole's sequential datasets hold every training prefix as its
own row (history list + target), so one interaction appears as the target of one row and
inside the histories of the following ones; the corruption is applied to the user's
training sequence once and every affected row is rewritten from it, so targets and
histories stay consistent.  The split, the validation and test targets, timestamps and
the row layout are unchanged.

``noise_scope``:

- ``train`` (default): only the training rows change; validation and test rows,
  histories included, stay clean (the model is trained on noisy data and evaluated on
  clean sequences);
- ``observed``: the paper's protocol, where the training part of each sequence *is* the
  observed history: validation and test rows get the same corrupted histories, only
  their targets stay clean.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from recbole_freq.utils.options import as_number

NOISE_SCOPES = ("train", "observed")


def noise_settings(config) -> tuple[float, int, str]:
    """``(noise_ratio, noise_seed, noise_scope)`` from the config, validated."""
    raw = config["noise_ratio"]
    ratio = 0.0 if raw is None else raw
    ratio = as_number(ratio)
    if isinstance(raw, bool) or not 0.0 <= ratio < 1.0:
        raise ValueError(
            f"noise_ratio={raw!r} must lie in [0, 1): the fraction of training interactions "
            "replaced by random items, e.g. --noise_ratio=0.1 (0 = clean data)"
        )
    seed = config["noise_seed"]
    seed = config["seed"] if seed is None else seed
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"noise_seed={seed!r} must be a non-negative integer")
    scope = config["noise_scope"] or "train"
    if scope not in NOISE_SCOPES:
        raise ValueError(
            f"noise_scope={scope!r} is unknown; choose 'train' (only training rows change) "
            "or 'observed' (validation / test histories share the corrupted training items)"
        )
    return ratio, seed, scope


def corrupt_training_data(config, train_data, valid_data, test_data) -> dict | None:
    """Apply ``noise_ratio`` to the split datasets behind RecBole's data loaders, in
    place; no-op (returns None) when the ratio is 0.  Returns what was done."""
    ratio, seed, scope = noise_settings(config)
    if ratio == 0.0:
        return None
    split = (config["eval_args"] or {}).get("split")
    if split != {"LS": "valid_and_test"}:
        raise ValueError(
            f"noise_ratio needs the leave-one-out split eval_args.split="
            f"{{'LS': 'valid_and_test'}} (got {split!r})"
        )
    train, valid, test = (loader._dataset for loader in (train_data, valid_data, test_data))
    stats = corrupt_sequences(train, valid, test, ratio, seed, scope)
    logging.getLogger().info(
        f"noise: replaced {stats['replaced']} of {stats['training_interactions']} training "
        f"interactions ({ratio:.0%}, seed {seed}, scope {scope})"
    )
    return stats


def _fields(dataset):
    return (
        dataset.uid_field,
        dataset.iid_field,
        dataset.item_id_list_field,
        dataset.item_list_length_field,
    )


def _replace_items(sequence, owner, held_out, n_items, ratio, seed):
    """``(corrupted copy, count)``: ``round(ratio * len)`` positions drawn without
    replacement, each item replaced by a uniform item that is neither the one it replaces
    nor one of its user's (``owner``) held-out validation and test items."""
    rng = np.random.default_rng(seed)
    total = len(sequence)
    n_replaced = int(round(ratio * total))
    chosen = np.sort(rng.choice(total, size=n_replaced, replace=False))
    corrupted = sequence.copy()
    for position in chosen:
        excluded = held_out[int(owner[position])] | {int(sequence[position])}
        item = int(rng.integers(1, n_items))
        while item in excluded:
            item = int(rng.integers(1, n_items))
        corrupted[position] = item
    return corrupted, n_replaced


def _corrupt_evaluation_histories(valid, test, users_sequences, max_len) -> None:
    """``noise_scope: observed``: a validation row's history is the user's training
    sequence, a test row's the training sequence plus the validation item (if the user
    has one), each truncated to the last ``max_len`` items; their training items are
    replaced as the training rows' were."""
    sequence, corrupted, offsets, seq_len, user_index = users_sequences
    uid, _, list_field, len_field = _fields(valid)
    valid_users = set(valid.inter_feat[uid].numpy().tolist())
    for dataset, phase in ((valid, "valid"), (test, "test")):
        feat_eval = dataset.inter_feat
        eval_histories = feat_eval[list_field].numpy().copy()
        eval_lengths = feat_eval[len_field].numpy()
        for row, user in enumerate(feat_eval[uid].numpy().tolist()):
            k = user_index.get(user)
            if k is None:
                continue
            clean = sequence[offsets[k] : offsets[k] + seq_len[k]]
            noisy = corrupted[offsets[k] : offsets[k] + seq_len[k]]
            extra = eval_histories[row, :0]
            if phase == "test" and user in valid_users:
                extra = eval_histories[row, eval_lengths[row] - 1 : eval_lengths[row]]
            expected = np.concatenate([clean, extra])[-max_len:]
            if not np.array_equal(expected, eval_histories[row, : eval_lengths[row]]):
                raise ValueError(
                    f"noise_ratio: the {phase} history of user {user} does not continue "
                    "the training sequence (expected leave-one-out on the same data)"
                )
            replaced = np.concatenate([noisy, extra])[-max_len:]
            eval_histories[row, : len(replaced)] = replaced
        feat_eval[list_field] = torch.from_numpy(eval_histories).to(feat_eval[list_field].dtype)


def corrupt_sequences(train, valid, test, ratio: float, seed: int, scope: str = "train") -> dict:
    """The corruption itself, on RecBole ``SequentialDataset`` s split by leave-one-out."""
    uid, iid, list_field, len_field = _fields(train)
    max_len = train.max_item_list_len
    n_items = train.item_num
    feat = train.inter_feat
    users = feat[uid].numpy()
    targets = feat[iid].numpy()
    histories = feat[list_field].numpy()
    lengths = feat[len_field].numpy()
    time_field = train.time_field
    times = feat[time_field].numpy() if time_field in feat else np.zeros(len(users))
    # Rows of a user in order: by target time, then history length.
    order = np.lexsort((lengths, times, users))
    users_sorted = users[order]
    starts = np.flatnonzero(np.r_[True, users_sorted[1:] != users_sorted[:-1]])
    counts = np.diff(np.r_[starts, len(order)])
    first_rows = order[starts]
    if (lengths[first_rows] != 1).any():
        raise ValueError("noise_ratio: each user's first training row must hold one item")
    # Each user's training sequence: the first row's history item, then every target.
    seq_len = counts + 1
    offsets = np.r_[0, np.cumsum(seq_len)[:-1]]
    sequence = np.empty(seq_len.sum(), dtype=np.int64)
    sequence[offsets] = histories[first_rows, 0]
    rank = np.arange(len(order)) - np.repeat(starts, counts)  # row's rank within its user
    row_position = np.empty(len(order), dtype=np.int64)  # flat position of each row's target
    row_position[order] = np.repeat(offsets, counts) + rank + 1
    sequence[row_position] = targets

    user_offsets = np.empty(len(order), dtype=np.int64)  # start of each row's user
    user_offsets[order] = np.repeat(offsets, counts)
    if not np.array_equal(_windows(sequence, row_position, user_offsets, max_len), histories):
        raise ValueError(
            "noise_ratio: the training rows are not the prefixes of one sequence per user "
            "(expected RecBole's sequential augmentation with leave-one-out)"
        )

    # Validation and test targets per user: never used as replacements.
    user_ids = users_sorted[starts]
    held_out = {int(u): set() for u in user_ids}
    for dataset in (valid, test):
        for u, item in zip(dataset.inter_feat[uid].numpy(), dataset.inter_feat[iid].numpy()):
            held_out.setdefault(int(u), set()).add(int(item))

    owner = user_ids[np.repeat(np.arange(len(user_ids)), seq_len)]
    corrupted, n_replaced = _replace_items(sequence, owner, held_out, n_items, ratio, seed)
    total = len(sequence)

    feat[iid] = torch.from_numpy(corrupted[row_position]).to(feat[iid].dtype)
    rebuilt = _windows(corrupted, row_position, user_offsets, max_len)
    feat[list_field] = torch.from_numpy(rebuilt).to(feat[list_field].dtype)

    if scope == "observed":
        user_index = {int(u): k for k, u in enumerate(user_ids)}
        users_sequences = (sequence, corrupted, offsets, seq_len, user_index)
        _corrupt_evaluation_histories(valid, test, users_sequences, max_len)
    return {
        "noise_ratio": ratio,
        "noise_seed": seed,
        "noise_scope": scope,
        "training_interactions": int(total),
        "replaced": n_replaced,
    }


def _windows(sequence, positions, user_offsets, max_len):
    """Right-padded histories ``sequence[max(p - max_len, user start) : p]`` per row."""
    start = np.maximum(positions - max_len, user_offsets)
    index = start[:, None] + np.arange(max_len)[None, :]
    inside = index < positions[:, None]
    return np.where(inside, sequence[np.minimum(index, len(sequence) - 1)], 0)
