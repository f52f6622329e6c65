"""FEARec on the shared core (``model/sequential_recommender/fearec.py``) as its authors
ran it (``properties/model/FEARec.yaml``, not RecBole's shipped file, which switches the
frequency and contrastive parts off): RecBole's FEARec given the same weights and the
same drawn positives (scores, metrics, loss, gradients), its positives drawn with
RecBole's distribution, and the model trained through the real pipeline."""

from collections import Counter
from pathlib import Path

import pytest
import recbole
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from recbole.model.sequential_recommender.fearec import FEARec as RecBoleFEARec
from recbole.model.sequential_recommender.fearec import HybridAttention
from recbole.trainer import Trainer

from conftest import (
    RECBOLE_FEAREC_NAMES,
    assert_same_gradients,
    first_batch,
    prepare,
    recbole_state,
)
from dataset_prep import convert_one_line
from recbole_freq.cli import main
from recbole_freq.config.configurator import FreqConfig
from recbole_freq.model.contrastive import SameTargetSampler
from recbole_freq.model.frequency import fearec_band
from recbole_freq.model.sequential_recommender.fearec import FEARec
from recbole_freq.protocol import ProtocolError
from recbole_freq.quick_start.quick_start import new_model, run

AUTHORS = {
    "contrast": "us_x",
    "dual_domain": True,
    "fredom": True,
    "fredom_type": "us_x",
    "global_ratio": 0.6,
    "spatial_ratio": 0.1,
    "std": True,
    "topk_factor": 10,
    "tau": 1.0,
    "lmd": 0.1,
    "lmd_sem": 0.1,
    "sim": "dot",
}
# FEARec keeps int(10 * ln L) of 2 * (L // 2) time delays: the authors' 10 needs L >= 36.
LONG = {"MAX_ITEM_LIST_LENGTH": 50}


def test_recbole_ships_fearec_with_its_frequency_parts_off():
    """Why the plugin has its own file: RecBole 1.2.1's turns off what makes FEARec."""
    shipped = Path(recbole.__file__).parent / "properties" / "model" / "FEARec.yaml"
    settings = yaml.safe_load(shipped.read_text())
    assert settings["dual_domain"] is False and settings["fredom"] is False
    assert settings["global_ratio"] == 1 and "contrast" not in settings


def test_fearec_gets_the_authors_settings_and_recbole_s_are_one_line_away(tiny_data):
    config = FreqConfig("FEARec", "tiny", cmd_overrides={"data_path": str(tiny_data)})
    assert {key: config[key] for key in AUTHORS} == AUTHORS
    off = {"dual_domain": False, "fredom": False, "global_ratio": 1, "contrast": None}
    config = FreqConfig("FEARec", "tiny", cmd_overrides={"data_path": str(tiny_data), **off})
    assert {key: config[key] for key in off} == off


def test_the_authors_settings_add_the_contrastive_and_frequency_losses(small_config):
    """In eval mode (no dropout) the loss with the authors' settings is the CE loss plus
    the supervised InfoNCE and the frequency-domain L1 term, both positive."""
    config, train, _, _ = prepare("FEARec", dict(small_config, **LONG))
    model = new_model(config, train)
    model.eval()
    batch = first_batch(train)
    with torch.no_grad():
        full = model.calculate_loss(batch).item()
        model.contrast, model.fredom = None, False
        cross_entropy_only = model.calculate_loss(batch).item()
    assert full > cross_entropy_only > 0


