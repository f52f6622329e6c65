"""Sampled evaluation (``uni100``, ``pop100``, ...) without re-encoding each sequence
once per candidate item, for every sequential model, RecBole's built-ins included.

RecBole's sampled loader gives each candidate (the target and the sampled negatives) its
own row with a copy of the user's sequence and scores the rows with ``predict``, so a
Transformer encodes every sequence 101 times under ``uni100``: on amazon-beauty (22,363
test users) that is an estimated hour on one CPU core for RecBole's SASRec.  Scoring a
candidate is reading one entry of the model's full-sort scores, so ``SampledScorer``
computes ``full_sort_predict`` once per run of rows with the same (user, sequence) and
gathers.

RecBole's loader also builds those rows one user at a time (``collate_fn`` of
``NegSampleEvalDataLoader``: per user a dataset lookup, a copy per candidate, a join and
a concatenation), which on amazon-beauty cost about as much as the model.
``batch_sampled_collate`` builds each batch at once; only the negative draws stay user by
user, in RecBole's order and by its rejection loop, so the same random stream gives the
same negatives.
"""

from __future__ import annotations

import logging
import types

import numpy as np
import torch
from recbole.data.interaction import Interaction
from recbole.model.abstract_recommender import SequentialRecommender

from recbole_freq.protocol.losses import sequence_inputs


class SampledScorer:
    """The trainer's scores of sampled candidates (``FreqTrainer._neg_sample_batch_eval``)
    in place of ``model.predict``: ``full_sort_predict`` of each distinct (user,
    sequence) of the batch, read at the candidates' items.

    The first batch with repeated sequences is also scored with the model's own
    ``predict`` on the rows of its first two sequences; if the two disagree (a model whose
    ``predict`` is not its full-sort score), the model's own ``predict`` is used from then
    on and a warning says so.  Batches without repeats, and training mode, use the model's
    own ``predict``."""

    def __init__(self, model: SequentialRecommender):
        self.model = model
        self.own_predict = model.predict
        self.verified = False
        self.consistent = True

    def __call__(self, interaction):
        model = self.model
        if model.training or not self.consistent:
            return self.own_predict(interaction)
        key = interaction[model.ITEM_SEQ]
        if model.USER_ID in interaction:  # models with user embeddings (Caser, HGN, ...)
            key = torch.cat([interaction[model.USER_ID][:, None], key], dim=1)
        extra = list(sequence_inputs(model, interaction).values())
        if extra:  # e.g. TiSASRec's timestamps: same items at other times score otherwise
            key = torch.cat([key.double()] + [v.view(key.size(0), -1).double() for v in extra], 1)
        first, inverse = equal_runs(key)
        if first.size(0) == key.size(0):
            return self.own_predict(interaction)
        full = model.full_sort_predict(interaction[first]).view(first.size(0), -1)
        scores = full[inverse, interaction[model.ITEM_ID]]
        if not self.verified:
            check = inverse < 2
            reference = self.own_predict(interaction[check])
            if not torch.allclose(reference, scores[check], rtol=1e-4, atol=1e-5):
                logging.getLogger().warning(
                    f"{type(model).__name__}: predict() differs from its full-sort scores, "
                    "so sampled evaluation re-encodes every row (slower)"
                )
                self.consistent = False
                return self.own_predict(interaction)
            self.verified = True
        return scores


