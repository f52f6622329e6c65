"""Protocols (``recbole_freq.protocol``): each piece against an oracle written here from
the published algorithms (the BSARec authors' ``src/dataset.py``, ``src/trainers.py``,
``src/metrics.py``, ``src/utils.py``; the SASRec evaluation), on the real RecBole
pipeline and a small dataset with repeated items and users shorter than n."""

import json
import math
import random

import numpy as np
import pytest
import torch

from conftest import without_transformer_settings
from dataset_prep import convert_one_line
from recbole_freq.config.configurator import FreqConfig
from recbole_freq.protocol import (
    HISTORY_LENGTH,
    POSITION_TARGETS,
    ProtocolError,
    position_negatives,
    protocol_label,
    protocol_names,
    protocol_settings,
    row_negatives,
    trainer_for,
)
from recbole_freq.quick_start.quick_start import load_splits, new_model, run

N = 6  # MAX_ITEM_LIST_LENGTH: shorter than most users, longer than some


@pytest.fixture(scope="module")
def repeat_data(tmp_path_factory):
    """40 users of 4 to 14 interactions over 25 items: items repeat within a user, and a
    test target is often an item of the user's history."""
    root = tmp_path_factory.mktemp("repeat")
    rng = random.Random(3)
    lines = []
    for user in range(1, 41):
        length = rng.randint(4, 14)
        items = [rng.randint(1, 25) for _ in range(length)]
        if user % 4 == 0:
            items[-1] = items[0]  # a repeated test target
        lines.append(" ".join(map(str, [user, *items])))
    raw = root / "repeat.txt"
    raw.write_text("\n".join(lines) + "\n")
    convert_one_line(raw, root, "repeat", show_progress=False)
    sequences = {str(u): [str(i) for i in line.split()[1:]] for u, line in enumerate(lines, 1)}
    return root, sequences


def settings(data_root, tmp_path, **extra):
    return {
        "data_path": str(data_root),
        "checkpoint_dir": str(tmp_path / "saved"),
        "MAX_ITEM_LIST_LENGTH": N,
        "hidden_size": 16,
        "inner_size": 32,
        "n_heads": 2,
        "n_layers": 1,
        "train_batch_size": 32,
        "eval_batch_size": 64,
        "epochs": 1,
        "show_progress": False,
        "state": "WARNING",
        "log_wandb": False,
        "seed": 7,
        "metric_decimal_place": 10,
        **extra,
    }


def rows_of(loader):
    """``(user, input, target)`` tokens of every row of a sequential loader's dataset."""
    dataset = loader._dataset
    feat = dataset.inter_feat
    users = dataset.id2token(dataset.uid_field, feat[dataset.uid_field].numpy())
    targets = dataset.id2token(dataset.iid_field, feat[dataset.iid_field].numpy())
    rows = []
    for user, items, length, target in zip(
        users, feat["item_id_list"].numpy(), feat["item_length"].numpy(), targets
    ):
        real = [i for i in items[:length] if i != 0]
        rows.append((user, tuple(dataset.id2token(dataset.iid_field, real)), target))
    return sorted(rows)


def authors_training_rows(sequences, n):
    """``RecDataset(data_type='train')`` of the BSARec authors, with ``__getitem__``."""
    rows = []
    for user, seq in sequences.items():
        input_ids = seq[-(n + 2) : -2]
        for i in range(len(input_ids)):
            items = input_ids[: i + 1]
            rows.append((user, tuple(items[:-1][-n:]), items[-1]))
    return sorted(rows)


def test_window_rows_are_the_authors_training_rows(repeat_data, tmp_path):
    root, sequences = repeat_data
    config = FreqConfig(
        "SASRec", "repeat", cmd_overrides=settings(root, tmp_path, train_rows="window")
    )
    _, (train, valid, test) = load_splits(config)
    assert rows_of(train) == authors_training_rows(sequences, N)
    # Validation and test inputs: seq[:-2] and seq[:-1], their last n items, uncut.
    assert rows_of(valid) == sorted((u, tuple(s[:-2][-N:]), s[-2]) for u, s in sequences.items())
    assert rows_of(test) == sorted((u, tuple(s[:-1][-N:]), s[-1]) for u, s in sequences.items())
    # An empty input is one padding item, so models read position 0.
    empty = train._dataset.inter_feat["item_id_list"].sum(1) == 0
    assert empty.any() and (train._dataset.inter_feat["item_length"][empty] == 1).all()

    default = FreqConfig("SASRec", "repeat", cmd_overrides=settings(root, tmp_path))
    _, (recbole_train, _, _) = load_splits(default)
    expected = sorted(
        (u, tuple(s[:j][-N:]), s[j]) for u, s in sequences.items() for j in range(1, len(s) - 2)
    )
    assert rows_of(recbole_train) == expected


