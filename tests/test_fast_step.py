"""The fast step (``protocol.fast_step``) against the plain path, on the CPU: the
overlapped loader gives the same run bit for bit, the compiled step the same numbers to
float rounding; ``tests/test_gpu.py`` checks both on CUDA (pinned copies, CUDA graphs)."""

import copy
import sys
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


# --- the epoch without per-step waits (fast_step.train_pass) -------------------------


def _recbole_pass(trainer_object, train_data, epoch_idx, loss_func=None, show_progress=False):
    from recbole.trainer import Trainer

    return Trainer._train_epoch(trainer_object, train_data, epoch_idx, loss_func, show_progress)


@pytest.mark.parametrize(
    "model, extra",
    [("SASRec", {}), ("BSARec", {"train_loss": "bce"}), ("DuoRec", {})],
)
def test_the_epoch_without_waits_is_recboles_epoch_bit_for_bit(
    small_config, monkeypatch, model, extra
):
    """The losses summed on the device in float64 equal RecBole's Python sums of
    ``loss.item()``, and the weights are the same bits."""
    settings = dict(small_config, **extra)
    ours = run(model, "tiny", config_dict=settings)
    monkeypatch.setattr(trainer, "train_pass", _recbole_pass)
    recboles = run(model, "tiny", config_dict=settings)
    assert _numbers(ours) == _numbers(recboles)
    assert ours["weights_sha256"] == recboles["weights_sha256"]


def _tiny_trainer(small_config, model="SASRec"):
    from recbole_freq.quick_start.quick_start import prepare_run

    config, _, (train, _, _), network = prepare_run(model, "tiny", config_dict=small_config)
    return trainer.trainer_for(config, network), train


class _HostReads:
    """Counts the training loop's own reads of a tensor's value by the host (``item``,
    ``bool``, called from RecBole's trainer module or from ``fast_step``), not the model's,
    the loader's or the optimiser's."""

    LOOPS = ("fast_step.py", "recbole/trainer/trainer.py")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in ("item", "__bool__"):
            real = getattr(torch.Tensor, name)

            def counting(tensor, _real=real):
                caller = sys._getframe(1).f_code.co_filename.replace("\\", "/")
                self.count += caller.endswith(self.LOOPS)
                return _real(tensor)

            monkeypatch.setattr(torch.Tensor, name, counting)


def test_the_epoch_reads_the_device_once_per_fifty_steps_not_twice_a_step(
    small_config, monkeypatch
):
    """A tuple of loss parts (each summed apart, as RecBole does) over more than 50
    batches: the loop reads the NaN flag every 50 steps and at the end and each part's sum
    once, where RecBole's reads each part and the NaN test every step; the sums equal
    RecBole's to the bit."""
    settings = dict(small_config, train_batch_size=4)
    freq_trainer, train = _tiny_trainer(settings)
    assert len(train) > fast_step.NAN_CHECK_EVERY

    def two_parts(interaction):
        loss = freq_trainer.model.calculate_loss(interaction)
        return loss, 0.5 * loss

    start = copy.deepcopy(freq_trainer.model.state_dict())
    passes = {}
    for name, one_pass in (("ours", fast_step.train_pass), ("recbole", _recbole_pass)):
        freq_trainer.model.load_state_dict(start)
        freq_trainer.optimizer = freq_trainer._build_optimizer()
        torch.manual_seed(0)
        train.generator.manual_seed(settings["seed"])
        with monkeypatch.context() as patch:
            reads = _HostReads(patch)
            losses = one_pass(freq_trainer, train, 0, two_parts)
        passes[name] = (losses, reads.count)
    (ours, our_reads), (theirs, their_reads) = passes["ours"], passes["recbole"]
    assert our_reads == len(train) // fast_step.NAN_CHECK_EVERY + 1 + 2  # flags; two sums
    assert their_reads == 3 * len(train)
    assert isinstance(ours, tuple) and all(isinstance(part, float) for part in ours)
    assert ours == theirs


def test_a_nan_loss_stops_the_epoch_with_recboles_error(small_config):
    freq_trainer, train = _tiny_trainer(dict(small_config, train_batch_size=4))
    steps = []

    def nan_at_third(interaction):
        steps.append(1)
        loss = freq_trainer.model.calculate_loss(interaction)
        return loss * float("nan") if len(steps) == 3 else loss

    with pytest.raises(ValueError, match="Training loss is nan"):
        fast_step.train_pass(freq_trainer, train, 0, nan_at_third)
    assert len(steps) == fast_step.NAN_CHECK_EVERY  # stopped at the first read of the flag


def test_a_builtin_trainers_own_epoch_is_kept():
    """A RecBole trainer with an epoch of its own (``trainer_class``'s FreqX) keeps it."""
    from recbole.trainer import Trainer

    class OwnEpoch(Trainer):
        def _train_epoch(self, *args, **kwargs):
            return "its own epoch"

    combined = type("FreqOwnEpoch", (trainer.FreqTrainer, OwnEpoch), {})
    assert object.__new__(combined)._one_pass(None, 0, None, False) == "its own epoch"


def test_the_epoch_bench_times_recboles_loop_against_ours_with_equal_numbers(
    tiny_data, tmp_path, monkeypatch
):
    """``benchmarks/bench_epoch.py --modes "RecBole's loop,plain"``: two real runs, the
    first through RecBole's loop (its two epochs), the same losses and metrics; the bench
    leaves the plugin's loop in place."""
    import json
    import pathlib

    from recbole.trainer import Trainer

    recbole_epochs = []
    recboles = Trainer._train_epoch

    def counted(*args, **kwargs):
        recbole_epochs.append(1)
        return recboles(*args, **kwargs)

    monkeypatch.setattr(Trainer, "_train_epoch", counted)

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import bench_epoch
    finally:
        sys.path.pop(0)
    argv = ["--dataset", "tiny", "--data_path", str(tiny_data), "--no-paper", "--epochs", "2",
            "--modes", "RecBole's loop,plain", "--models", "SASRec", "--out", str(tmp_path),
            "--name", "loops"]  # fmt: skip
    assert bench_epoch.main(argv) == 0
    runs = {r["mode"]: r for r in json.loads((tmp_path / "loops.json").read_text())["results"]}
    assert set(runs) == {"RecBole's loop", "plain"} and len(recbole_epochs) == 2
    for key in ("train_loss", "valid_score", "test_result"):
        assert runs["RecBole's loop"][key] == runs["plain"][key]
    assert trainer.train_pass is fast_step.train_pass
    assert "| SASRec | RecBole's loop |" in (tmp_path / "loops.md").read_text()
