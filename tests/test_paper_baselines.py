"""``--paper`` on BSARec Table 2's baselines trains each as the authors' code does
(yehjin-shin/BSARec, ``src/model/``): SASRec, Caser and FMLP-Rec with binary
cross-entropy at the last position against one negative (Caser adding its L2 terms),
GRU4Rec with BPR against one negative, DuoRec and FEARec with CE and their contrastive
terms; each loss checked against a small oracle written out row by row, and every row
of a table names its loss."""

import math
from pathlib import Path

import pytest
import torch

from conftest import small_overrides, write_sequences
from dataset_prep import convert_one_line
from recbole_freq.config.configurator import FreqConfig
from recbole_freq.protocol import protocol_label, row_negatives, trainer_for
from recbole_freq.protocol.losses import training_loss_label
from recbole_freq.quick_start.quick_start import load_splits, new_model, run

BSAREC_DATASETS = [
    "amazon-beauty",
    "amazon-sports-outdoors",
    "amazon-toys-games",
    "lastfm",
    "ml-1m",
    "yelp",
]
PAPER_LOSSES = {
    "SASRec": "BCE, 1 negative, last position",
    "Caser": "BCE, 1 negative, last position + L2 terms",
    "GRU4Rec": "BPR, 1 negative, last position",
    "FMLPRec": "BCE, 1 negative, last position",
    "DuoRec": "CE (model's own) + contrastive term (contrast=us_x, lmd=0.1, lmd_sem=0.1)",
    "FEARec": "CE (model's own) + contrastive term (contrast=us_x, lmd=0.1, lmd_sem=0.1) + "
    "frequency-domain term (fredom_type=us_x, 0.1)",
    "BERT4Rec": "CE, next item at a masked slot",
}
PROPERTIES = Path(__file__).resolve().parents[1] / "properties" / "paper"


@pytest.fixture(scope="module")
def lastfm_like(tmp_path_factory):
    """A small dataset named lastfm, so that the paper files for lastfm apply."""
    root = tmp_path_factory.mktemp("paper")
    raw = write_sequences(root / "lastfm.txt", n_users=40, n_items=30, max_len=12)
    convert_one_line(raw, root, "lastfm", show_progress=False, check=False)
    return root


@pytest.fixture(autouse=True)
def _deterministic_algorithms_off_afterwards():
    # --paper turns torch's deterministic algorithms on for the process; other tests
    # expect torch's default.
    yield
    torch.use_deterministic_algorithms(False)


def paper_run(model, root, tmp_path, **overrides):
    config = FreqConfig(
        model, "lastfm", cmd_overrides=small_overrides(root, tmp_path, **overrides), paper=True
    )
    _, (train, _, _) = load_splits(config)
    model = new_model(config, train)
    trainer = trainer_for(config, model)
    return config, model, trainer, next(iter(train))


@pytest.mark.parametrize("model", sorted(PAPER_LOSSES))
def test_every_table2_baseline_has_paper_files_for_the_six_datasets(model):
    texts = []
    for dataset in BSAREC_DATASETS:
        lines = (PROPERTIES / model / f"{dataset}.yaml").read_text().splitlines()
        texts.append([line for line in lines if not line.startswith("#")])
    assert all(text == texts[0] for text in texts)  # the authors' defaults everywhere
    assert "protocol: bsarec" in texts[0] and "deterministic: True" in texts[0]


@pytest.mark.parametrize("model", sorted(PAPER_LOSSES))
def test_paper_settings_name_the_authors_loss(lastfm_like, tmp_path, model):
    # FEARec's delays need longer rows than this small data's.
    extra = {"topk_factor": 4} if model == "FEARec" else {}
    config, built, _, _ = paper_run(model, lastfm_like, tmp_path, **extra)
    assert training_loss_label(built, config) == PAPER_LOSSES[model]
    own = PAPER_LOSSES[model].startswith("CE (model's own)")
    expected = "bsarec" if own else f"bsarec+train_loss={config['train_loss']}"
    assert protocol_label(config) == expected


