"""TiSASRec's time intervals (Li, Wang and McAuley, "Time Interval Aware Self-Attention
for Sequential Recommendation", WSDM 2020): the relation matrix of section 3.2 and the
position and interval embeddings that attention adds to its keys and values (eq. 4-5,
``layers.KeyValueRelations``).

Where the paper leaves details open, the authors' code (JiachengLi1995/TiSASRec,
``util.py`` and ``model.py``) decides:

- personalised intervals: a user's timestamps are divided by the smallest non-zero gap
  between two consecutive interactions of the user (``time_scale``), rounded, and the
  interval of two interactions is the absolute difference, clipped at ``time_span`` k;
- the position and interval embeddings are shared by all layers and are split into
  heads like the keys and values.

Attention never builds the ``(batch, n, n, hidden)`` tensors of interval embeddings that
the authors gather: it scores each query against the ``k + 1`` interval embeddings once
and picks the product of each pair's interval, and it sums each row's attention
probabilities per interval before multiplying by the value embeddings
(``layers.KeyValueRelations``); the same function at ``O(batch n (n + k))`` memory.
Dropout follows from that: each batch draws one mask per position embedding and one per
interval embedding, where the authors draw one per (row, position) and per (row, pair).

One difference, on purpose: the authors take the user's scale over the whole history,
test interaction included; here it is taken over the items of each row's input, so a
row sees nothing that follows it.

Which times: ``dataset_prep`` writes a running counter as ``timestamp`` (it fixes the
order of the papers' procedure) and, for raw logs, the source's real time in seconds
as ``real_time`` (``REAL_TIME_FIELD``); the intervals are read from the real times when
the dataset has them (``interval_time_field``), else from ``TIME_FIELD``, and the log
says which (``report_interval_times``).  Datasets whose times only order the
interactions (the one-line format of the BSARec, FMLP-Rec and S3-Rec repositories) have
equal gaps, so every interval is the position distance ``|i - j|`` (clipped at k):
TiSASRec then learns relative-position embeddings, not time.  ``evenly_spaced_users``
measures that on a dataset.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from recbole_freq.model.layers import Dropout, KeyValueRelations
from recbole_freq.utils.options import setting


def time_interval_matrix(time_seq, item_seq, time_span: int) -> torch.Tensor:
    """``(batch, n, n)`` long: TiSASRec's relation matrix ``r_ij = min(|t'_i - t'_j|,
    k)`` of each row (either ``sequence_layout``), with ``t'`` the row's timestamps minus
    the timestamp of its first item, divided by the smallest non-zero gap between
    consecutive items of the row (1 if all share one timestamp) and rounded.  Entries of padding positions are 0 (attention
    hides them)."""
    real = item_seq != 0
    times = time_seq.to(torch.float64)
    gaps = (times[:, 1:] - times[:, :-1]).abs()
    counted = real[:, 1:] & real[:, :-1] & (gaps > 0)
    scale = torch.where(counted, gaps, torch.full_like(gaps, torch.inf)).amin(dim=1)
    scale = torch.where(torch.isinf(scale), torch.ones_like(scale), scale)
    origin = times.gather(1, real.long().argmax(dim=1, keepdim=True))
    scaled = torch.round((times - origin) / scale[:, None])
    scaled = torch.where(real, scaled, torch.zeros_like(scaled))
    intervals = (scaled[:, :, None] - scaled[:, None, :]).abs()
    # Times past the float range (finite real times of 1.7e308 overflow in the
    # differences, or are inf once stored as float32) are as far apart as can be: the
    # clipped interval k, never a NaN cast to an index outside the table.
    intervals = torch.nan_to_num(intervals, nan=time_span, posinf=time_span).clamp(max=time_span)
    intervals.diagonal(dim1=1, dim2=2).zero_()  # |t_i - t_i|, whatever t_i is
    pair_real = real[:, :, None] & real[:, None, :]
    return torch.where(pair_real, intervals, torch.zeros_like(intervals)).long()


class TimeIntervalRelations(nn.Module):
    """The embeddings TiSASRec adds to keys and values: absolute positions ``P^K``,
    ``P^V`` (``max_seq_length x d``) and intervals ``R^K``, ``R^V`` (``(k + 1) x d``,
    one row per clipped interval), each with dropout; returns them per batch as
    ``KeyValueRelations`` split into ``n_heads``."""

    def __init__(self, max_seq_length, time_span, hidden_size, n_heads, dropout_prob):
        super().__init__()
        if isinstance(time_span, bool) or not isinstance(time_span, int) or time_span < 1:
            raise ValueError(
                f"time_span={time_span!r} must be an integer >= 1: the largest time "
                "interval TiSASRec tells apart (its paper's k, e.g. 256)"
            )
        if hidden_size % n_heads:
            raise ValueError(
                f"hidden_size={hidden_size} is not divisible by n_heads={n_heads}; "
                "choose n_heads among the divisors of hidden_size"
            )
        self.time_span = time_span
        self.n_heads = n_heads
        self.position_key = nn.Embedding(max_seq_length, hidden_size)
        self.position_value = nn.Embedding(max_seq_length, hidden_size)
        self.interval_key = nn.Embedding(time_span + 1, hidden_size)
        self.interval_value = nn.Embedding(time_span + 1, hidden_size)
        self.dropout = Dropout(dropout_prob)

    def forward(self, time_seq, item_seq) -> KeyValueRelations:
        seq_len = item_seq.size(1)
        intervals = time_interval_matrix(time_seq, item_seq, self.time_span)
        positions = torch.arange(seq_len, device=item_seq.device)
        # Only the intervals that occur need a bucket: on order-only timestamps at
        # n = 50 that is 50 of time_span + 1.
        buckets = int(intervals.max()) + 1

        def split_heads(table):  # (heads, rows, head_size)
            return self.dropout(table).view(len(table), self.n_heads, -1).transpose(0, 1)

        return KeyValueRelations(
            split_heads(self.position_key(positions)),
            split_heads(self.position_value(positions)),
            intervals,
            split_heads(self.interval_key.weight[:buckets]),
            split_heads(self.interval_value.weight[:buckets]),
        )

    def extra_repr(self) -> str:
        return f"time_span={self.time_span}, n_heads={self.n_heads}"


# float32 holds integers exactly up to 2**24: unix seconds (about 1.7e9) are rounded.
FLOAT32_EXACT_UP_TO = 2**24


def interval_time_field(config, dataset) -> str:
    """The column TiSASRec's intervals are read from: ``REAL_TIME_FIELD`` (the source's
    real times in seconds) when the dataset has it loaded, else ``TIME_FIELD``."""
    real = config["REAL_TIME_FIELD"]
    if real and real in dataset.inter_feat.columns:
        return real
    time_field = config["TIME_FIELD"]
    if time_field is None or time_field not in dataset.inter_feat.columns:
        raise ValueError(
            f"time_intervals=True needs timestamps, and dataset {config['dataset']!r} "
            f"has no loaded TIME_FIELD {time_field!r}: add it to load_col (inter)"
        )
    return time_field


def report_interval_times(model_name: str, config, dataset, field: str) -> None:
    """Say in the run's log which times the intervals come from, and warn when they
    cannot be time: evenly spaced (the order only) or rounded by float32."""
    logger = logging.getLogger()
    times = dataset.inter_feat[field]
    if field == config["REAL_TIME_FIELD"]:
        added = " (added to the load_col you gave)" if config["real_time_added_to_load_col"] else ""
        logger.info(
            f"{model_name}: time intervals from {field!r}, the source's real times in "
            f"seconds{added}"
        )
    else:
        logger.info(f"{model_name}: time intervals from TIME_FIELD {field!r}")
    even, users = evenly_spaced_users(dataset, field)
    if users and even == users:
        logger.warning(
            f"{model_name}: every user of {config['dataset']!r} has evenly spaced timestamps "
            "(they only order the interactions, as in the one-line format), so each "
            "time interval equals the position distance |i - j| and the interval "
            "embeddings learn relative positions, not time"
        )
    largest = float(times.abs().max()) if len(times) else 0.0
    if times.dtype == torch.float32 and largest > FLOAT32_EXACT_UP_TO:
        step = float(np.spacing(np.float32(largest)))
        logger.warning(
            f"{model_name}: RecBole holds {field!r} in float32, which rounds times near "
            f"{largest:.4g} to multiples of {step:g}, so shorter intervals are lost; "
            "prepare the data with dataset_prep, whose real_time column is read exactly"
        )


def evenly_spaced_users(dataset, field=None) -> tuple[int, int]:
    """``(evenly spaced, users with >= 3 interactions)`` of a RecBole dataset: users
    whose consecutive interactions are all the same time apart in ``field`` (default:
    the time field), for whom TiSASRec's intervals are position distances."""
    feat = dataset.inter_feat
    users = feat[dataset.uid_field].numpy()
    times = feat[field or dataset.time_field].numpy().astype(np.float64)
    order = np.lexsort((times, users))
    users, times = users[order], times[order]
    same_user = users[1:] == users[:-1]
    gap_users, gaps = users[1:][same_user], np.diff(times)[same_user]
    _, first, inverse = np.unique(gap_users, return_index=True, return_inverse=True)
    uneven = np.unique(gap_users[gaps != gaps[first][inverse]])
    eligible = np.flatnonzero(np.bincount(users) >= 3)
    return len(np.setdiff1d(eligible, uneven)), len(eligible)


