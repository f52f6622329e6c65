"""TiSASRec (``recbole_freq.model.TiSASRec``) and ``time_intervals`` on the shared core:
the relation matrix against the authors' computation, the attention against eq. 4-5
written out, zero relation embeddings give RecBole's SASRec, timestamps reach the model
in every path (training, protocols, sampled scoring, recommending), order-only
timestamps are reported, bad settings are refused; and Rec-Denoiser on it."""

import logging
import math
import random

import numpy as np
import pytest
import torch
from recbole.model.sequential_recommender import SASRec

from conftest import (
    assert_all_ones_masks_give_the_backbone,
    assert_same_as_recbole,
    first_batch,
    prepare,
)
from recbole_freq.model import BASELINES, RecDenoiser, TiSASRec
from recbole_freq.model.layers import KeyValueRelations, attend, attention_probabilities
from recbole_freq.model.temporal import time_interval_matrix
from recbole_freq.quick_start.quick_start import run

NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attn_dropout_prob": 0.0}
GAPS = (1, 1, 2, 5, 30, 600, 3600, 86400)  # seconds: repeats, minutes, hours, days


@pytest.fixture(scope="module")
def timed_data(tmp_path_factory):
    """Data folder with dataset ``timed``: 50 users, 120 items, irregular unix times in
    ``real_time`` (as dataset_prep writes them) and the order in ``timestamp``."""
    rng = random.Random(3)
    root = tmp_path_factory.mktemp("timed")
    (root / "timed").mkdir()
    lines = ["user_id:token\titem_id:token\ttimestamp:float\treal_time:float"]
    for user in range(1, 51):
        time = 1_600_000_000 + rng.randint(0, 10**6)
        start = rng.randint(1, 120)
        for step in range(rng.randint(6, 18)):
            time += rng.choice(GAPS)
            item = (start + step + rng.randint(0, 2)) % 120 + 1
            lines.append(f"{user}\t{item}\t{len(lines)}\t{time}")
    (root / "timed" / "timed.inter").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture
def timed_config(small_config, timed_data):
    return dict(small_config, data_path=str(timed_data))


def authors_relation(times, time_span):
    """JiachengLi1995/TiSASRec ``util.py`` for one row of real timestamps: divide by the
    smallest non-zero consecutive gap, round from the first, clip the differences."""
    gaps = {b - a for a, b in zip(times, times[1:]) if b - a != 0}
    scale = min(gaps) if gaps else 1
    scaled = [int(round((t - times[0]) / scale)) + 1 for t in times]
    return [[min(abs(a - b), time_span) for b in scaled] for a in scaled]


def test_relation_matrix_is_the_authors(timed_config):
    rng = np.random.default_rng(0)
    rows, lengths, expected = [], [], []
    for length in (1, 2, 5, 9, 12):
        times = np.cumsum(rng.choice(GAPS + (0,), size=length)).astype(float) + 1e9
        rows.append(np.pad(times, (0, 12 - length)))
        lengths.append(length)
        expected.append(authors_relation(times.tolist(), time_span=40))
    time_seq = torch.tensor(np.stack(rows))
    item_seq = (torch.arange(12)[None, :] < torch.tensor(lengths)[:, None]).long() * 7
    matrix = time_interval_matrix(time_seq, item_seq, time_span=40)
    for row, (length, reference) in enumerate(zip(lengths, expected)):
        assert matrix[row, :length, :length].tolist() == reference
        assert matrix[row, length:].abs().sum() == 0 and matrix[row, :, length:].abs().sum() == 0
    assert matrix.max() == 40  # the day-long gaps clip at time_span


def random_relations(batch, heads, n, size, buckets, generator=None):
    """Random position and bucket tables and pair buckets, in float64."""

    def table(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=generator)

    return KeyValueRelations(
        table(heads, n, size),
        table(heads, n, size),
        torch.randint(buckets, (batch, n, n), generator=generator),
        table(heads, buckets, size),
        table(heads, buckets, size),
    )


def test_relation_attention_is_eq_4_and_5_written_out():
    torch.manual_seed(0)
    batch, heads, n, size = 2, 2, 5, 3
    query, key, value = (torch.randn(batch, heads, n, size, dtype=torch.float64) for _ in "qkv")
    relations = random_relations(batch, heads, n, size, buckets=4)
    mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None].expand(batch, 1, n, n)
    output = attend(attention_probabilities(query, key, mask, relations), value, relations)
    for b in range(batch):
        for h in range(heads):
            for i in range(n):
                interval = relations.pair_bucket[b, i]
                scores = torch.stack(
                    [
                        query[b, h, i]
                        @ (
                            key[b, h, j]
                            + relations.bucket_key[h, interval[j]]
                            + relations.position_key[h, j]
                        )
                        / size**0.5
                        for j in range(i + 1)
                    ]
                )
                weights = scores.softmax(0)
                z = sum(
                    weights[j]
                    * (
                        value[b, h, j]
                        + relations.bucket_value[h, interval[j]]
                        + relations.position_value[h, j]
                    )
                    for j in range(i + 1)
                )
                torch.testing.assert_close(output[b, h, i], z)