def test_sasrec_paper_settings_are_the_authors_defaults(lastfm_like, tmp_path):
    config, _, _, _ = paper_run("SASRec", lastfm_like, tmp_path)
    authors = dict(n_layers=2, n_heads=2, hidden_size=64, inner_size=256, hidden_act="gelu")
    authors.update(hidden_dropout_prob=0.5, attn_dropout_prob=0.5, learning_rate=0.001)
    authors.update(train_batch_size=256, stopping_step=10, sequence_layout="left")
    assert {key: config[key] for key in authors} == authors
    # its own CE loss is one flag away
    config, built, _, _ = paper_run("SASRec", lastfm_like, tmp_path, train_loss="model")
    assert training_loss_label(built, config) == "CE (model's own)"
    assert protocol_label(config) == "bsarec"


def bce(positive, negative):
    return -torch.log(torch.sigmoid(positive)) - torch.log(1 - torch.sigmoid(negative))


def oracle(model, batch, forward, pair):
    """The authors' loss written out row by row on the negatives ``row_negatives`` draws
    after ``torch.manual_seed(0)``."""
    torch.manual_seed(0)
    negatives = row_negatives(batch["item_id_list"], batch["item_id"], model.n_items)
    weight = model.item_embedding.weight
    losses = []
    for row in range(len(batch)):
        output = forward(row)
        target = int(batch["item_id"][row])
        items = set(batch["item_id_list"][row].tolist()) | {target}
        assert int(negatives[row]) not in items
        positive = (output * weight[target]).sum()
        negative = (output * weight[int(negatives[row])]).sum()
        losses.append(pair(positive, negative))
    return torch.stack(losses).mean()


def paper_loss_and_oracle(model_name, root, tmp_path, forward_of, pair):
    """``(ours, theirs, model)``: the trainer's last-position loss on the first batch of
    ``model_name``'s paper run and the authors' loss written out row by row
    (``oracle``) on the same negatives; ``forward_of(model, batch)`` gives a row's
    output.  No dropout, so both see the same function."""
    _, model, trainer, batch = paper_run(model_name, root, tmp_path)
    model.eval()
    with torch.no_grad():
        torch.manual_seed(0)
        ours = trainer.sampled_loss.last_position(batch)
        theirs = oracle(model, batch, forward_of(model, batch), pair)
    return ours, theirs, model


def by_items_and_length(model, batch):
    def forward(row):
        length = batch["item_length"][row : row + 1]
        return model.forward(batch["item_id_list"][row : row + 1], length)[0]

    return forward


def test_gru4rec_paper_loss_is_the_authors_bpr(lastfm_like, tmp_path):
    def bpr(positive, negative):
        return -torch.log(1e-10 + torch.sigmoid(positive - negative))

    ours, expected, _ = paper_loss_and_oracle(
        "GRU4Rec", lastfm_like, tmp_path, by_items_and_length, bpr
    )
    assert float(ours) == pytest.approx(float(expected), rel=1e-5)


def test_caser_paper_loss_is_the_authors_bce_with_its_l2_terms(lastfm_like, tmp_path):
    def by_user_and_items(model, batch):
        def forward(row):
            user = batch["user_id"][row : row + 1]
            return model.forward(user, batch["item_id_list"][row : row + 1])[0]

        return forward

    ours, without_l2, model = paper_loss_and_oracle(
        "Caser", lastfm_like, tmp_path, by_user_and_items, bce
    )
    with torch.no_grad():
        norms = sum(
            weight.norm(2)
            for weight in (
                model.user_embedding.weight,
                model.item_embedding.weight,
                model.conv_v.weight,
                model.fc1.weight,
                model.fc2.weight,
            )
        )
        horizontal = sum(
            parameter.norm(2)
            for name, parameter in model.conv_h.named_parameters()
            if name.endswith("weight")
        )
        expected = without_l2 + 1e-4 * norms + 1e-4 * horizontal
    assert float(ours) == pytest.approx(float(expected), rel=1e-5)
    assert float(ours) != pytest.approx(float(without_l2), rel=1e-5)


def test_sasrec_paper_loss_is_the_authors_bce(lastfm_like, tmp_path):
    ours, expected, _ = paper_loss_and_oracle(
        "SASRec", lastfm_like, tmp_path, by_items_and_length, bce
    )
    assert float(ours) == pytest.approx(float(expected), rel=1e-5)