def test_window_row_counts_on_ml_100k(tmp_path):
    """The counts the issue measured: 39,157 window rows against RecBole's 97,171."""
    counts = {}
    for rows in ("window", "all_prefixes"):
        config = FreqConfig(
            "SASRec", "ml-100k", cmd_overrides={"train_rows": rows, "state": "WARNING"}
        )
        _, (train, _, _) = load_splits(config)
        counts[rows] = len(train._dataset)
    assert counts == {"window": 39157, "all_prefixes": 97171}


def authors_ranking_metrics(scores, answers, histories, ks, padding=True, fill=0.0):
    """Per user ``(best, worst)`` HR and NDCG at each k of the authors' ranking
    (``Trainer.iteration``, ``metrics.py``): history scores set to ``fill``, padding kept
    (``padding=True``) or excluded; ties with the target give a best and a worst rank."""
    bounds = {}
    for k in ks:
        bounds[f"hit@{k}"] = [0.0, 0.0]
        bounds[f"ndcg@{k}"] = [0.0, 0.0]
    for row, answer in enumerate(answers):
        pred = scores[row].copy()
        if not padding:
            pred[0] = -np.inf
        pred[list(histories[row])] = fill
        target = pred[answer]  # minus infinity ties with every excluded item
        greater = int((pred > target).sum())
        tied = int((pred == target).sum()) - 1
        best, worst = greater + 1, greater + tied + 1
        for k in ks:
            for slot, rank in ((0, worst), (1, best)):
                if rank <= k:
                    bounds[f"hit@{k}"][slot] += 1.0
                    bounds[f"ndcg@{k}"][slot] += 1.0 / math.log2(rank + 1)
    users = len(answers)
    return {key: (low / users, high / users) for key, (low, high) in bounds.items()}


def history_oracle_inputs(model, test, sequences, phase_cut=1):
    dataset = test._dataset
    scores, answers, histories = [], [], []
    model.eval()
    with torch.no_grad():
        for batch in test:
            interaction = batch[0]
            scores.append(model.full_sort_predict(interaction).view(len(interaction), -1))
            users = dataset.id2token(dataset.uid_field, interaction["user_id"].numpy())
            for user, target in zip(users, interaction["item_id"].numpy()):
                seq = sequences[user]
                histories.append(set(dataset.token2id(dataset.iid_field, seq[:-phase_cut])))
                answers.append(int(target))
    return torch.cat(scores).numpy().astype(np.float64), answers, histories


@pytest.mark.parametrize("mask", ["zero", "exclude", "none"])
def test_history_masked_ranking_matches_the_authors_algorithm(repeat_data, tmp_path, mask):
    root, sequences = repeat_data
    config = FreqConfig(
        "BSARec", "repeat", cmd_overrides=settings(root, tmp_path, history_mask=mask)
    )
    _, (train, valid, test) = load_splits(config)
    model = new_model(config, train)
    trainer = trainer_for(config, model)
    ours = trainer.evaluate(test, load_best_model=False)
    scores, answers, histories = history_oracle_inputs(model, test, sequences)
    assert any(a in h for a, h in zip(answers, histories))  # repeated targets exist
    if mask == "none":
        histories = [set()] * len(answers)
    oracle = authors_ranking_metrics(
        scores,
        answers,
        histories,
        (5, 10, 20),
        padding=mask == "zero",
        fill=0.0 if mask == "zero" else -np.inf,
    )
    for key, (low, high) in oracle.items():
        assert low - 1e-7 <= ours[key] <= high + 1e-7, (key, ours[key], low, high)
    if mask == "zero":
        # Keeping the padding item is part of the protocol: excluding it changes NDCG.
        excluded = authors_ranking_metrics(scores, answers, histories, (20,), padding=False)
        low, high = excluded["ndcg@20"]
        assert not low - 1e-7 <= ours["ndcg@20"] <= high + 1e-7