def materialised_probabilities(query, key, mask, relations):
    """The oracle: TiSASRec eq. 5 as the authors compute it, with the interval
    embeddings of every pair gathered into a ``(batch, n, n, heads, head_size)`` tensor."""
    pair_key = relations.bucket_key.transpose(0, 1)[relations.pair_bucket]
    scores = torch.matmul(query, (key + relations.position_key).transpose(-1, -2))
    scores = scores + torch.einsum("bhid,bijhd->bhij", query, pair_key)
    scores = scores * query.size(-1) ** -0.5
    return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)


def materialised_attend(probs, value, relations):
    """The oracle of eq. 4, materialised like ``materialised_probabilities``."""
    if relations is None:
        return torch.matmul(probs, value)
    pair_value = relations.bucket_value.transpose(0, 1)[relations.pair_bucket]
    pairs = torch.einsum("bhij,bijhd->bhid", probs, pair_value)
    return torch.matmul(probs, value + relations.position_value) + pairs


@pytest.mark.parametrize("n, buckets", [(7, 3), (12, 40), (30, 257)])
def test_bucketed_relation_attention_equals_the_materialised_one(n, buckets):
    """Outputs and the gradients of every input equal the authors' materialised form,
    with fewer buckets than positions, and more."""
    generator = torch.Generator().manual_seed(n)
    batch, heads, size = 3, 2, 4
    inputs = [
        torch.randn(batch, heads, n, size, dtype=torch.float64, generator=generator) for _ in "qkv"
    ]
    relations = random_relations(batch, heads, n, size, buckets, generator)
    leaves = [*inputs, relations.position_key, relations.position_value]
    leaves += [relations.bucket_key, relations.bucket_value]
    for leaf in leaves:
        leaf.requires_grad_(True)
    mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None].expand(batch, 1, n, n)
    weights = torch.randn(batch, heads, n, size, dtype=torch.float64, generator=generator)
    results = []
    for probabilities, attend_with in (
        (attention_probabilities, attend),
        (materialised_probabilities, materialised_attend),
    ):
        query, key, value = inputs
        output = attend_with(probabilities(query, key, mask, relations), value, relations)
        gradients = torch.autograd.grad((output * weights).sum(), leaves)
        results.append((output, gradients))
    (output, gradients), (expected, expected_gradients) = results
    torch.testing.assert_close(output, expected)
    for gradient, expected_gradient in zip(gradients, expected_gradients):
        torch.testing.assert_close(gradient, expected_gradient)


def test_tisasrec_equals_its_materialised_form_in_loss_and_gradients(timed_config, monkeypatch):
    """The whole model, trained on real irregular times: the loss and every parameter's
    gradient equal those of the model whose attention gathers per-pair embeddings (in
    float64, with weights large enough for the relations to move the loss)."""
    from recbole_freq.model import layers

    overrides = dict(timed_config, initializer_range=0.5, **NO_DROPOUT)
    config, train, _, _ = prepare("TiSASRec", overrides, "timed")
    model = TiSASRec(config, train._dataset).double()
    batch = first_batch(train)
    assert int(model.relations(batch[model.TIME_SEQ], batch[model.ITEM_SEQ]).pair_bucket.max()) > 5

    def loss_and_gradients():
        model.zero_grad()
        loss = model.calculate_loss(batch)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    loss, gradients = loss_and_gradients()
    monkeypatch.setattr(layers, "attention_probabilities", materialised_probabilities)
    monkeypatch.setattr(layers, "attend", materialised_attend)
    expected_loss, expected_gradients = loss_and_gradients()
    torch.testing.assert_close(loss, expected_loss)
    assert gradients.keys() == expected_gradients.keys()
    for name, gradient in gradients.items():
        torch.testing.assert_close(gradient, expected_gradients[name], msg=name)


def zero_relations(model):
    with torch.no_grad():
        for parameter in model.relations.parameters():
            parameter.zero_()