def test_a_comparison_table_names_every_rows_loss(lastfm_like, tmp_path):
    from recbole_freq.jobs.compare import compare

    result = compare(
        "SASRec,BSARec",
        "lastfm",
        seeds="1",
        overrides=small_overrides(lastfm_like, tmp_path),
        out=tmp_path / "cmp",
        paper=True,
        log=lambda line: None,
    )
    losses = {row["model"]: row["loss"] for row in result["rows"]}
    assert losses == {"SASRec": PAPER_LOSSES["SASRec"], "BSARec": "CE (model's own)"}
    assert "| Model | loss |" in result["markdown"]
    row = next(line for line in result["markdown"].splitlines() if line.startswith("| SASRec "))
    assert "(baseline)" in row and "| BCE, 1 negative, last position |" in row


def test_a_denoisers_backbone_keeps_the_denoisers_paper_settings():
    """SASRec has BSARec Table 2 settings for lastfm; beside RecDenoiser it takes the
    denoiser's paper settings instead, so that the pair differs only in the denoiser."""
    from recbole_freq.jobs.compare import _paper_models

    overrides = {}
    paper_models, references = _paper_models(["RecDenoiser", "SASRec"], "lastfm", overrides, None)
    assert paper_models == ["RecDenoiser"]
    assert references["SASRec"]["protocol"] == "sasrec"
    assert overrides["protocol"] == "sasrec"
    paper_models, references = _paper_models(["BSARec", "SASRec"], "lastfm", {}, None)
    assert paper_models == ["BSARec", "SASRec"] and references == {}


def test_paper_runs_train(lastfm_like, tmp_path):
    summary = run(
        "GRU4Rec",
        "lastfm",
        cmd_overrides=small_overrides(lastfm_like, tmp_path),
        paper=True,
    )
    assert summary["training_loss"] == PAPER_LOSSES["GRU4Rec"]
    assert summary["protocol"]["label"] == "bsarec+train_loss=bpr"


def test_both_losses_of_a_baseline_are_two_rows_and_two_gains(lastfm_like, tmp_path):
    """``SASRec@train_loss=model`` beside ``--paper``'s SASRec: the same model with its own
    CE loss; the table has a row for each loss and BSARec's gain over each, labelled."""
    from recbole_freq.jobs.compare import compare

    result = compare(
        "SASRec,SASRec@train_loss=model,BSARec",
        "lastfm",
        seeds="1,2",
        overrides=small_overrides(lastfm_like, tmp_path),
        out=tmp_path / "cmp",
        paper=True,
        log=lambda line: None,
    )
    losses = [(row["model"], row["loss"]) for row in result["rows"]]
    assert losses == [
        ("SASRec", PAPER_LOSSES["SASRec"]),
        ("SASRec", "CE (model's own)"),
        ("BSARec", "CE (model's own)"),
    ]
    markdown = result["markdown"]
    assert f"| Improv. BSARec | SASRec, {PAPER_LOSSES['SASRec']} |" in markdown
    assert "| Improv. BSARec | SASRec, CE (model's own) |" in markdown
    stored = sorted(path.name for path in (tmp_path / "cmp" / "runs").glob("*.json"))
    assert "SASRec@train_loss=model-seed1.json" in stored
    assert "SASRec-seed1.json" in stored


@pytest.mark.parametrize("entry", ["SASRec@train_loss=ce", "SASRec@hidden_size=8"])
def test_an_unknown_loss_variant_is_refused_before_training(lastfm_like, tmp_path, entry):
    from recbole_freq.jobs.compare import ComparisonError, compare

    with pytest.raises(
        ComparisonError,
        match="after '@' name a protocol, variant=<name>, config=<file.yaml> or one of",
    ):
        compare(f"BSARec,{entry}", "lastfm", seeds="1", out=tmp_path / "cmp", log=print)


def left_laid(row: list[int], n: int) -> list[int]:
    """A right-padded row as the BSARec authors lay it: padding first."""
    items = [item for item in row if item]
    return [0] * (n - len(items)) + items