@dataclass(frozen=True)
class TimeIntervalInputs:
    """What TiSASRec's attention reads from a batch besides the items: each row's
    timestamps, ``time_seq`` (section 3.2), from ``field`` (``interval_time_field``).

    One part of every ``TransformerRecommender`` with ``time_intervals: True``; its
    ``relations`` are the key and value embeddings every attention layer adds (eq. 4-5).
    """

    field: str
    seq_field: str

    @classmethod
    def from_config(cls, config, dataset, model_name: str, unavailable: str):
        """The part when ``time_intervals`` is on (None when off), the rows checked to
        carry timestamps and the log told where the intervals come from."""
        enabled = setting(config, "time_intervals")
        if enabled not in (True, False):
            raise ValueError(f"time_intervals={enabled!r} must be True or False")
        if not enabled:
            return None
        if unavailable:
            raise ValueError(
                f"time_intervals=True is not available for {model_name}: {unavailable}"
            )
        field = interval_time_field(config, dataset)
        report_interval_times(model_name, config, dataset, field)
        return cls(field, f"{field}{config['LIST_SUFFIX']}")

    def relations(self, config, max_seq_length: int) -> TimeIntervalRelations:
        return TimeIntervalRelations(
            max_seq_length,
            setting(config, "time_span"),
            config["hidden_size"],
            config["n_heads"],
            config["hidden_dropout_prob"],
        )
