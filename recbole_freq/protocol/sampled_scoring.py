"""Sampled evaluation (``uni100``, ``pop100``, ...) without re-encoding each sequence
once per candidate item, for every sequential model, RecBole's built-ins included.

RecBole's sampled loader gives each candidate (the target and the sampled negatives) its
own row with a copy of the user's sequence and scores the rows with ``predict``, so a
Transformer encodes every sequence 101 times under ``uni100``: on amazon-beauty (22,363
test users) that is an estimated hour on one CPU core for RecBole's SASRec.  Scoring a
candidate is reading one entry of the model's full-sort scores, so ``SampledScorer``
computes ``full_sort_predict`` once per distinct (user, sequence) and gathers.
"""

from __future__ import annotations

import logging

import torch
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
        distinct, inverse = torch.unique(key, dim=0, return_inverse=True)
        rows = key.size(0)
        if distinct.size(0) == rows:
            return self.own_predict(interaction)
        positions = torch.arange(rows, device=key.device)
        first = torch.full((distinct.size(0),), rows, device=key.device, dtype=torch.long)
        first = first.scatter_reduce(0, inverse, positions, reduce="amin")
        full = model.full_sort_predict(interaction[first]).view(distinct.size(0), -1)
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