def equal_runs(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows grouped into runs of consecutive equal rows of ``key``: the first row of each
    run and each row's run.  RecBole's sampled loader writes a user's candidate rows one
    after another, so a run is a user's block; equal rows apart (two users with the same
    sequence) are encoded twice, which costs a little and changes nothing (a sort-based
    ``torch.unique(dim=0)`` took a third of an evaluation pass on amazon-beauty)."""
    starts = torch.ones(key.size(0), dtype=torch.bool, device=key.device)
    if key.size(0) > 1:
        starts[1:] = (key[1:] != key[:-1]).flatten(1).any(dim=1)
    return torch.nonzero(starts).squeeze(1), torch.cumsum(starts, 0) - 1


def batch_sampled_collate(loader) -> bool:
    """Give a sampled evaluation loader (RecBole's ``NegSampleEvalDataLoader`` drawing
    negatives) a ``collate_fn`` that builds each batch at once, with RecBole's output to
    the bit: the same rows, negatives, labels and index tensors (``tests/test_evaluation.py``).
    Only where RecBole's own would do no more than that: point-wise negatives, not
    ``dynamic``, the identity ``transform``.  Returns whether it was installed."""
    from recbole.data.dataloader import NegSampleEvalDataLoader
    from recbole.data.transform import Equal

    if not isinstance(loader, NegSampleEvalDataLoader) or not hasattr(loader, "uid_list"):
        return False
    args = loader.neg_sample_args
    if args.get("dynamic", False) or "none" in (args["distribution"], args["sample_num"]):
        return False
    if not isinstance(loader.transform, Equal):
        return False
    if (
        getattr(loader.sampling_func, "__func__", None)
        is not type(loader)._neg_sample_by_point_wise_sampling
    ):
        return False
    if getattr(loader.collate_fn, "__func__", None) is not _batched_collate:
        loader.collate_fn = types.MethodType(_batched_collate, loader)
    return True


def _batched_collate(loader, index):
    """``NegSampleEvalDataLoader.collate_fn`` (sampled branch) for a whole batch."""
    users = loader.uid_list[np.asarray(index)]
    counts = loader.uid2items_num[users]
    rows = torch.from_numpy(
        np.concatenate([np.arange(s.start, s.stop) for s in loader.uid2index[users]])
    )
    dataset, times = loader._dataset, loader.times
    data = dataset.join(
        Interaction({k: v[rows] for k, v in dataset.inter_feat.interaction.items()})
    )
    user_ids, item_ids = data[loader.uid_field].numpy(), data[loader.iid_field].numpy()
    negatives, offset = [], 0
    used_items = items_a_draw_avoids(loader._sampler)
    for count in counts.tolist():  # one draw per user, in RecBole's order
        user_rows = user_ids[offset : offset + count]
        item_rows = item_ids[offset : offset + count]
        if count == 1 and used_items is not None:
            used = used_items(int(user_rows[0]), int(item_rows[0]))
            negatives.append(one_key_draw(loader._sampler.sampling, used, loader.neg_sample_num))
        else:
            negatives.append(
                loader._sampler.sample_by_user_ids(user_rows, item_rows, loader.neg_sample_num)
            )
        offset += count
    # Each user's block: its rows, then ``times - 1`` copies of them for the negatives.
    block = torch.from_numpy(counts * times)
    owner = torch.repeat_interleave(torch.arange(len(counts)), block)
    within = torch.arange(int(block.sum())) - torch.repeat_interleave(
        torch.cumsum(block, 0) - block, block
    )
    owners_rows = torch.from_numpy(counts)[owner]
    first_row = torch.from_numpy(np.cumsum(counts) - counts)[owner]
    source = first_row + within % owners_rows
    tiled = Interaction({k: v[source] for k, v in data.interaction.items()})
    candidate = within >= owners_rows
    tiled[loader.iid_field][candidate] = torch.cat(negatives).to(tiled[loader.iid_field].dtype)
    tiled = dataset.join(tiled)
    tiled.update(Interaction({loader.label_field: (~candidate).float()}))
    positive_u = torch.repeat_interleave(torch.arange(len(counts)), torch.from_numpy(counts))
    positive_i = torch.cat((torch.tensor([], dtype=torch.int64), data[loader.iid_field]), 0)
    return tiled, owner, positive_u, positive_i


def items_a_draw_avoids(sampler):
    """For the evaluation samplers of sequential runs (RecBole's ``RepeatableSampler``:
    sequential models refuse its other one; the protocol's ``UnseenSampler``), ``(user,
    item) -> the set of items`` its ``sample_by_user_ids`` keeps out of one row's
    negatives; ``None`` for any other sampler (it is then called itself)."""
    from recbole.sampler import RepeatableSampler

    from recbole_freq.protocol.rows import UnseenSampler

    if isinstance(sampler, UnseenSampler):
        return lambda user, item: sampler.user_items[user]
    if type(sampler) is RepeatableSampler:
        return lambda user, item: {item}
    return None


def one_key_draw(sampling, used: set, num: int) -> torch.Tensor:
    """RecBole's ``sample_by_key_ids`` for one key (``num`` draws of ``sampling``, each
    that falls in ``used`` drawn again until none does), with the same calls of
    ``sampling`` in the same order, so the same random stream gives the same negatives;
    membership is read from the set (``np.isin`` on a handful of items cost more than
    the draw)."""
    values = sampling(num)
    check = np.flatnonzero([value in used for value in values.tolist()])
    while len(check) > 0:
        values[check] = redrawn = sampling(len(check))
        check = check[[value in used for value in redrawn.tolist()]]
    return torch.tensor(values, dtype=torch.long)