def test_zero_relation_embeddings_with_input_positions_is_recboles_sasrec(timed_config):
    overrides = dict(timed_config, input_position_embedding=True, **NO_DROPOUT)
    config, train, _, test = prepare("TiSASRec", overrides, dataset="timed")
    model = TiSASRec(config, train._dataset)
    zero_relations(model)
    assert_same_as_recbole(model, SASRec(config, train._dataset), config, train, test)


def test_zero_interval_embeddings_leave_only_positions(timed_config):
    """Without interval embeddings the timestamps no longer matter; with them they do."""
    config, train, _, test = prepare("TiSASRec", dict(timed_config), dataset="timed")
    model = TiSASRec(config, train._dataset).eval()
    batch = first_batch(test)
    times = batch[model.TIME_SEQ]
    other_times = batch[torch.arange(len(batch))]  # a copy
    other_times.update(type(batch)({model.TIME_SEQ: times[:, :1] + (times - times[:, :1]) ** 1.3}))
    with torch.no_grad():
        assert not torch.allclose(
            model.full_sort_predict(batch), model.full_sort_predict(other_times)
        )
        model.relations.interval_key.weight.zero_()
        model.relations.interval_value.weight.zero_()
        torch.testing.assert_close(
            model.full_sort_predict(batch), model.full_sort_predict(other_times)
        )


def test_tisasrec_trains_under_sasrec_protocol_and_sampled_scoring(timed_config, caplog):
    """The authors' loss (all positions, BCE) under ``--protocol=sasrec`` (its causality
    check included), uni100 through the fast sampled scorer (no fallback warning)."""
    with caplog.at_level(logging.WARNING):
        summary = run(
            "TiSASRec", "timed", cmd_overrides=dict(timed_config, epochs=2, protocol="sasrec")
        )
    assert summary["protocol"]["label"].startswith("sasrec")
    assert 0.0 < summary["test_result"]["hit@10"] <= 1.0
    assert "differs from its full-sort scores" not in caplog.text
    assert "evenly spaced" not in caplog.text


def test_order_only_timestamps_are_reported(small_config, caplog):
    with caplog.at_level(logging.WARNING):
        config, train, _, _ = prepare("TiSASRec", dict(small_config))
        TiSASRec(config, train._dataset)
    assert "evenly spaced timestamps" in caplog.text and "|i - j|" in caplog.text


def test_recommend_reads_the_timestamps(timed_config):
    from recbole_freq.jobs.recommend import user_inputs

    config, train, valid, test = prepare("TiSASRec", dict(timed_config), dataset="timed")
    model = TiSASRec(config, train._dataset).eval()
    splits = (train._dataset, valid._dataset, test._dataset)
    test_rows = test._dataset.inter_feat
    uids = test_rows[model.USER_ID].numpy()
    item_seq, item_seq_len, extra = user_inputs(model, splits, uids, "test")
    assert torch.equal(item_seq, test_rows[model.ITEM_SEQ])
    assert torch.equal(extra[model.TIME_SEQ], test_rows[model.TIME_SEQ])
    _, lengths, after = user_inputs(model, splits, uids, "next")
    last = after[model.TIME_SEQ][torch.arange(len(uids)), lengths - 1]
    assert model.INTERVAL_TIME_FIELD == "real_time"
    assert torch.equal(last, test_rows["real_time"].to(last.dtype))


def test_tisasrec_is_a_baseline_with_the_authors_settings(timed_config):
    config, train, _, _ = prepare("TiSASRec", {"data_path": timed_config["data_path"]}, "timed")
    assert "TiSASRec" in BASELINES
    assert (config["hidden_size"], config["n_heads"], config["time_span"]) == (50, 1, 256)
    model = TiSASRec(config, train._dataset)
    assert model.embedding.position_embedding is None and model.relations is not None


@pytest.mark.parametrize(
    "model, overrides, message",
    [
        ("TiSASRec", {"time_span": 0}, "time_span=0 must be an integer >= 1"),
        ("TiSASRec", {"attention_operator": "chebyshev"}, "not available with attention_"),
        ("FMLPRec", {"time_intervals": True}, "token_mixer='filter' (FMLP-Rec) has none"),
        ("DuoRec", {"time_intervals": True}, "not available for DuoRec"),
        ("PolyRec", {"time_intervals": True}, "not available for PolyRec"),
        ("RecDenoiser", {"backbone": "TiSASRec", "time_intervals": False}, "leave time_interv"),
        ("BERT4RecDenoiser", {"backbone": "TiSASRec"}, "use --model=RecDenoiser"),
    ],
)
def test_bad_time_interval_settings_are_refused(timed_config, model, overrides, message):
    from recbole_freq.model import MODELS

    config, train, _, _ = prepare(model, dict(timed_config, **overrides), dataset="timed")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MODELS[model](config, train._dataset)