def test_validation_masks_the_history_before_its_own_target(repeat_data, tmp_path):
    """Validation masks ``seq[:-2]`` (the validation target itself stays ranked)."""
    root, sequences = repeat_data
    config = FreqConfig(
        "BSARec", "repeat", cmd_overrides=settings(root, tmp_path, history_mask="exclude")
    )
    _, (train, valid, _) = load_splits(config)
    model = new_model(config, train)
    ours = trainer_for(config, model).evaluate(valid, load_best_model=False)
    scores, answers, histories = history_oracle_inputs(model, valid, sequences, phase_cut=2)
    oracle = authors_ranking_metrics(
        scores, answers, histories, (5, 10, 20), padding=False, fill=-np.inf
    )
    for key, (low, high) in oracle.items():
        assert low - 1e-7 <= ours[key] <= high + 1e-7, key
    lengths = valid._dataset.inter_feat[HISTORY_LENGTH].numpy()
    users = valid._dataset.id2token("user_id", valid._dataset.inter_feat["user_id"].numpy())
    assert [int(n) for n in lengths] == [len(sequences[u]) - 2 for u in users]


def test_unseen_negatives_are_never_in_the_users_history(repeat_data, tmp_path):
    root, sequences = repeat_data
    drawn = {}
    for negatives in ("unseen", "target_only"):
        config = FreqConfig(
            "SASRec",
            "repeat",
            cmd_overrides=settings(
                root,
                tmp_path,
                protocol="uni100",
                eval_negatives=negatives,
                eval_args={
                    "split": {"LS": "valid_and_test"},
                    "order": "TO",
                    "group_by": "user",
                    "mode": "uni10",
                },
            ),
        )
        _, (_, valid, test) = load_splits(config)
        seen_as_negative = 0
        for loader in (valid, test):
            dataset = loader._dataset
            for _ in range(5):
                for interaction, _, _, positive_i in loader:
                    users = dataset.id2token("user_id", interaction["user_id"].numpy())
                    items = dataset.id2token("item_id", interaction["item_id"].numpy())
                    targets = set(dataset.id2token("item_id", positive_i.numpy()))
                    for user, item in zip(users, items):
                        if item in targets:
                            continue
                        seen_as_negative += item in sequences[user]
        drawn[negatives] = seen_as_negative
    assert drawn["unseen"] == 0
    assert drawn["target_only"] > 0  # RecBole's sampler does draw history items


def test_unseen_negatives_refused_when_a_user_saw_every_item(tmp_path):
    raw = tmp_path / "full.txt"
    # 101 items, enough for uni100, and every user saw each of them.
    every_item = " ".join(str(item) for item in [*range(1, 102), 1, 2])
    raw.write_text("\n".join(f"{u} {every_item}" for u in range(1, 6)) + "\n")
    convert_one_line(raw, tmp_path, "full", show_progress=False)
    config = FreqConfig(
        "SASRec",
        "full",
        cmd_overrides=settings(
            tmp_path, tmp_path, protocol="uni100", eval_negatives="unseen", topk=[1]
        ),
    )
    with pytest.raises(ProtocolError, match="all 101 items"):
        load_splits(config)


def test_protocol_bundles_and_their_priority(tiny_data, tmp_path):
    base = settings(tiny_data, tmp_path)
    base.pop("seed")
    assert {"recbole", "bsarec", "uni100"} <= set(protocol_names())
    config = FreqConfig("BSARec", "tiny", cmd_overrides=dict(base, protocol="bsarec"))
    assert (config["history_mask"], config["train_rows"], config["stopping_rule"]) == (
        "zero",
        "window",
        "strict",
    )
    assert config["seed"] == 42 and config["valid_metric"] == "NDCG@20"
    assert protocol_label(config) == "bsarec"
    # A piece given beside the protocol overrides it, and the label says so.
    config = FreqConfig(
        "BSARec", "tiny", cmd_overrides=dict(base, protocol="bsarec", history_mask="none")
    )
    assert protocol_label(config) == "bsarec+history_mask=none"
    # The paper's settings imply the paper's protocol, unless one is given.
    paper = FreqConfig("BSARec", "lastfm", paper=True, cmd_overrides=base)
    assert paper["protocol"] == "bsarec" and paper["train_rows"] == "window"
    assert paper["alpha"] == 0.9  # the paper file still wins over the protocol file
    mine = FreqConfig("BSARec", "lastfm", paper=True, cmd_overrides=dict(base, protocol="recbole"))
    assert mine["protocol"] == "recbole" and mine["train_rows"] == "all_prefixes"
    default = FreqConfig("BSARec", "tiny", cmd_overrides=base)
    assert protocol_label(default) == "recbole" and default["seed"] == 2020