def test_fearec_with_the_authors_settings_trains_and_evaluates(small_config):
    summary = run("FEARec", "tiny", cmd_overrides=dict(small_config, epochs=1, **LONG))
    assert summary["epochs_run"] == 1
    assert summary["config"]["dual_domain"] is True
    assert 0 <= summary["test_result"]["hit@10"] <= 1


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"MAX_ITEM_LIST_LENGTH": 12},
            "FEARec with topk_factor=10 keeps int(10 * ln 12) = 24 time delays, more than the "
            "12 that MAX_ITEM_LIST_LENGTH=12 has (2 * (L // 2)); use MAX_ITEM_LIST_LENGTH >= 36 "
            "or topk_factor <= 5",
        ),
        # odd L: the irfft of L // 2 + 1 bins has L - 1 delays, and int(10 * ln 35) = 35
        ({"MAX_ITEM_LIST_LENGTH": 35}, "= 35 time delays, more than the 34 that"),
        ({"topk_factor": 1, "MAX_ITEM_LIST_LENGTH": 2}, "keeps int(1 * ln 2) = 0 time delays"),
        ({"topk_factor": 0, **LONG}, "FEARec needs topk_factor > 0, got 0"),
    ],
)
def test_too_many_or_no_time_delays_is_one_line(small_config, capsys, overrides, message):
    args = [f"--{key}={value}" for key, value in dict(small_config, **overrides).items()]
    assert main(["--model=FEARec", "--dataset=tiny", *args]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: ") and message in errors[0], errors


def test_the_bound_in_the_message_is_the_largest_that_works(small_config):
    """``topk_factor`` 5 with L = 12 keeps 12 delays and trains; 36 positions suffice for
    the authors' 10."""
    for overrides in ({"topk_factor": 5}, {"MAX_ITEM_LIST_LENGTH": 36}):
        summary = run("FEARec", "tiny", cmd_overrides=dict(small_config, epochs=1, **overrides))
        assert summary["epochs_run"] == 1


def test_a_protocol_loss_that_would_drop_fearec_s_terms_is_refused(small_config):
    overrides = dict(small_config, epochs=1, train_loss="bce", **LONG)
    with pytest.raises(ProtocolError, match="leaves out FEARec's contrastive term .*frequency-"):
        run("FEARec", "tiny", cmd_overrides=overrides, saved=False)


@pytest.mark.parametrize("dual_domain", [False, True])
def test_fearecs_frequency_attention_computes_in_float32_under_autocast(dual_domain):
    """Compat fix 21: under mixed precision RecBole's ``HybridAttention`` runs in
    float32 (on CUDA its float16 FFT stopped FEARec in its first step), so its output is
    the full-precision one; bfloat16 would be off by about 1e-2 relative."""
    from recbole.model.sequential_recommender.fearec import HybridAttention

    import recbole_freq  # noqa: F401  (installs the fixes)

    torch.manual_seed(0)
    defaults = Path(recbole.__file__).parent / "properties" / "model" / "FEARec.yaml"
    config = yaml.safe_load(defaults.read_text()) | {
        "MAX_ITEM_LIST_LENGTH": 50, "global_ratio": 0.5, "dual_domain": dual_domain,
        "spatial_ratio": 0.5, "use_filter": False,
    }  # fmt: skip
    layer = HybridAttention(2, 16, 0.0, 0.0, 1e-12, 0, config).eval()
    hidden = torch.randn(3, 50, 16)
    mask = torch.zeros(3, 1, 50, 50)
    full = layer(hidden, mask)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        mixed = layer(hidden, mask)
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, full, rtol=1e-6, atol=1e-6)


NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attn_dropout_prob": 0.0}
# Short rows, still several delays: int(3 ln 12) = 7 of the 12.
ORACLE = dict(AUTHORS, topk_factor=3, MAX_ITEM_LIST_LENGTH=12, **NO_DROPOUT)


@pytest.mark.parametrize(
    "variant",
    [
        {},  # the authors' settings: a sliding window of 0.6 of the bins, both domains
        {"global_ratio": 0.3, "dual_domain": False},  # disjoint windows, one per layer
        {"global_ratio": 1, "std": False, "fredom_type": "us"},  # every bin, both terms
        {"contrast": "us", "fredom": False, "lmd": 0.2},
        # an odd length: the authors' irfft returns n - 1 delays, no circular correlation
        # (their time-domain branch fails there: the same irfft gives n - 1 positions)
        {"MAX_ITEM_LIST_LENGTH": 11, "dual_domain": False},
    ],
)
def test_fearec_is_recboles_fearec_given_the_same_weights(small_config, variant):
    """Same weights: the same full-sort scores and metrics (eval: each row's own delays),
    and in training (the batch's delays) the same loss and gradients for the same drawn
    positives, those RecBole's FEARec drew for the batch."""
    config, train, _, test = prepare("FEARec", {**small_config, **ORACLE, **variant})
    model = FEARec(config, train._dataset)
    reference = RecBoleFEARec(config, train._dataset)
    # |x| has no derivative at 0, where the frequency term's gradient is the sign of
    # rounding noise: the mean bin of a LayerNorm output is 0 while its weight is 1 and
    # its bias 0 (their initial values), and a row whose positive is its own sequence
    # meets itself.  Trained-looking LayerNorms, and (below) rows with another sequence.
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(1.0, 0.2), module.bias.normal_(0.0, 0.2)
    shared = recbole_state(model, reference, RECBOLE_FEAREC_NAMES)
    model.eval(), reference.eval()
    batch = first_batch(test)
    torch.testing.assert_close(
        model.full_sort_predict(batch), reference.full_sort_predict(batch), atol=1e-5, rtol=1e-5
    )
    assert dict(Trainer(config, model).evaluate(test, load_best_model=False)) == dict(
        Trainer(config, reference).evaluate(test, load_best_model=False)
    )
    model.train(), reference.train()
    batch = first_batch(train)
    # A first draw finds the rows that have another sequence with their target; the
    # batch keeps those, whose draws then always differ from them.
    reference.calculate_loss(batch)
    batch = batch[(batch["sem_aug"] != batch["item_id_list"]).any(dim=1).nonzero().squeeze(1)]
    theirs = reference.calculate_loss(batch)  # draws its positives into batch["sem_aug"]
    drawn = (batch["sem_aug"], batch["sem_aug_lengths"], torch.ones(len(batch), dtype=bool))
    model.positive_sampler.positives = lambda *_: drawn
    ours = model.calculate_loss(batch)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)
    ours.backward(), theirs.backward()
    assert_same_gradients(shared, reference)


