"""The memory guard: an estimate that scales like the model, a one-line refusal before
the model is built, a warning for lengths far beyond the data."""

import dataclasses
import logging
from pathlib import Path

import pytest
from recbole.data import create_dataset
from test_cli import cli_args

from recbole_freq.cli import main
from recbole_freq.config.configurator import FreqConfig
from recbole_freq.quick_start import memory
from recbole_freq.quick_start.memory import (
    COEFFICIENTS,
    MemoryGuardError,
    StepShape,
    available_bytes,
    check_memory,
    estimate_bytes,
    longest_history,
    step_shape,
)

SHAPE = StepShape(
    batch=64, length=100, hidden=64, inner=256, heads=2, layers=2, items=1000, scored=1
)


def replace(shape, **changes):
    from dataclasses import replace as dataclass_replace

    return dataclass_replace(shape, **changes)


@pytest.mark.parametrize("model", sorted(COEFFICIENTS))
def test_every_calibrated_family_has_positive_coefficients(model):
    attention, activations = COEFFICIENTS[model]
    assert attention > 0 and activations > 0


def test_attention_memory_grows_with_the_square_of_the_length():
    base = estimate_bytes("BSARec", SHAPE)
    longer = estimate_bytes("BSARec", replace(SHAPE, length=1000))
    attention, _ = COEFFICIENTS["BSARec"]
    quadratic = 4 * attention * SHAPE.batch * SHAPE.layers * SHAPE.heads * (1000**2 - 100**2)
    assert longer - base >= quadratic
    # ... and linearly with the batch: twice the batch, at most twice the memory.
    assert estimate_bytes("BSARec", replace(SHAPE, batch=128)) <= 2 * base


def test_models_without_calibration_are_not_estimated():
    assert estimate_bytes("GRU4Rec", SHAPE) is None


def test_cloze_models_score_their_masked_positions(small_config):
    config = FreqConfig(
        "BERT4RecDenoiser", "tiny", cmd_overrides=dict(small_config, MAX_ITEM_LIST_LENGTH=20)
    )
    assert step_shape(config, 41).scored == 4  # 0.2 * 20 masked positions
    sasrec_like = FreqConfig("BSARec", "tiny", cmd_overrides=small_config)
    assert step_shape(sasrec_like, 41).scored == 1


def test_available_memory_of_this_machine_is_known():
    available = available_bytes("cpu")
    assert available is not None and available > 0


def tiny_dataset(small_config, model="BSARec", **overrides):
    config = FreqConfig(model, "tiny", cmd_overrides=dict(small_config, **overrides))
    return config, create_dataset(config)


def test_guard_refuses_with_what_to_lower(small_config, monkeypatch):
    config, dataset = tiny_dataset(small_config)
    needed = check_memory(config, dataset)
    monkeypatch.setattr(memory, "available_bytes", lambda device: needed // 3)
    with pytest.raises(MemoryGuardError) as caught:
        check_memory(config, dataset)
    message = str(caught.value)
    assert "\n" not in message
    for text in ("BSARec needs about", "is available on cpu", "train_batch_size (at most"):
        assert text in message
    assert "memory_check=False" in message
    # The batch it advises fits the estimate.
    advised = int(message.split("train_batch_size (at most ")[1].split(")")[0])
    shape = step_shape(config, dataset.item_num)
    assert estimate_bytes("BSARec", replace(shape, batch=advised)) <= needed // 3
    assert estimate_bytes("BSARec", replace(shape, batch=advised + 1)) > needed // 3


def test_memory_check_false_lets_the_run_try(small_config, monkeypatch):
    config, dataset = tiny_dataset(small_config, memory_check=False)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1)
    assert check_memory(config, dataset) > 1


def test_length_far_beyond_the_longest_history_is_a_warning(small_config, caplog):
    config, dataset = tiny_dataset(small_config, MAX_ITEM_LIST_LENGTH=200)
    longest = longest_history(dataset) - 1
    assert longest == 15  # write_sequences: at most 16 items per user
    with caplog.at_level(logging.WARNING):
        memory.warn_about_padding(config, longest_history(dataset))
    assert f"the longest history in tiny ({longest} items)" in caplog.text
    caplog.clear()
    config, dataset = tiny_dataset(small_config, MAX_ITEM_LIST_LENGTH=20)
    with caplog.at_level(logging.WARNING):
        check_memory(config, dataset)
    assert "far beyond" not in caplog.text


def test_run_that_cannot_fit_is_refused_before_the_model_is_built(small_config, capsys):
    # 10^5 sequences of 4,000 positions: terabytes of attention matrices on any machine.
    settings = dict(small_config, train_batch_size=100_000, MAX_ITEM_LIST_LENGTH=4000)
    code = main(["--model=BSARec", "--dataset=tiny", *cli_args(settings)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert err.startswith("error: BSARec needs about")
    assert "MAX_ITEM_LIST_LENGTH (about" in err and "the longest history has 15" in err
    assert not list(Path(small_config["checkpoint_dir"]).glob("*"))


def test_on_cuda_the_estimate_only_warns(small_config, monkeypatch, caplog):
    config, dataset = tiny_dataset(small_config)
    config["device"] = "cuda:0"  # the check reads the name only; no GPU is touched
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1)
    with caplog.at_level(logging.WARNING):
        assert check_memory(config, dataset) > 1
    assert "from the CPU calibration; trying anyway" in caplog.text


def test_running_out_of_memory_while_training_is_one_line_exit_1(small_config, capsys, monkeypatch):
    import torch

    from recbole_freq.model.sequential_recommender.bsarec import BSARec

    def out_of_memory(self, interaction):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(BSARec, "calculate_loss", out_of_memory)
    code = main(["--model=BSARec", "--dataset=tiny", *cli_args(small_config)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert err.startswith("error: out of memory on cpu while running BSARec (train_batch_size=64")


def test_tisasrec_at_length_2000_is_refused_before_its_relations_fill_the_memory(
    small_config, monkeypatch, capsys
):
    """On a machine with CI's 24 GiB, in one line, before anything is built."""
    config, dataset = tiny_dataset(
        small_config, model="TiSASRec", MAX_ITEM_LIST_LENGTH=2000, train_batch_size=256
    )
    shape = step_shape(config, dataset.item_num)
    assert shape.buckets == config["time_span"] + 1
    sasrec = estimate_bytes("SASRec", dataclasses.replace(shape, buckets=0))
    relations = 1.0 * 256 * shape.layers * shape.heads * 2000 * (2000 + shape.buckets) * 4
    assert estimate_bytes("TiSASRec", shape) == sasrec + int(relations)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 24 * 2**30)
    with pytest.raises(MemoryGuardError, match=r"^TiSASRec needs about .* GiB per training step"):
        check_memory(config, dataset)
    overrides = dict(small_config, MAX_ITEM_LIST_LENGTH=2000, train_batch_size=256)
    assert main(["--model=TiSASRec", "--dataset=tiny", *cli_args(overrides)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: TiSASRec needs about")
