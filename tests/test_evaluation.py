"""Sampled evaluation through full-sort scores (``recbole_freq.protocol.sampled_scoring``)."""

import logging
from pathlib import Path

import pytest
import torch
from recbole.data import create_dataset, data_preparation
from recbole.utils import init_seed

from conftest import first_batch, without_transformer_settings
from recbole_freq.config.configurator import FreqConfig, get_model_class, properties_dir
from recbole_freq.model import BERT4RecDenoiser, RecDenoiser
from recbole_freq.protocol import trainer as trainer_module
from recbole_freq.protocol.sampled_scoring import SampledScorer, batch_sampled_collate
from recbole_freq.quick_start.quick_start import run

UNI100 = str(properties_dir() / "protocol" / "uni100.yaml")


def uni100_model(name, small_config):
    if name == "GRU4Rec":
        small_config = without_transformer_settings(small_config)
    config = FreqConfig(name, "tiny", [UNI100], cmd_overrides=small_config)
    init_seed(config["seed"], config["reproducibility"])
    train, _, test = data_preparation(config, create_dataset(config))
    init_seed(config["seed"], config["reproducibility"])
    model = get_model_class(name)(config, train._dataset)
    return model.eval(), next(iter(test))[0]


@pytest.mark.parametrize("name", ["SASRec", "GRU4Rec", "BERT4Rec", "BSARec"])
def test_sampled_scores_equal_the_models_own_predict(small_config, name):
    model, batch = uni100_model(name, small_config)
    with torch.no_grad():
        own = model.predict(batch)
        scorer = SampledScorer(model)
        calls = []
        original = model.full_sort_predict
        model.full_sort_predict = lambda interaction: (
            calls.append(len(interaction)) or original(interaction)
        )
        scores = scorer(batch)
    distinct = torch.unique(batch["item_id_list"], dim=0).size(0)
    assert calls == [distinct] and distinct * 50 < len(batch)  # once per user, 101 rows each
    assert scorer.consistent and scorer.verified
    torch.testing.assert_close(scores, own, rtol=1e-5, atol=1e-5)


def test_a_predict_that_is_not_the_full_sort_score_falls_back_with_a_warning(small_config, caplog):
    model, batch = uni100_model("SASRec", small_config)
    with torch.no_grad():
        own = model.predict(batch)
        model.predict = lambda interaction, own=model.predict: own(interaction) + 1.0
        scorer = SampledScorer(model)
        with caplog.at_level(logging.WARNING):
            scores = scorer(batch)
    assert not scorer.consistent
    assert "differs from its full-sort scores" in caplog.text
    torch.testing.assert_close(scores, own + 1.0)


def test_uni100_run_of_a_recbole_baseline_matches_its_own_predict(small_config, monkeypatch):
    """End to end: the same training, tested with and without the full-sort scorer."""
    overrides = dict(small_config, epochs=1)
    fast = run("SASRec", "wide", config_files=[UNI100], cmd_overrides=overrides, saved=False)
    monkeypatch.setattr(trainer_module, "SampledScorer", lambda model: None)
    slow = run("SASRec", "wide", config_files=[UNI100], cmd_overrides=overrides, saved=False)
    for metric, value in slow["test_result"].items():
        assert fast["test_result"][metric] == pytest.approx(value, abs=1e-4), metric


def test_uni100_protocol_file(small_config):
    protocol = properties_dir() / "protocol" / "uni100.yaml"
    summary = run(
        "RecDenoiser",
        "wide",
        config_files=[str(protocol)],
        cmd_overrides=dict(small_config, epochs=1),
        saved=False,
    )
    assert summary["config"]["eval_args"]["mode"] == {"valid": "uni100", "test": "uni100"}
    assert summary["valid_metric"] == "NDCG@10" and "hit@10" in summary["test_result"]
    assert summary["protocol"]["label"] == "uni100"
    full = properties_dir() / "protocol" / "recbole.yaml"
    assert "mode: full" in full.read_text()


@pytest.mark.parametrize("model", ["RecDenoiser", "BERT4RecDenoiser"])
def test_sampled_evaluation_encodes_each_sequence_once_with_the_same_scores(small_config, model):
    """A uni100 batch repeats each user's sequence once per candidate; the sampled scorer
    the trainer uses (``protocol.sampled_scoring.SampledScorer``) encodes each distinct
    sequence once and must score exactly as ``predict`` row by row."""
    protocol = str(properties_dir() / "protocol" / "uni100.yaml")
    config = FreqConfig(model, "tiny", [protocol], cmd_overrides=small_config)
    init_seed(config["seed"], config["reproducibility"])
    _, _, test = data_preparation(config, create_dataset(config))
    recommender = {"RecDenoiser": RecDenoiser, "BERT4RecDenoiser": BERT4RecDenoiser}[model](
        config, test._dataset
    )
    with torch.no_grad():
        for operator in [block.mixer.attention.operator for block in recommender.encoder.blocks]:
            operator.phi.copy_(torch.randn_like(operator.phi))
    recommender.eval()
    batch = first_batch(test)
    item_seq, lengths = batch["item_id_list"], batch["item_length"]
    assert torch.unique(item_seq, dim=0).size(0) * 50 < item_seq.size(0)  # 101 rows a user

    calls = []
    recommender.encoder.register_forward_hook(
        lambda module, args, output: calls.append(args[0].size(0))
    )
    with torch.no_grad():
        scores = SampledScorer(recommender)(batch)
        distinct_calls = len(calls)
        every_row = recommender.forward(item_seq, lengths)  # no deduplication
    items = batch["item_id"]
    expected = (every_row * recommender.item_embedding(items)).sum(-1)
    if model == "BERT4RecDenoiser":
        expected = expected + recommender.output_bias[items]
    # One full-sort pass over the distinct sequences, then the scorer's one-time check of
    # its first two sequences against the model's own predict.
    assert calls[0] == torch.unique(item_seq, dim=0).size(0) and distinct_calls == 2
    assert calls[-1] == len(item_seq)
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-6)
    assert scores.shape == lengths.shape