def test_unknown_protocol_and_piece_are_one_line_errors(tiny_data, tmp_path):
    with pytest.raises(ProtocolError, match="unknown protocol 'bsa'.*bsarec"):
        FreqConfig("BSARec", "tiny", cmd_overrides=settings(tiny_data, tmp_path, protocol="bsa"))
    with pytest.raises(ProtocolError, match="history_mask='minus'.*zero, exclude"):
        run(
            "BSARec",
            "tiny",
            cmd_overrides=settings(tiny_data, tmp_path, history_mask="minus"),
            saved=False,
        )


def test_strict_stopping_rule_is_the_authors_early_stopping(tiny_data, tmp_path):
    """With a frozen model (learning rate 1e-12) every validation score ties.  RecBole's rule takes a tie as an
    improvement (never stops, keeps the last epoch); the authors' strict rule stops after
    ``stopping_step`` epochs without a higher score and keeps the first."""
    frozen = settings(tiny_data, tmp_path, epochs=5, stopping_step=2, learning_rate=1e-12)
    recbole = run("SASRec", "tiny", cmd_overrides=frozen, saved=False)
    assert recbole["epochs_run"] == 5 and recbole["best_epoch"] == 4
    strict = run("SASRec", "tiny", cmd_overrides=dict(frozen, stopping_rule="strict"), saved=False)
    assert strict["epochs_run"] == 3 and strict["best_epoch"] == 0
    assert strict["best_valid_score"] == pytest.approx(recbole["best_valid_score"], abs=1e-9)
    assert strict["protocol"]["label"] == "recbole+stopping_rule=strict"


@pytest.mark.parametrize("model", ["SASRec", "GRU4Rec", "BSARec", "PolyRec", "RecDenoiser"])
def test_every_model_trains_and_reports_under_the_bsarec_protocol(tiny_data, tmp_path, model):
    overrides = settings(tiny_data, tmp_path, protocol="bsarec", epochs=1)
    if model == "GRU4Rec":
        overrides = without_transformer_settings(overrides)
    summary = run(model, "tiny", cmd_overrides=overrides, saved=True)
    assert summary["protocol"]["label"] == "bsarec"
    assert all(math.isfinite(e["train_loss"]) for e in summary["history"])
    assert 0.0 <= summary["test_result"]["ndcg@20"] <= 1.0


