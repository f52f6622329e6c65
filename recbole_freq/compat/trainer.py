"""RecBole's trainer and quick-start: checkpoints read safely and written whole, metrics
that evaluate, torch's current AMP names.

2. torch >= 2.6 made ``torch.load(weights_only=True)`` the default, and RecBole's
   checkpoints hold a pickled ``Config``, so ``Trainer.evaluate(load_best_model=True)``
   fails.  Unpickling it in full is no answer: a pickle runs code.  So every
   ``torch.load`` of RecBole's trainer and quick-start modules (``resume_checkpoint``,
   ``load_data_and_model``, ``evaluate(load_best_model=True)``) goes through the
   restricted loader of ``recbole_freq.checkpoint.loader``, whoever wrote the file, and
   their ``torch.save`` through the plugin's atomic writer (``recbole_freq.utils.files``)
   in the plain form that loader reads, so a failed re-save (a full disk) never replaces
   the previous good checkpoint.  This is global (the modules' ``torch``), so RecBole's
   own quick-start is safe in a process that imported the plugin.  The plugin's trainer
   (``protocol.trainer.FreqTrainer``) also keeps the weights it saved last in memory and
   tests on them, not on the file read back.
   ``recbole.quick_start.load_data_and_model`` imports torch inside the function, so it
   is replaced as a whole (``load_data_and_model`` below: the same six values, through
   the plugin's ``restore_model``); the quick-start module is patched when it is first
   imported (fix 12).  RecBole issues #2215 (evaluate after training), #2212 (the same
   break in NeuMF).  Tests: ``test_compat.test_recboles_trainer_*``,
   ``test_untrusted_files``, ``test_recbole_habits.test_recboles_load_data_and_model_*``.

10. ``Collector.get_data_struct`` calls ``.cpu()`` on everything it collected, but the
    item count that ``ItemCoverage``, ``AveragePopularity``, ``GiniIndex`` and
    ``TailPercentage`` need is an ``int``: every run with one of these metrics failed at
    its first evaluation.  The replacement moves only tensors.  RecBole issue #2131.
    Test: ``test_recbole_habits.test_recboles_non_accuracy_metrics_are_evaluated``.

11. RecBole's trainer builds ``torch.cuda.amp.GradScaler`` every epoch, which torch >= 2.4
    deprecates with a ``FutureWarning`` printed into every training run.  The trainer
    module's ``amp`` becomes ``torch.amp``'s ``GradScaler`` and ``autocast`` for
    ``"cuda"``, the same objects without the notice.  No RecBole issue found.  Test:
    ``test_recbole_habits.test_training_prints_no_grad_scaler_deprecation``.

21. Under mixed precision on CUDA (``enable_amp``), RecBole's FEARec stops in its first
    step: its frequency attention (``HybridAttention``) writes the FFT of float16
    activations into complex64 buffers, which torch refuses ("Index put requires the
    source and destination dtypes match, got ComplexFloat for the destination and
    ComplexHalf for the source", seen on an H200, ``benchmarks/results/gpu-suite/``), and
    cuFFT transforms float16 only at power-of-two lengths.  The attention block runs in
    float32 under autocast, as the plugin's own frequency filters do; the rest of the
    model keeps the mixed precision.  No RecBole issue found.  Tests:
    ``test_fearec.test_fearecs_frequency_attention_computes_in_float32_under_autocast``,
    ``test_gpu.test_every_model_trains_an_epoch_on_cuda[FEARec-amp]``.
"""

from __future__ import annotations

import copy
import functools
import os
import sys
import types

from recbole_freq.compat.import_hooks import when_imported
from recbole_freq.compat.plugin_parts import part


def _restricted_load(f, map_location=None, **_ignored):
    """``torch.load`` for RecBole's modules: the restricted checkpoint loader, always."""
    return part("load_checkpoint")(f, map_location=map_location or "cpu")


def _atomic_save(obj, f, *args, **kwargs):
    """``torch.save`` for RecBole's modules: whole or not at all (``recbole_freq.utils.files``),
    and a checkpoint (a dict with the run's ``Config``) in the plain form that torch's
    weights-only loader reads (``recbole_freq.checkpoint.schema``)."""
    import torch
    from recbole.config import Config

    if isinstance(obj, dict) and isinstance(obj.get("config"), Config):
        obj, args = part("plain_checkpoint")(obj), ()
        kwargs.pop("pickle_protocol", None)  # RecBole's 4; the weights-only loader reads 2
    if not isinstance(f, (str, os.PathLike)):
        return torch.save(obj, f, *args, **kwargs)
    from recbole_freq.utils.files import write_atomic

    write_atomic(f, lambda handle: torch.save(obj, handle, *args, **kwargs))