def _batches(loader, seed):
    import numpy as np

    np.random.seed(seed)  # RecBole's samplers draw from numpy's global stream
    return [batch for batch in loader]


@pytest.mark.parametrize(
    "case",
    [
        {"protocol": "uni100"},  # RecBole's RepeatableSampler, one row a user
        {"protocol": "sasrec"},  # the protocol's unseen-item sampler (rows.UnseenSampler)
        {  # several test rows a user: a ratio split grouped by user
            "protocol": "uni100",
            "eval_args": {
                "split": {"RS": [0.6, 0.2, 0.2]},
                "order": "TO",
                "group_by": "user",
                "mode": {"valid": "uni100", "test": "uni100"},
            },  # fmt: skip
        },
    ],
    ids=["uni100", "sasrec-unseen", "several-rows-a-user"],
)
def test_the_batched_sampled_collate_gives_recboles_batches_to_the_bit(small_config, case):
    """``sampled_scoring.batch_sampled_collate`` replaces RecBole's user-by-user
    ``collate_fn``: from the same random state it must give the same rows, negatives,
    labels and index tensors, batch by batch."""
    from conftest import prepare
    from recbole_freq.protocol.sampled_scoring import _batched_collate

    overrides = dict(small_config, eval_batch_size=303, **case)
    _, _, valid, test = prepare("SASRec", overrides, dataset="wide")
    for loader in (valid, test):
        own = _batches(loader, seed=7)
        assert batch_sampled_collate(loader)
        assert loader.collate_fn.__func__ is _batched_collate
        batched = _batches(loader, seed=7)
        assert len(own) == len(batched) > 1
        for (a, *a_index), (b, *b_index) in zip(own, batched):
            # RecBole's cat_interactions orders the fields by a set: only the set is its.
            assert set(a.interaction) == set(b.interaction)
            for field in a.interaction:
                assert a[field].dtype == b[field].dtype, field
                assert torch.equal(a[field], b[field]), field
            for x, y in zip(a_index, b_index):
                assert x.dtype == y.dtype and torch.equal(x, y)
    if "eval_args" in case:
        assert int(test.uid2items_num.max()) > 1
    expected = {"uni100": "RepeatableSampler", "sasrec": "UnseenSampler"}[case["protocol"]]
    assert type(test._sampler).__name__ == expected  # each fast draw path is exercised


def test_the_batched_collate_leaves_full_sort_and_dynamic_loaders_alone(small_config):
    from conftest import prepare

    _, train, valid, _ = prepare("SASRec", dict(small_config), dataset="wide")
    assert not batch_sampled_collate(valid)  # full sort
    assert not batch_sampled_collate(train)


def test_equal_runs_groups_consecutive_rows_only():
    from recbole_freq.protocol.sampled_scoring import equal_runs

    key = torch.tensor([[1, 2], [1, 2], [3, 4], [1, 2], [1, 2], [1, 2]])
    first, run = equal_runs(key)
    assert first.tolist() == [0, 2, 3] and run.tolist() == [0, 0, 1, 2, 2, 2]
    first, run = equal_runs(key[:1])
    assert first.tolist() == [0] and run.tolist() == [0]


def test_a_whole_sampled_pass_gives_the_same_metrics_as_recboles_way(tiny_data, tmp_path):
    """``benchmarks/bench_sampled_pass.py`` on small data: the trainer's evaluation with
    RecBole's user-by-user loader and the sort-based grouping, and with today's, from the
    same random state, give the same metrics (the script refuses to report otherwise)."""
    import importlib.util

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_sampled_pass.py"
    spec = importlib.util.spec_from_file_location("bench_sampled_pass", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.main(
        [
            "--dataset",
            "wide",
            "--data_path",
            str(tiny_data),
            "--rounds",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert result["metrics_equal"] and result["users"] == 60
    assert (tmp_path / "sampled-pass-sasrec-wide-cpu.md").is_file()
    assert "--data_path DATA" in (tmp_path / "sampled-pass-sasrec-wide-cpu.md").read_text()