def test_evaluate_one_checkpoint_under_several_protocols(small_config, tmp_path, capsys):
    from recbole_freq.cli import main
    from recbole_freq.jobs.evaluate import evaluate_checkpoint

    summary = run("BSARec", "tiny", cmd_overrides=dict(small_config, epochs=1))
    results = evaluate_checkpoint(
        summary["checkpoint"], ["recbole", "history_mask=zero", "bsarec", "mode=uni10"]
    )
    assert [r["protocol"] for r in results] == [
        "recbole",
        "recbole+history_mask=zero",
        "bsarec+train_rows=all_prefixes+stopping_rule=recbole+sequence_layout=right",
        "recbole+mode=uni10",
    ]
    # The recbole variant is the training run's own test, user by user too.
    for metric, value in summary["test_result"].items():
        assert results[0]["test_result"][metric] == pytest.approx(value, abs=1e-4)
    assert results[0]["test_per_user"] == summary["test_per_user"]
    from recbole_freq.jobs.compare.statistics import per_user_values

    for result in results:
        for metric, value in result["test_result"].items():
            _, values = per_user_values([result], metric)
            assert values.mean() == pytest.approx(value, abs=1e-4), (result["variant"], metric)
    # bsarec ranks as history_mask=zero does; masking the history lifts the metrics here.
    assert results[2]["test_result"] == results[1]["test_result"]
    assert results[1]["test_result"]["ndcg@20"] != results[0]["test_result"]["ndcg@20"]
    out = tmp_path / "ev.json"
    assert (
        main(["--evaluate", summary["checkpoint"], "--under", "recbole", "--output", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    assert "| recbole | recbole |" in printed
    first = "Protocol labels: recbole (training pieces: the checkpoint's, train_rows=all_prefixes)"
    assert printed.splitlines()[0] == first
    assert json.loads(out.read_text())[0]["test_result"] == results[0]["test_result"]
    code = main(["--evaluate", summary["checkpoint"], "--under", "train_rows=window"])
    assert code == 2
    assert "'train_rows' cannot change after training" in capsys.readouterr().err
    # More negatives than the dataset has items was accepted.
    assert main(["--evaluate", summary["checkpoint"], "--under", "mode=uni5000"]) == 2
    err = capsys.readouterr().err
    assert "ranks each target against 5,000 sampled items" in err and err.count("\n") == 1


@pytest.mark.parametrize("mode", ["full", "uni10"])
def test_per_user_ranks_give_recboles_metrics(small_config, mode):
    """The per-user ranks every summary keeps (for the per-user significance tests) come
    from RecBole's own top-k structure and average back to its metrics."""
    from recbole_freq.jobs.compare.statistics import per_user_values

    overrides = dict(small_config, epochs=1, metric_decimal_place=10)
    overrides["eval_args"] = {
        "split": {"LS": "valid_and_test"},
        "order": "TO",
        "group_by": "user",
        "mode": mode,
    }
    summary = run("SASRec", "tiny", cmd_overrides=overrides, saved=False)
    per_user = summary["test_per_user"]
    assert per_user["topk"] == 20 and len(per_user["users"]) == 60
    assert len(set(per_user["users"])) == 60
    for metric, value in summary["test_result"].items():
        users, values = per_user_values([summary], metric)
        assert values.mean() == pytest.approx(value, abs=1e-9), metric


def sasrec_training_rows(sequences, n):
    """SASRec's ``sample_function`` (one row per user of the training part ``T``): input
    ``T[:-1]`` and targets ``T[1:]``, the last n of each, aligned."""
    rows = []
    for user, seq in sequences.items():
        train = seq[:-2]
        if len(train) < 2:
            continue
        rows.append((user, tuple(train[:-1][-n:]), tuple(train[1:][-n:])))
    return sorted(rows)


def test_last_n_all_positions_rows_are_sasrecs(repeat_data, tmp_path):
    root, sequences = repeat_data
    config = FreqConfig(
        "SASRec",
        "repeat",
        cmd_overrides=settings(root, tmp_path, train_rows="last_n_all_positions"),
    )
    _, (train, _, _) = load_splits(config)
    dataset = train._dataset
    feat = dataset.inter_feat
    ours = []
    for user, items, length, targets in zip(
        dataset.id2token("user_id", feat["user_id"].numpy()),
        feat["item_id_list"].numpy(),
        feat["item_length"].numpy(),
        feat[POSITION_TARGETS].numpy(),
    ):
        assert (targets[length:] == 0).all() and (targets[:length] > 0).all()
        ours.append(
            (
                user,
                tuple(dataset.id2token("item_id", items[:length])),
                tuple(dataset.id2token("item_id", targets[:length])),
            )
        )
    assert sorted(ours) == sasrec_training_rows(sequences, N)


def test_all_positions_loss_is_the_per_position_bce(repeat_data, tmp_path):
    """The one-row-per-user loss equals SASRec's loss written position by position: for
    every target position the model's output on that prefix alone (a causal model), the
    BCE of the target against the same negative, averaged over all positions."""
    import torch.nn.functional as F

    root, _ = repeat_data
    config = FreqConfig(
        "SASRec",
        "repeat",
        cmd_overrides=settings(root, tmp_path, train_rows="last_n_all_positions"),
    )
    _, (train, _, _) = load_splits(config)
    model = new_model(config, train)
    trainer = trainer_for(config, model)
    trainer.sampled_loss.training_dataset = train._dataset
    model.eval()  # no dropout, so both computations see the same function
    batch = next(iter(train))
    torch.manual_seed(0)
    ours = trainer.sampled_loss.all_positions(batch)
    torch.manual_seed(0)
    negatives = position_negatives(train._dataset, batch, batch[POSITION_TARGETS], model)
    weight = model.item_embedding.weight
    seen = train._dataset.protocol_histories
    losses = []
    with torch.no_grad():
        for row in range(len(batch)):
            user = int(batch["user_id"][row])
            start = seen.start[user]
            items = set(
                seen.items[start : start + train._dataset.protocol_train_length[user]].tolist()
            )
            for position in range(int(batch["item_length"][row])):
                prefix = torch.zeros_like(batch["item_id_list"][row : row + 1])
                prefix[0, : position + 1] = batch["item_id_list"][row, : position + 1]
                output = model.forward(prefix, torch.tensor([position + 1]))[0]
                target = batch[POSITION_TARGETS][row, position]
                negative = negatives[row, position]
                assert int(negative) not in items and int(negative) != 0
                losses.append(
                    F.softplus(-(output * weight[target]).sum())
                    + F.softplus((output * weight[negative]).sum())
                )
    assert float(ours.detach()) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-5)


@pytest.mark.parametrize(
    "model, extra, reason",
    [
        ("BSARec", {}, "needs a causal model"),
        ("BERT4RecDenoiser", {}, "does not apply BERT4RecDenoiser's DenoisingObjective"),
    ],
)
def test_last_n_all_positions_refuses_what_it_cannot_train(
    tiny_data, tmp_path, model, extra, reason
):
    overrides = settings(tiny_data, tmp_path, protocol="sasrec", **extra)
    with pytest.raises(ProtocolError, match=reason):
        run(model, "wide", cmd_overrides=overrides, saved=False)


@pytest.mark.parametrize("model", ["SASRec", "GRU4Rec"])
def test_sasrec_protocol_trains_recbole_models(tiny_data, tmp_path, model):
    overrides = settings(tiny_data, tmp_path, protocol="sasrec", epochs=2)
    if model == "GRU4Rec":
        overrides = without_transformer_settings(overrides)
    summary = run(model, "wide", cmd_overrides=overrides, saved=False)
    assert summary["protocol"]["label"] == "sasrec"
    assert summary["config"]["eval_args"]["mode"] == {"valid": "uni100", "test": "uni100"}
    losses = [epoch["train_loss"] for epoch in summary["history"]]
    assert all(math.isfinite(loss) for loss in losses)


def test_last_position_bce_is_fmlp_recs_loss(repeat_data, tmp_path):
    """``train_loss: bce`` on one-target rows is FMLP-Rec's ``cross_entropy``: the output
    at the last position, ``-log(s(pos) + 1e-24) - log(1 - s(neg) + 1e-24)`` averaged over
    the rows, with each negative outside the row's input and target (``neg_sample``)."""
    root, _ = repeat_data
    config = FreqConfig(
        "SASRec", "repeat", cmd_overrides=settings(root, tmp_path, protocol="fmlprec")
    )
    assert protocol_label(config) == "fmlprec"
    _, (train, _, _) = load_splits(config)
    model = new_model(config, train)
    trainer = trainer_for(config, model)
    model.eval()
    batch = next(iter(train))
    torch.manual_seed(0)
    ours = trainer.sampled_loss.last_position(batch)
    torch.manual_seed(0)
    negatives = row_negatives(batch["item_id_list"], batch["item_id"], model.n_items)
    weight = model.item_embedding.weight
    losses = []
    with torch.no_grad():
        for row in range(len(batch)):
            length = int(batch["item_length"][row])
            items = batch["item_id_list"][row, :length].tolist() + [int(batch["item_id"][row])]
            negative = int(negatives[row])
            assert negative not in items and 0 < negative < model.n_items
            output = model.forward(batch["item_id_list"][row : row + 1], torch.tensor([length]))[0]
            positive = torch.sigmoid((output * weight[items[-1]]).sum())
            sampled = torch.sigmoid((output * weight[negative]).sum())
            losses.append(-torch.log(positive + 1e-24) - torch.log(1 - sampled + 1e-24))
    assert float(ours.detach()) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-5)
    # and it is the loss a training epoch minimises, once per batch
    calls = []
    loss = trainer.sampled_loss.last_position
    trainer.sampled_loss.last_position = lambda interaction: calls.append(1) or loss(interaction)
    model.train()
    trainer._train_epoch(train, 0)
    assert len(calls) == len(train)


def test_row_negatives_never_hit_the_row():
    generator = torch.Generator().manual_seed(5)
    n_items = 9
    item_seq = torch.randint(0, n_items, (200, 4), generator=generator)
    targets = torch.randint(1, n_items, (200,), generator=generator)
    torch.manual_seed(1)
    negatives = row_negatives(item_seq, targets, n_items)
    for items, target, negative in zip(item_seq.tolist(), targets.tolist(), negatives.tolist()):
        assert negative not in items and negative != target and 0 < negative < n_items
    full = torch.arange(1, n_items)[None, :].repeat(2, 1)
    with pytest.raises(ProtocolError, match="no negative"):
        row_negatives(full[:, :-1], full[:, -1], n_items)


def test_train_loss_follows_the_rows_unless_set(tiny_data, tmp_path):
    base = settings(tiny_data, tmp_path)
    sasrec = FreqConfig("SASRec", "tiny", cmd_overrides=dict(base, protocol="sasrec"))
    assert protocol_settings(sasrec)["train_loss"] == "bce"
    assert protocol_label(sasrec) == "sasrec"
    recbole = FreqConfig("SASRec", "tiny", cmd_overrides=base)
    assert protocol_settings(recbole)["train_loss"] == "model"
    with_bce = FreqConfig("SASRec", "tiny", cmd_overrides=dict(base, train_loss="bce"))
    assert protocol_label(with_bce) == "recbole+train_loss=bce"
    refused = FreqConfig(
        "SASRec", "tiny", cmd_overrides=dict(base, protocol="sasrec", train_loss="model")
    )
    with pytest.raises(ProtocolError, match="leave train_loss unset or set it to bce"):
        protocol_settings(refused)
    mine = FreqConfig("SASRec", "tiny", cmd_overrides=dict(base, protocol="fmlprec"))
    assert mine["valid_metric"] == "MRR@100" and mine["eval_args"]["mode"]["test"] == "uni99"


@pytest.mark.parametrize("model", ["SASRec", "BSARec", "GRU4Rec"])
def test_fmlprec_protocol_trains_any_model_and_ranks_unseen_items(tiny_data, tmp_path, model):
    # tiny has 40 items: 3 unseen negatives instead of 99, cut-offs up to 20 instead of 100
    mode = {"split": {"LS": "valid_and_test"}, "order": "TO", "group_by": "user", "mode": "uni3"}
    overrides = settings(
        tiny_data,
        tmp_path,
        protocol="fmlprec",
        epochs=2,
        eval_args=mode,
        topk=[1, 5, 10, 20],
        valid_metric="MRR@20",
    )
    if model == "GRU4Rec":
        overrides = without_transformer_settings(overrides)
    summary = run(model, "tiny", cmd_overrides=overrides, saved=False)
    assert summary["protocol"]["label"] == "fmlprec+mode=uni3"
    assert summary["protocol"]["train_loss"] == "bce"
    result = summary["test_result"]
    assert {"hit@1", "ndcg@10", "mrr@20"} <= set(result)
    assert result["hit@20"] == 1.0  # every target is among its 4 candidates
    assert all(math.isfinite(epoch["train_loss"]) for epoch in summary["history"])


def test_bce_refuses_objectives_it_would_drop(tiny_data, tmp_path):
    overrides = settings(tiny_data, tmp_path, train_loss="bce", epochs=1)
    with pytest.raises(
        ProtocolError, match="does not apply BERT4RecDenoiser's.*use train_loss=model"
    ):
        run("BERT4RecDenoiser", "tiny", cmd_overrides=overrides, saved=False)


def test_an_evaluation_variant_with_no_sampled_items_is_refused():
    from recbole_freq.jobs.evaluate import parse_variant

    assert parse_variant("mode=uni10")["mode"] == "uni10"
    with pytest.raises(ProtocolError, match="mode='uni0' ranks each target against no sampled"):
        parse_variant("mode=uni0")
    with pytest.raises(ProtocolError, match="mode='labeled' scores labelled interactions"):
        parse_variant("mode=labeled")
