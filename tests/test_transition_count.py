"""TransitionCount, the count baseline: its scores against counts taken independently from
the raw sequences, under each protocol's training rows, through the real pipeline."""

from collections import Counter

import pytest
import torch

from conftest import prepare, without_transformer_settings
from recbole_freq.model import BASELINES, MODELS, TransitionCount
from recbole_freq.quick_start.quick_start import run


@pytest.fixture
def count_config(small_config):
    return without_transformer_settings(small_config)


def raw_sequences(data_path) -> dict[str, list[str]]:
    """User token -> item tokens, from the one-line file the ``tiny`` dataset was made of."""
    lines = (data_path / "tiny.txt").read_text().split("\n")
    return {parts[0]: parts[1:] for parts in (line.split() for line in lines) if parts}


def oracle_counts(sequences, window: int | None) -> Counter:
    """Transitions of each user's training part (all but the validation and test items),
    of its last ``window`` items only when given."""
    counts = Counter()
    for items in sequences.values():
        train = items[:-2]
        if window is not None:
            train = train[-window:]
        counts.update(zip(train[:-1], train[1:]))
    return counts


def oracle_scores(model, dataset, counts: Counter, rows_items: list[list[str]]):
    """``score(c) = sum_j N(i_j, c) (P_max + 1) + P(c)`` over the rows' last k items,
    written out over tokens."""
    popularity = Counter()
    for (_, target), n in counts.items():
        popularity[target] += n
    top = max(popularity.values())
    tokens = dataset.field2id_token[dataset.iid_field]
    scores = torch.zeros(len(rows_items), len(tokens), dtype=torch.float64)
    for row, items in enumerate(rows_items):
        recent = items[-model.last_k :]
        for index in range(1, len(tokens)):
            votes = sum(counts[(item, tokens[index])] for item in recent)
            scores[row, index] = votes * (top + 1) + popularity[tokens[index]]
    return scores


def test_test_rows_score_as_the_counts_of_the_raw_training_parts(tiny_data, count_config):
    for last_k in (1, 5):
        config, train, _, test = prepare("TransitionCount", dict(count_config, count_last_k=last_k))
        model = TransitionCount(config, train._dataset)
        batch = next(iter(test))[0]
        dataset = train._dataset
        tokens = dataset.field2id_token[dataset.iid_field]
        rows_items = [
            [tokens[i] for i in seq[: int(length)].tolist()]
            for seq, length in zip(batch["item_id_list"], batch["item_length"])
        ]
        # Every prefix a training row (protocol recbole): every pair of the training part.
        counts = oracle_counts(raw_sequences(tiny_data), window=None)
        expected = oracle_scores(model, dataset, counts, rows_items)
        scores = model.full_sort_predict(batch)
        torch.testing.assert_close(scores[:, 1:], expected[:, 1:], rtol=0, atol=0)
        items = batch["item_id"]
        torch.testing.assert_close(model.predict(batch), scores[torch.arange(len(items)), items])


@pytest.mark.parametrize("protocol,window", [("sasrec", 13), ("bsarec", 12)])
def test_counts_follow_the_protocols_training_rows(tiny_data, count_config, protocol, window):
    """SASRec's rows train every position of the last n + 1 training items (n = 12), the
    BSARec authors' rows the last n: the counts are those rows' transitions, no more."""
    config, train, _, _ = prepare("TransitionCount", dict(count_config, protocol=protocol))
    model = TransitionCount(config, train._dataset)
    tokens = train._dataset.field2id_token[train._dataset.iid_field]
    counted = Counter(
        {
            (tokens[source], tokens[target]): int(count)
            for (source, target), count in zip(
                model.transition_pairs.t().tolist(), model.transition_counts.tolist()
            )
        }
    )
    assert counted == oracle_counts(raw_sequences(tiny_data), window=window)
    assert counted != oracle_counts(raw_sequences(tiny_data), window=None)  # windows bite