@pytest.mark.parametrize(
    "length, n_layers, global_ratio",
    [(50, 2, 0.6), (50, 3, 0.6), (12, 2, 0.3), (50, 4, 0.1), (35, 2, 1.0), (20, 3, 0.5)],
)
def test_each_layer_samples_the_bins_of_the_authors_frequency_ramp(length, n_layers, global_ratio):
    config = {
        "topk_factor": 1, "global_ratio": global_ratio, "n_layers": n_layers,
        "MAX_ITEM_LIST_LENGTH": length, "dual_domain": False, "std": False,
    }  # fmt: skip
    for layer in range(n_layers):
        theirs = HybridAttention(2, 8, 0.0, 0.0, 1e-12, layer, config).q_index
        assert list(fearec_band(layer, n_layers, length, global_ratio)) == theirs


def test_one_layer_is_refused_in_one_line():
    with pytest.raises(ValueError, match="n_layers=1 must be at least 2"):
        fearec_band(0, 1, 50, 0.6)


def repeated_histories(root):
    """Users whose histories repeat, so that rows with target 9 come with copies: [1] -> 9
    twice, [2] -> 9 once, [3] -> 9 three times, [4, 1] -> 9 once."""
    prefixes = [[1], [1], [2], [3], [3], [3], [4, 1]]
    lines = []
    for user, prefix in enumerate(prefixes, start=1):
        filler = [20 + 3 * user, 21 + 3 * user, 22 + 3 * user]
        lines.append(f"{user} " + " ".join(map(str, [*prefix, 9, *filler])))
    raw = root / "repeats.txt"
    raw.write_text("\n".join(lines) + "\n")
    convert_one_line(raw, root, "repeats", show_progress=False)
    return root


def test_positives_are_drawn_as_recboles_fearec_draws_them(small_config, tmp_path):
    """The anchor [1] -> 9 has a copy; the other rows with target 9 are [2] once, [3]
    three times and [4, 1] once.  RecBole's FEARec (rows in random order until one
    differs) picks them 1/5, 3/5, 1/5; so does the sampler (``weighting: rows``), where
    DuoRec's ``distinct`` would give 1/3 each."""
    data = repeated_histories(tmp_path)
    overrides = dict(small_config, **ORACLE, data_path=str(data))
    overrides.update(user_inter_num_interval="[0,inf)", item_inter_num_interval="[0,inf)")
    config, train, _, _ = prepare("FEARec", overrides, dataset="repeats")
    dataset = train._dataset
    features = dataset.inter_feat
    item_seq, targets = features["item_id_list"], features["item_id"]
    anchors = [
        row for row in range(len(features))
        if dataset.id2token("item_id", int(targets[row])) == "9"
        and dataset.id2token("item_id", item_seq[row][:2]).tolist() == ["1", "[PAD]"]
    ]  # fmt: skip
    assert len(anchors) == 2
    batch = features[torch.tensor([anchors[0]] * 3000)]
    expected = {("2",): 0.2, ("3",): 0.6, ("4", "1"): 0.2}

    def shares(sequences) -> dict:
        counts = Counter(
            tuple(dataset.id2token("item_id", [i for i in row if i]).tolist())
            for row in sequences.tolist()
        )
        return {history: count / len(sequences) for history, count in counts.items()}

    import random

    random.seed(0)
    reference = RecBoleFEARec(config, train._dataset)
    reference.calculate_loss(batch)
    theirs = shares(batch["sem_aug"])
    torch.manual_seed(0)
    model = FEARec(config, train._dataset)
    ours = shares(model.positive_sampler.positives(
        batch["item_id_list"], batch["item_length"], batch["item_id"]
    )[0])  # fmt: skip
    for drawn in (theirs, ours):
        assert drawn.keys() == expected.keys()
        for history, share in expected.items():
            assert drawn[history] == pytest.approx(share, abs=0.035), (history, drawn)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.lists(st.integers(1, 2), min_size=2, max_size=2)),
        min_size=1,
        max_size=20,
    )
)
def test_rows_weighting_never_pairs_a_sequence_with_a_copy_and_reaches_every_other(rows):
    targets = torch.tensor([t for t, _ in rows])
    seqs = torch.tensor([s for _, s in rows])
    sampler = SameTargetSampler(seqs, torch.full((len(rows),), 2), targets, 5, "rows")
    torch.manual_seed(0)
    picked, found = sampler(seqs.repeat(200, 1), targets.repeat(200))
    for anchor_index, (target, anchor) in enumerate(rows):
        others = [i for i, (t, s) in enumerate(rows) if t == target and s != anchor]
        mine = [
            row for index, row in enumerate(picked.tolist()) if index % len(rows) == anchor_index
        ]
        assert bool(found[anchor_index]) == bool(others)
        if others:
            assert set(mine) <= set(others)
            assert len(others) > 6 or set(mine) == set(others)  # 200 draws reach each