def test_a_dataset_without_timestamps_is_refused(timed_config):
    """RecBole's sequential splits need a time field; a dataset object without one (as
    a user's own pipeline could give) is refused by name."""
    config, train, _, _ = prepare("TiSASRec", dict(timed_config), dataset="timed")
    dataset = train._dataset.copy(train._dataset.inter_feat)
    dataset.inter_feat = type(dataset.inter_feat)(
        {
            k: v
            for k, v in dataset.inter_feat.interaction.items()
            if k not in ("timestamp", "real_time")
        }
    )
    with pytest.raises(ValueError, match="needs timestamps.*add it to load_col"):
        TiSASRec(config, dataset)


def test_recdenoiser_on_tisasrec_with_all_ones_masks_is_tisasrec(timed_config):
    shared = dict(timed_config, hidden_act="gelu", layer_norm_eps=1e-12, **NO_DROPOUT)
    overrides = dict(shared, backbone="TiSASRec", sparsity_beta=0.0, jacobian_gamma=0.0)
    config, train, _, test = prepare("RecDenoiser", overrides, dataset="timed")
    denoiser = RecDenoiser(config, train._dataset)
    assert denoiser.relations is not None and denoiser.embedding.position_embedding is None
    plain_config, _, _, _ = prepare("TiSASRec", shared, dataset="timed")
    plain = TiSASRec(plain_config, train._dataset)
    assert_all_ones_masks_give_the_backbone(denoiser, plain, first_batch(test))
    summary = run(
        "RecDenoiser", "timed", cmd_overrides=dict(timed_config, backbone="TiSASRec", epochs=1)
    )
    assert summary["epochs_run"] == 1 and summary["model_report"]["learned_masks"]


def test_real_times_reach_tisasrec_to_the_second(timed_config, caplog):
    """real_time joins load_col by itself and is read in float64 (compat fix 19; RecBole's
    float32 rounds unix seconds to 128 s), so the 1 s and 2 s gaps of the file arrive."""
    with caplog.at_level(logging.INFO):
        config, train, _, _ = prepare("TiSASRec", dict(timed_config), dataset="timed")
        model = TiSASRec(config, train._dataset)
    assert "real_time" in config["load_col"]["inter"]
    assert "time intervals from 'real_time', the source's real times in seconds" in caplog.text
    assert "float32" not in caplog.text and "evenly spaced" not in caplog.text
    feat = train._dataset.inter_feat
    assert feat["real_time"].dtype == torch.float64
    gaps = set()
    for row in range(len(feat)):
        length = int(feat[model.ITEM_SEQ_LEN][row])
        gaps.update(feat[model.TIME_SEQ][row, :length].diff().tolist())
    assert {1.0, 2.0, 5.0, 30.0} <= gaps and gaps <= set(map(float, GAPS)) | {0.0}


def test_real_times_join_a_load_col_the_user_gave(timed_config, caplog):
    # A RecBole user's yaml names the columns out of habit: TiSASRec took its intervals
    # from the order counter and blamed the data ("evenly spaced ... one-line format").
    given = dict(timed_config, load_col={"inter": ["user_id", "item_id", "timestamp"]})
    with caplog.at_level(logging.INFO):
        config, train, _, _ = prepare("TiSASRec", given, dataset="timed")
        TiSASRec(config, train._dataset)
    assert config["load_col"]["inter"] == ["user_id", "item_id", "timestamp", "real_time"]
    assert "real times in seconds (added to the load_col you gave)" in caplog.text
    assert "evenly spaced" not in caplog.text