def test_bert4rec_paper_loss_is_the_authors_masked_next_item_ce(lastfm_like, tmp_path):
    """The authors' bert4rec.py written out row by row on the slots the loss draws after
    ``torch.manual_seed(0)``: each left-laid row with int(n * mask_ratio) slots set to
    [mask], the output at the slot drawn last scoring every item id, CE to the next item."""
    from recbole_freq.protocol.losses import MaskedNextLoss, masked_slots

    _, model, trainer, batch = paper_run("BERT4Rec", lastfm_like, tmp_path)
    assert isinstance(trainer.sampled_loss, MaskedNextLoss) and model.mask_ratio == 0.2
    model.eval()
    n = batch["item_id_list"].size(1)
    with torch.no_grad():
        # At initialisation (std 0.02) every row's loss is about log(items): spread the
        # scores so that another input or slot changes the loss.
        model.item_embedding.weight.mul_(200)
        torch.manual_seed(0)
        ours = trainer.sampled_loss(batch)
        torch.manual_seed(0)
        slots = masked_slots(batch["item_id_list"], model.mask_ratio)
        assert slots.shape == (len(batch), int(n * 0.2))
        assert all(len(set(row.tolist())) == slots.size(1) for row in slots)
        losses = []
        for row in range(len(batch)):
            laid = left_laid(batch["item_id_list"][row].tolist(), n)
            for slot in slots[row].tolist():
                laid[slot] = model.mask_token
            output = model.forward(torch.tensor([laid]))[0, int(slots[row, -1])]
            logits = model.item_embedding.weight @ output  # [mask]'s id included
            target = batch["item_id"][row : row + 1]
            losses.append(torch.nn.functional.cross_entropy(logits[None], target))
    assert float(ours) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-5)
    assert abs(float(ours) - math.log(model.n_items + 1)) > 0.1


def test_bert4rec_paper_predictions_read_mask_after_the_last_items(lastfm_like, tmp_path):
    """Left-laid, BERT4Rec scores from [mask] at position n - 1 after the row's last
    n - 1 items (the authors' reconstruct_test_data), not at item_seq_len."""
    _, model, _, batch = paper_run("BERT4Rec", lastfm_like, tmp_path)
    model.eval()
    n = batch["item_id_list"].size(1)
    with torch.no_grad():
        scores = model.full_sort_predict(batch)
        for row in range(3):
            laid = left_laid(batch["item_id_list"][row].tolist(), n)
            query = model.forward(torch.tensor([laid[1:] + [model.mask_token]]))[0, -1]
            expected = model.item_embedding.weight[: model.n_items] @ query + model.output_bias
            torch.testing.assert_close(scores[row], expected, rtol=1e-5, atol=1e-6)
        one = model.predict(batch)
        picked = scores.gather(1, batch["item_id"][:, None])[:, 0]
        torch.testing.assert_close(one, picked, rtol=1e-5, atol=1e-6)


def test_the_masked_next_loss_is_bert4recs_alone(lastfm_like, tmp_path):
    """BERT4Rec left-laid with its own loss, or the authors' BERT4Rec loss on a model
    without [mask]: one line each, before training."""
    from recbole_freq.model.layout import SequenceLayoutError
    from recbole_freq.protocol import ProtocolError

    with pytest.raises(SequenceLayoutError, match="set train_loss=masked_next or sequence_lay"):
        paper_run("BERT4Rec", lastfm_like, tmp_path, train_loss="model")
    with pytest.raises(ProtocolError, match="SASRec has no \\[mask\\] token"):
        paper_run("SASRec", lastfm_like, tmp_path, train_loss="masked_next")
    # RecBole's layout and its own cloze loss stay one setting away.
    config, built, _, _ = paper_run(
        "BERT4Rec", lastfm_like, tmp_path, train_loss="model", sequence_layout="right"
    )
    assert training_loss_label(built, config) == "CE (model's own)"


def test_bert4rec_paper_run_trains(lastfm_like, tmp_path):
    summary = run(
        "BERT4Rec", "lastfm", cmd_overrides=small_overrides(lastfm_like, tmp_path), paper=True
    )
    assert summary["training_loss"] == PAPER_LOSSES["BERT4Rec"]
    assert summary["protocol"]["label"] == "bsarec+train_loss=masked_next"
    assert all(0 <= value <= 1 for value in summary["test_result"].values())
