"""The fast step (``protocol.fast_step``) against the plain path, on the CPU: the
overlapped loader gives the same run bit for bit, the compiled step the same numbers to
float rounding; ``tests/test_gpu.py`` checks both on CUDA (pinned copies, CUDA graphs)."""

import threading

import pytest
import torch

from recbole_freq.protocol import fast_step, trainer
from recbole_freq.quick_start.quick_start import run


def _numbers(summary):
    history = [(epoch["train_loss"], epoch.get("valid_score")) for epoch in summary["history"]]
    return history, summary["test_result"]


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "recbole-freq-prefetch"]


@pytest.mark.parametrize(
    "model, extra",
    [
        ("SASRec", {}),  # RecBole's own model, cross-entropy
        ("BSARec", {"train_loss": "bce"}),  # negatives drawn by the step from torch's generator
        ("DuoRec", {}),  # same-target positives drawn by the step
    ],
)
def test_overlapped_loader_gives_the_same_run_bit_for_bit(small_config, monkeypatch, model, extra):
    views = []
    real = trainer.prefetching

    def counting(loader, device):
        view = real(loader, device)
        views.append(type(view).__name__)
        return view

    monkeypatch.setattr(trainer, "prefetching", counting)
    settings = dict(small_config, **extra)
    plain = run(model, "tiny", config_dict=dict(settings, overlap_loader=False))
    assert views == []
    overlapped = run(model, "tiny", config_dict=dict(settings, overlap_loader=True))
    # Every training epoch and every evaluation went through the prefetching view.
    assert "PrefetchingTrainDataLoader" in views
    assert "PrefetchingFullSortEvalDataLoader" in views
    assert _numbers(overlapped) == _numbers(plain)
    assert _prefetch_threads() == []


def test_prefetching_view_is_the_loader_and_leaves_no_thread(small_config):
    from recbole.data import create_dataset, data_preparation

    from recbole_freq.config.configurator import FreqConfig

    config = FreqConfig("SASRec", "tiny", config_dict=small_config)
    train, valid, _ = data_preparation(config, create_dataset(config))
    view = fast_step.prefetching(train, "cpu")
    assert isinstance(view, type(train)) and len(view) == len(train)
    assert fast_step.prefetching(view, "cpu") is view
    view.some_mark = 1  # the view's state is the loader's
    assert train.some_mark == 1
    torch.manual_seed(0)
    before = [batch.interaction["item_id"].clone() for batch in train]
    torch.manual_seed(0)
    train.generator.manual_seed(config["seed"])  # the loader's own order, again
    train_view = fast_step.prefetching(train, "cpu")
    torch.manual_seed(0)
    train.generator.manual_seed(config["seed"])
    after = [batch.interaction["item_id"] for batch in train_view]
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before))
    # A consumer that stops early stops the thread.
    for _ in fast_step.prefetching(valid, "cpu"):
        break
    iterator = iter(train_view)
    next(iterator)
    iterator.close()
    assert _prefetch_threads() == []


def test_a_loader_error_is_raised_in_the_step_not_lost_in_the_thread():
    class Failing:
        def __iter__(self):
            yield "first"
            raise OSError("disk gone")

    view = fast_step.prefetching(Failing(), "cpu")
    with pytest.raises(OSError, match="disk gone"):
        list(view)
    assert _prefetch_threads() == []


@pytest.mark.parametrize(
    "model, extra",
    [
        ("BSARec", {"protocol": "bsarec"}),  # history_mask zero
        # history_mask exclude; BCE: negatives drawn eagerly inside the step
        ("SASRec", {"history_mask": "exclude", "train_loss": "bce"}),
    ],
)
def test_compiled_step_gives_the_eager_numbers(small_config, monkeypatch, model, extra):
    # aot_eager traces the step as torch.compile does and runs it with eager kernels
    # (inductor's C++ compile takes minutes on two cores; tests/test_gpu.py compiles
    # with CUDA graphs).
    made = []
    real = fast_step.StaticShapeSteps

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(trainer, "StaticShapeSteps", recording)
    torch._dynamo.reset()
    settings = dict(small_config, **extra)
    eager = run(model, "tiny", config_dict=dict(settings, compile_step=False))
    compiled = run(
        model,
        "tiny",
        config_dict=dict(settings, compile_step=True, compile_backend="aot_eager"),
    )
    (steps,) = made
    # Full batches compiled (training and full-sort scores); the last, partial batch of
    # each training pass eager.
    assert steps.calls["compiled"] > 0 and steps.calls["eager"] > 0
    assert {kind for kind, _ in steps.compiled} == {"train", "eval"}
    eager_history, eager_test = _numbers(eager)
    compiled_history, compiled_test = _numbers(compiled)
    for (loss_a, valid_a), (loss_b, valid_b) in zip(eager_history, compiled_history):
        assert loss_b == pytest.approx(loss_a, rel=1e-5)
        assert valid_b == pytest.approx(valid_a, abs=1e-4)
    assert compiled_test == pytest.approx(eager_test, abs=1e-4)


def test_a_mode_that_is_not_torch_compiles_is_refused(small_config):
    with pytest.raises(ValueError, match="compile_mode='fast' is not one of torch.compile's"):
        run(
            "SASRec", "tiny", config_dict=dict(small_config, compile_step=True, compile_mode="fast")
        )