def test_real_intervals_reach_tisasrec_from_a_raw_lastfm_file(tmp_path, small_config, caplog):
    """HetRec LastFM's millisecond times, through dataset_prep, are the intervals the
    model computes: its relation matrix equals the authors' on the raw seconds."""
    from dataset_prep import convert

    rng = random.Random(5)
    lines, raw_seconds = ["userID\tartistID\ttagID\ttimestamp"], {}
    for user in range(1, 31):
        time_ms = 1_275_000_000_000 + rng.randint(0, 10**9)
        for step in range(rng.randint(6, 12)):
            time_ms += rng.choice((1_000, 60_000, 3_600_000, 86_400_000, 7 * 86_400_000))
            artist = (user * 3 + step * rng.randint(1, 3)) % 20 + 1
            lines.append(f"{user}\t{artist}\t{rng.randint(1, 9)}\t{time_ms}")
            raw_seconds.setdefault(str(user), []).append((str(artist), time_ms / 1000))
    raw = tmp_path / "user_taggedartists-timestamps.dat"
    raw.write_text("\n".join(lines) + "\n")
    convert(raw, tmp_path / "data", "hetrec", fmt="lastfm-hetrec", core=1, show_progress=False)

    overrides = dict(small_config, data_path=str(tmp_path / "data"), time_span=64, **NO_DROPOUT)
    with caplog.at_level(logging.INFO):
        config, train, _, test = prepare("TiSASRec", overrides, dataset="hetrec")
        model = TiSASRec(config, train._dataset)
    assert "time intervals from 'real_time'" in caplog.text
    batch = first_batch(test)
    lengths = batch[model.ITEM_SEQ_LEN]
    matrix = time_interval_matrix(batch[model.TIME_SEQ], batch[model.ITEM_SEQ], time_span=64)
    dataset = train._dataset
    checked = 0
    for row in range(len(batch)):
        user = dataset.id2token(dataset.uid_field, int(batch[model.USER_ID][row]))
        length = int(lengths[row])
        items = dataset.id2token(dataset.iid_field, batch[model.ITEM_SEQ][row, :length].numpy())
        seen, times = set(), []
        for artist, seconds in raw_seconds[idmap_user(tmp_path, user)]:
            if artist not in seen:  # dataset_prep keeps each artist's first tag row
                seen.add(artist)
                times.append((artist, seconds))
        times.sort(key=lambda pair: pair[1])
        assert [idmap_item(tmp_path, token) for token in items] == [a for a, _ in times[:length]]
        expected = authors_relation([seconds for _, seconds in times[:length]], time_span=64)
        assert matrix[row, :length, :length].tolist() == expected
        checked += 1
    assert checked >= 10 and matrix.max() > 1


def idmap_user(root, token):
    import json

    return json.loads((root / "data" / "hetrec" / "hetrec.idmap.json").read_text())["user"][
        int(token) - 1
    ]


def idmap_item(root, token):
    import json

    return json.loads((root / "data" / "hetrec" / "hetrec.idmap.json").read_text())["item"][
        int(token) - 1
    ]


def test_unix_times_held_in_float32_are_reported(tmp_path, small_config, caplog):
    """A dataset whose only times are unix seconds in TIME_FIELD (RecBole's float32):
    the run says that gaps under the rounding step are lost and how to keep them."""
    (tmp_path / "unix").mkdir()
    rows = ["user_id:token\titem_id:token\ttimestamp:float"]
    for user in range(1, 21):
        for step in range(8):
            rows.append(f"{user}\t{(user + step) % 15 + 1}\t{1_600_000_000 + 37 * step * user}")
    (tmp_path / "unix" / "unix.inter").write_text("\n".join(rows) + "\n")
    with caplog.at_level(logging.INFO):
        config, train, _, _ = prepare(
            "TiSASRec", dict(small_config, data_path=str(tmp_path)), "unix"
        )
        TiSASRec(config, train._dataset)
    assert "time intervals from TIME_FIELD 'timestamp'" in caplog.text
    assert "holds 'timestamp' in float32, which rounds times near 1.6e+09 to multiples of 128" in (
        caplog.text
    )


def test_times_at_the_ends_of_the_float_range_are_the_farthest_interval(small_config, tmp_path):
    # Finite real times of +-1.7e308 overflow in their differences (inf in float32):
    # NaN became the index -2**63 and TiSASRec crashed on data dataset_prep accepted.
    times = torch.tensor([[1.0, 2.0, 1.7e308, -1.7e308, math.inf, -math.inf, 5.0]])
    items = torch.ones(1, 7, dtype=torch.long)
    for dtype in (torch.float64, torch.float32):
        matrix = time_interval_matrix(times.to(dtype), items, time_span=8)
        assert matrix.min() >= 0 and matrix.max() == 8
        assert matrix.diagonal(dim1=1, dim2=2).abs().sum() == 0
        assert matrix[0, 0, 1] == 1 and matrix[0, 0, 2] == 8
    from dataset_prep import convert

    rows = ["user_id,item_id,timestamp"]
    for user in range(30):
        for step in range(8):
            time = 1_600_000_000 + 60 * step
            if user == 3 and step in (2, 5):
                time = -1.7e308 if step == 2 else 1.7e308
            rows.append(f"u{user},i{(user + step) % 20},{time!r}")
    (tmp_path / "log.csv").write_text("\n".join(rows) + "\n")
    convert(tmp_path / "log.csv", tmp_path / "data", "far", fmt="csv", core=1, show_progress=False)
    summary = run("TiSASRec", "far", config_dict=dict(small_config, epochs=1, data_path=str(tmp_path / "data")))  # fmt: skip
    assert math.isfinite(summary["history"][0]["train_loss"])
