"""``sequence_layout``: the authors' left padding for the plugin's core and RecBole's
built-ins, its label, and what is refused."""

import json

import pytest
import torch
from recbole.model.sequential_recommender import GRU4Rec, SASRec

from conftest import (
    assert_same_as_recbole,
    authors_left_padded,
    first_batch,
    prepare,
    without_transformer_settings,
)
from recbole_freq.jobs.compare.runs import stored_label_differences
from recbole_freq.model import DuoRec
from recbole_freq.model.layout import SequenceLayoutError, builtin_class
from recbole_freq.protocol import all_position_output
from recbole_freq.quick_start.quick_start import run

NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attn_dropout_prob": 0.0}


def left_padded(batch, model):
    """``batch`` with every row written the authors' way, ``[0] * pad_len + items``, and
    ``item_length`` n: the input a left-padded model reads at position n - 1."""
    item_seq, lengths = batch[model.ITEM_SEQ], batch[model.ITEM_SEQ_LEN]
    laid = batch[torch.arange(len(lengths))]
    laid.update(
        type(batch)(
            {
                model.ITEM_SEQ: authors_left_padded(item_seq, lengths),
                model.ITEM_SEQ_LEN: torch.full_like(lengths, item_seq.size(1)),
            }
        )
    )
    return laid


def settings_of(name, small_config) -> dict:
    """``small_config`` without the settings ``name`` does not read."""
    if name in ("SASRec", "BERT4Rec", "FEARec"):
        return dict(small_config, topk_factor=1) if name == "FEARec" else small_config
    overrides = without_transformer_settings(small_config)
    if name in ("Caser", "STAMP"):
        overrides.pop("hidden_size")
    return overrides


def test_core_and_recboles_sasrec_agree_under_left(small_config):
    """Two separate paths to the authors' layout give one function: the core re-lays
    inside its encoder (DuoRec without contrast is SASRec), RecBole's SASRec gets
    re-laid rows in forward: same scores, metrics, loss and gradients."""
    overrides = dict(small_config, contrast=None, sequence_layout="left", **NO_DROPOUT)
    config, train, _, test = prepare("DuoRec", overrides)
    model = DuoRec(config, train._dataset)
    reference = builtin_class(SASRec, config)(config, train._dataset)
    assert type(reference).__name__ == "SASRec" and isinstance(reference, SASRec)
    assert_same_as_recbole(model, reference, config, train, test)

    # ... and that function is not RecBole's right-padded one on rows shorter than n.
    plain = SASRec(config, train._dataset)
    plain.load_state_dict(reference.state_dict())
    plain.eval(), reference.eval()
    batch = first_batch(test)
    short = batch[batch[reference.ITEM_SEQ_LEN] < config["MAX_ITEM_LIST_LENGTH"]]
    with torch.no_grad():
        assert not torch.allclose(
            reference.full_sort_predict(short), plain.full_sort_predict(short), atol=1e-4
        )
        # Every position's output (SASRec's per-position training) comes back in
        # RecBole's layout, equal to the core's.
        torch.testing.assert_close(
            all_position_output(reference, short), model.encode(short[model.ITEM_SEQ])
        )


@pytest.mark.parametrize("name", ["SASRec", "GRU4Rec", "NARM", "Caser", "FEARec"])
def test_each_accepted_builtin_reads_the_authors_rows(small_config, name):
    """A re-laid built-in scores a batch as the unchanged model scores the same rows
    written the authors' way (``[0] * pad_len + items``, read at n - 1)."""
    config, train, _, test = prepare(
        name, dict(settings_of(name, small_config), sequence_layout="left")
    )
    from recbole.utils import get_model

    original = get_model(name)  # RecBole's class (FEARec by that name is the plugin's)
    laid_model = builtin_class(original, config)(config, train._dataset).eval()
    plain = original(config, train._dataset).eval()
    plain.load_state_dict(laid_model.state_dict())
    batch = first_batch(test)
    with torch.no_grad():
        torch.testing.assert_close(
            laid_model.full_sort_predict(batch),
            plain.full_sort_predict(left_padded(batch, plain)),
        )


@pytest.mark.parametrize(
    "name, refusal, way_out",
    [
        ("STAMP", "not available for STAMP", "set sequence_layout=right"),
        # BERT4Rec left-laid trains only with the BSARec authors' loss (test_paper_baselines).
        ("BERT4Rec", "trains BERT4Rec only with", "set train_loss=masked_next or sequence_lay"),
    ],
)
def test_builtins_that_need_the_length_are_refused_in_one_line(
    small_config, name, refusal, way_out, capsys
):
    from recbole_freq.cli import main

    overrides = dict(settings_of(name, small_config), sequence_layout="left")
    with pytest.raises(SequenceLayoutError, match=refusal):
        run(name, "tiny", cmd_overrides=overrides, saved=False)
    argv = [f"--model={name}", "--dataset=tiny", "--protocol=bsarec"]
    argv += [f"--{key}={value}" for key, value in overrides.items() if key != "sequence_layout"]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and way_out in error[0]


def test_the_papers_protocols_pad_left_and_labels_say_otherwise(tiny_data, small_config):
    overrides = dict(without_transformer_settings(small_config), epochs=1, protocol="bsarec")
    summary = run("GRU4Rec", "tiny", cmd_overrides=overrides, saved=False)
    assert summary["protocol"]["sequence_layout"] == "left"
    assert summary["protocol"]["label"] == "bsarec"
    right = run("GRU4Rec", "tiny", cmd_overrides=dict(overrides, sequence_layout="right"),
                saved=False)  # fmt: skip
    assert right["protocol"]["label"] == "bsarec+sequence_layout=right"
    assert right["test_result"] != summary["test_result"]
    recbole = run("GRU4Rec", "tiny", cmd_overrides=dict(overrides, protocol="recbole"),
                  saved=False)  # fmt: skip
    assert recbole["protocol"]["sequence_layout"] == "right"
    assert recbole["protocol"]["label"] == "recbole"


def test_a_stored_run_of_another_layout_is_named_when_skipped(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    summary = {
        "protocol": {"label": "bsarec+sequence_layout=right"},
        "test_result": {"hit@10": 0.1},
    }
    from recbole_freq.jobs.compare.runs import record_digest

    record = {"settings": {}, "summary": summary}
    record["digest"] = record_digest(record)
    (runs / "BSARec-seed42.json").write_text(json.dumps(record))
    label = {"BSARec": "bsarec+sequence_layout=right"}
    assert stored_label_differences(tmp_path, ["BSARec"], [42], label) == []
    (line,) = stored_label_differences(tmp_path, ["BSARec"], [42], {"BSARec": "bsarec"})
    assert "stored under protocol bsarec+sequence_layout=right" in line
    assert "would run BSARec under bsarec" in line


def test_gru4rec_built_under_right_is_recboles_own(small_config):
    config, _, _, _ = prepare("GRU4Rec", without_transformer_settings(small_config))
    built = builtin_class(GRU4Rec, config)
    assert issubclass(built, GRU4Rec) and built.forward is GRU4Rec.forward
    assert built.__name__ == "GRU4Rec" and built.sequence_layout == "right"