def _torch_with_safe_files() -> types.ModuleType:
    import torch

    shim = types.ModuleType("torch_with_safe_checkpoint_files")
    shim.__getattr__ = lambda name: getattr(torch, name)  # noqa: E731 (module __getattr__)
    shim.load = _restricted_load
    shim.save = _atomic_save
    return shim


def load_data_and_model(model_file):
    """RecBole's ``recbole.quick_start.load_data_and_model`` on the restricted loader of
    ``recbole_freq.checkpoint.loader`` (fix 2): the same six values, for RecBole's and the
    plugin's models, on the GPU when there is one, and no code run from the file."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    # RecBole's API has no --trust_data, and RecBole's own checkpoints record no dataset
    # fingerprint: they are used on the data found, as RecBole itself would.
    model, config, dataset, (train_data, valid_data, test_data), _ = part("restore_model")(
        model_file, device=device, trust_data=True
    )
    return config, model, dataset, train_data, valid_data, test_data


def _patch_recbole_quick_start(quick_start) -> None:
    import recbole.data
    import recbole.utils

    quick_start.torch = _torch_with_safe_files()
    quick_start.load_data_and_model = load_data_and_model
    # What fixes 7 and 8 put in place, for a quick-start imported before the plugin.
    quick_start.init_logger = recbole.utils.init_logger
    quick_start.create_dataset = recbole.data.create_dataset
    package = sys.modules.get("recbole.quick_start")
    if package is not None and hasattr(package, "load_data_and_model"):
        package.load_data_and_model = load_data_and_model


def guard_recboles_quick_start() -> None:
    when_imported("recbole.quick_start.quick_start", _patch_recbole_quick_start)


def patch_recbole_checkpoint_loading() -> None:
    when_imported("recbole.trainer.trainer", _patch_trainer_checkpoints)


def _patch_trainer_checkpoints(trainer_module) -> None:
    trainer_module.torch = _torch_with_safe_files()


def collector_moves_only_tensors() -> None:
    when_imported("recbole.evaluator.collector", _patch_collector)


def _patch_collector(collector_module) -> None:
    Collector = collector_module.Collector

    def get_data_struct(self):
        # RecBole's, but its counts (ints, e.g. the item count for ItemCoverage) stay as
        # they are instead of failing on ``.cpu()``.
        data = self.data_struct._data_dict
        for key, value in data.items():
            if hasattr(value, "cpu"):
                data[key] = value.cpu()
        returned_struct = copy.deepcopy(self.data_struct)
        for key in ["rec.topk", "rec.meanrank", "rec.score", "rec.items", "data.label"]:
            if key in self.data_struct:
                del self.data_struct[key]
        return returned_struct

    Collector.get_data_struct = get_data_struct


def grad_scaler_of_torch_amp() -> None:
    when_imported("recbole.trainer.trainer", _patch_grad_scaler)


def _patch_grad_scaler(trainer_module) -> None:
    import torch

    trainer_module.amp = types.SimpleNamespace(
        GradScaler=functools.partial(torch.amp.GradScaler, "cuda"),
        autocast=functools.partial(torch.amp.autocast, "cuda"),
    )


def fearec_attention_in_float32() -> None:
    when_imported("recbole.model.sequential_recommender.fearec", _patch_hybrid_attention)


def _patch_hybrid_attention(fearec_module) -> None:
    import torch

    attention = fearec_module.HybridAttention
    if getattr(attention.forward, "_recbole_freq_float32", False):
        return
    mixed_forward = attention.forward

    @functools.wraps(mixed_forward)
    def forward(self, input_tensor, attention_mask):
        device_type = input_tensor.device.type
        if not torch.is_autocast_enabled(device_type):
            return mixed_forward(self, input_tensor, attention_mask)
        with torch.autocast(device_type=device_type, enabled=False):
            return mixed_forward(self, input_tensor.float(), attention_mask.float())

    forward._recbole_freq_float32 = True
    attention.forward = forward