def test_ties_go_to_the_more_popular_item(count_config):
    config, train, _, test = prepare("TransitionCount", count_config)
    model = TransitionCount(config, train._dataset)
    batch = next(iter(test))[0]
    scores = model.full_sort_predict(batch)
    votes = torch.sparse.mm(
        model.successors(), model.recent_items(batch["item_id_list"], batch["item_length"]).t()
    ).t()
    for row in range(len(scores)):
        unseen = (votes[row] == 0).nonzero().flatten()
        unseen = unseen[unseen > 0]
        order = unseen[scores[row, unseen].argsort(descending=True)]
        assert (model.popularity[order].diff() <= 0).all()  # popularity decides among them
        seen = (votes[row] > 0).nonzero().flatten()
        if len(seen) and len(unseen):
            assert scores[row, seen].min() > scores[row, unseen].max()  # a count beats none


def test_runs_through_recbole_as_one_evaluation_under_each_protocol(count_config):
    # sasrec: 100 sampled negatives per target (uni100), scored through predict
    for protocol, dataset in (("recbole", "tiny"), ("bsarec", "tiny"), ("sasrec", "wide")):
        result = run(
            model="TransitionCount",
            dataset=dataset,
            config_dict=dict(count_config, protocol=protocol, epochs=50),
            saved=False,
        )
        assert len(result["history"]) == 1, protocol  # nothing to train: one validation
        assert result["history"][0]["train_loss"] == 0.0
        assert 0 < result["test_result"]["hit@20"] <= 1
    assert "TransitionCount" in MODELS and "TransitionCount" in BASELINES


def test_bad_last_k_is_one_clear_line(count_config):
    config, train, _, _ = prepare("TransitionCount", dict(count_config, count_last_k=0))
    with pytest.raises(ValueError, match="count_last_k=0 must be an integer >= 1"):
        TransitionCount(config, train._dataset)


def test_a_comparison_marks_every_metric_not_above_the_count_baselines(small_config, tmp_path):
    import csv

    from recbole_freq.jobs.compare import compare

    overrides = {key: value for key, value in small_config.items() if key not in ("seed", "state")}
    out = tmp_path / "cmp"
    # A count baseline first: its row, without a trained row's columns, heads the csv.
    entries = "TransitionCount,SASRec,TransitionCount@variant=last-5"
    compare(entries, "tiny", seeds="5", overrides=dict(overrides, epochs=1), out=out)
    with open(out / "comparison.csv", newline="") as handle:
        rows = {row["model"]: row for row in csv.DictReader(handle)}
    counts = ("TransitionCount", "TransitionCount [last-5]")
    assert [rows[name]["count_baseline"] for name in counts] == ["True", "True"]
    assert rows["SASRec"]["count_baseline"] == "False"
    assert rows["SASRec"]["capped_runs"] == "1" and rows["TransitionCount"]["capped_runs"] == ""
    markdown = (out / "comparison.md").read_text()
    sasrec_line = next(line for line in markdown.splitlines() if line.startswith("| SASRec"))
    cells = [cell.strip() for cell in sasrec_line.strip("|").split("|")]
    metrics = ("hit@5", "hit@10", "hit@20", "ndcg@5", "ndcg@10", "ndcg@20")
    header = [cell.strip() for cell in markdown.splitlines()[0].strip("|").split("|")]
    for metric in metrics:
        floor = max(float(rows[name][f"{metric}_mean"]) for name in counts)
        above = float(rows["SASRec"][f"{metric}_mean"]) > floor
        assert rows["SASRec"][f"{metric}_above_counts"] == str(above)
        assert cells[header.index(metric)].endswith("†") is not above, metric
    assert "Count baselines (TransitionCount, TransitionCount [last-5])" in markdown
    assert rows["TransitionCount"]["loss"] == "none (counts of the training rows)"
    assert "Gain over each loss" not in markdown  # a variant is not another loss
