"""A training step and a full-sort evaluation without the loader's and the launches' wait.

Every epoch: ``train_pass``, RecBole's training loop without its two reads of the device
in each step (the same numbers, bit for bit).  Two settings, both off by default, each
checked against the plain path by ``tests/test_fast_step.py``:

- ``overlap_loader: True`` -- ``prefetching``: the loader collates the next batch in
  a background thread while this step runs; on CUDA that batch is also pinned and copied
  to the device on a side stream without blocking.  The loader draws only from its own
  generators (RecBole's seeded ``torch.Generator`` for the order, numpy's and Python's
  for negatives and augmentations), the step only from torch's, so the same seed gives
  the same batches and the same numbers as without it (bit for bit, tested on the CPU).
- ``compile_step: True`` -- ``StaticShapeSteps``: the training loss and the full-sort
  scores run through ``torch.compile`` with static shapes; on CUDA its default mode is
  ``reduce-overhead``, which records the step's kernels as CUDA graphs and replays them
  with one launch.  Only batches of the loader's full size take the compiled path (the
  first batch of a pass sets that size); the last, partial batch of a pass runs eagerly,
  so nothing recompiles and nothing is padded.  Compiled kernels fuse operations, so the
  numbers equal the eager path's to float rounding, not bit for bit (inductor also draws
  dropout from its own generator unless ``torch._inductor.config.fallback_random``).

Why: per training step at batch 256, length 50, hidden 64, SASRec's arithmetic needs well
under a millisecond on an H100, but the eager step launches a few hundred kernels from
Python and waits for the loader's 1.5-1.9 ms of collation (issue 67).
"""

from __future__ import annotations

import queue
import threading

import torch
from recbole.data.interaction import Interaction

# How many batches the background thread may collate ahead of the step.
PREFETCH_DEPTH = 2
# `compile_mode` unset: CUDA graphs on CUDA (one launch per recorded step), inductor's
# fused kernels elsewhere.
DEFAULT_COMPILE_MODE = {"cuda": "reduce-overhead"}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class _Prefetching:
    """Mixed in before a loader's own class (``prefetching``): iteration hands out
    batches a background thread has collated ahead and, on CUDA, already copied to
    ``prefetch_device``."""

    prefetch_device: torch.device
    prefetch_depth: int = PREFETCH_DEPTH

    def __iter__(self):
        device = self.prefetch_device
        cuda = device.type == "cuda"
        copy_stream = torch.cuda.Stream(device) if cuda else None
        batches: queue.Queue = queue.Queue(maxsize=self.prefetch_depth)
        stop = threading.Event()
        # The loader's own iteration (its order from its own seeded generator), started
        # here and run by the thread.
        source = super().__iter__()

        def hand_over(entry) -> bool:
            while not stop.is_set():
                try:
                    batches.put(entry, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def produce():
            try:
                for batch in source:
                    ready = None
                    if cuda:
                        with torch.cuda.stream(copy_stream):
                            batch = _to_device(batch, device)
                            ready = torch.cuda.Event()
                            ready.record(copy_stream)
                    if not hand_over(("batch", batch, ready)):
                        return
                hand_over(("end", None, None))
            except BaseException as error:  # handed to the consumer, raised there
                hand_over(("error", error, None))

        worker = threading.Thread(target=produce, name="recbole-freq-prefetch", daemon=True)
        worker.start()
        try:
            while True:
                kind, batch, ready = batches.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise batch
                if ready is not None:
                    current = torch.cuda.current_stream(device)
                    current.wait_event(ready)
                    _record_stream(batch, current)
                yield batch
        finally:
            stop.set()
            while worker.is_alive():
                try:
                    batches.get(timeout=0.05)
                except queue.Empty:
                    pass
            worker.join()


_PREFETCHING_CLASSES: dict = {}


def prefetching(loader, device):
    """``loader`` itself, seen through a class that prefetches (``_Prefetching``): the
    view shares the loader's state, so it is still an instance of the loader's class
    (RecBole's evaluation tells full-sort from sampled loaders by class) and every
    attribute read or set is the loader's."""
    if isinstance(loader, _Prefetching):
        return loader
    device = torch.device(device)
    base = type(loader)
    key = (base, str(device))
    if key not in _PREFETCHING_CLASSES:
        _PREFETCHING_CLASSES[key] = type(
            f"Prefetching{base.__name__}",
            (_Prefetching, base),
            {"prefetch_device": device, "__module__": __name__},
        )
    view = object.__new__(_PREFETCHING_CLASSES[key])
    # torch's DataLoader refuses some attributes once set up: bypass its __setattr__.
    object.__setattr__(view, "__dict__", loader.__dict__)
    return view


def _to_device(batch, device):
    # Only the Interactions move (a full-sort batch's history index and positives stay
    # where RecBole's evaluation expects them).
    if isinstance(batch, Interaction):
        return Interaction(
            {
                key: value.pin_memory().to(device, non_blocking=True)
                if isinstance(value, torch.Tensor)
                else value
                for key, value in batch.interaction.items()
            }
        )
    if isinstance(batch, tuple):
        return tuple(
            _to_device(part, device) if isinstance(part, Interaction) else part for part in batch
        )
    return batch


def _record_stream(batch, stream) -> None:
    # The copies were made on the side stream: tell the allocator the step's stream uses
    # them, so their memory is not reused before the step is done.
    parts = batch if isinstance(batch, tuple) else (batch,)
    for part in parts:
        if isinstance(part, Interaction):
            for value in part.interaction.values():
                if isinstance(value, torch.Tensor) and value.is_cuda:
                    value.record_stream(stream)


class StaticShapeSteps:
    """The compiled training loss and full-sort scores of one model (module docstring):
    a batch of the pass's full size runs compiled, any other size eagerly."""

    def __init__(self, model, device, mode: str | None = None, backend: str = "inductor"):
        if mode is not None and mode not in COMPILE_MODES:
            raise ValueError(
                f"compile_mode={mode!r} is not one of torch.compile's modes: "
                f"{', '.join(COMPILE_MODES)} (unset: reduce-overhead on CUDA, default elsewhere)"
            )
        device = torch.device(device)
        if mode is None:
            mode = DEFAULT_COMPILE_MODE.get(device.type, "default")
        if backend != "inductor" and mode != "default":
            raise ValueError(
                f"compile_mode={mode!r} is a mode of the inductor backend, not of "
                f"compile_backend={backend!r}: leave compile_mode unset"
            )
        self.model = model
        self.mode = mode
        self.backend = backend
        self.compiled: dict = {}
        self.full_rows: dict[str, int] = {}
        self.calls = {"compiled": 0, "eager": 0}

    def _compile(self, function):
        if self.backend == "inductor":
            return torch.compile(function, mode=self.mode, dynamic=False)
        return torch.compile(function, backend=self.backend, dynamic=False)

    def _run(self, kind: str, function, interaction):
        rows = len(interaction)
        full = self.full_rows.setdefault(kind, rows)
        if rows != full:
            self.calls["eager"] += 1
            return function(interaction)
        key = (kind, function)  # a bound method hashes by its object and function
        if key not in self.compiled:
            self.compiled[key] = (function, self._compile(function))
        self.calls["compiled"] += 1
        return self.compiled[key][1](interaction)

    def new_pass(self, kind: str) -> None:
        """A new pass over a loader: its first batch sets the full size again."""
        self.full_rows.pop(kind, None)

    def loss(self, loss_func):
        """``loss_func`` (the model's ``calculate_loss`` or the protocol's loss), compiled
        for full batches."""

        def step_loss(interaction):
            if torch.cuda.is_available() and self.mode == "reduce-overhead":
                # CUDA graphs replay into the same output memory: tell torch a new
                # iteration starts, so the last one's outputs may be overwritten.
                torch.compiler.cudagraph_mark_step_begin()
            return self._run("train", loss_func, interaction)

        return step_loss

    def full_sort_predict(self, interaction):
        """The model's full-sort scores of ``interaction``, compiled for full batches.
        The result is a copy: the caller writes into it (-inf for padding and history)."""
        if torch.cuda.is_available() and self.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        scores = self._run("eval", self.model.full_sort_predict, interaction)
        return scores.clone()


# Batches between two reads of the NaN flag: a NaN loss stops the epoch within this many
# steps, and the read (a wait for the device) is paid once per this many steps.
NAN_CHECK_EVERY = 50


def train_pass(trainer, train_data, epoch_idx, loss_func=None, show_progress=False):
    """RecBole's ``Trainer._train_epoch`` (1.2.1) without its two waits for the device in
    every step: it reads each batch's loss (``loss.item()``) and tests it for NaN
    (``torch.isnan(loss)`` as a bool) before the next step may be launched, so on a GPU
    the Python of step n+1 cannot run while step n's kernels do.  Here the losses are
    summed on the device in float64 (each batch's loss converted exactly, added in
    RecBole's order: the same sums, bit for bit, as its Python floats) and a NaN flag is
    kept there, read every ``NAN_CHECK_EVERY`` batches and at the end (the same
    ``ValueError``, up to that many batches later).  Everything else is RecBole's step:
    zero_grad, the loss under ``torch.autocast``, the scaler, ``clip_grad_norm``.
    Data-parallel training (``single_spec`` false) keeps RecBole's own loop."""
    from recbole.trainer.trainer import Trainer
    from recbole.utils import get_gpu_usage, set_color
    from torch.nn.utils.clip_grad import clip_grad_norm_
    from tqdm import tqdm

    if not trainer.config["single_spec"]:
        return Trainer._train_epoch(trainer, train_data, epoch_idx, loss_func, show_progress)
    trainer.model.train()
    loss_func = loss_func or trainer.model.calculate_loss
    iter_data = (
        tqdm(train_data, total=len(train_data), ncols=100,
             desc=set_color(f"Train {epoch_idx:>5}", "pink"))
        if show_progress else train_data
    )  # fmt: skip
    # RecBole's scaler as the compatibility module makes it (torch.amp's, for CUDA).
    scaler = torch.amp.GradScaler("cuda", enabled=trainer.enable_scaler)
    totals = None  # float64 device tensors: one per loss part, or one
    nan_seen = None
    for batch_idx, interaction in enumerate(iter_data):
        interaction = interaction.to(trainer.device)
        trainer.optimizer.zero_grad()
        with torch.autocast(device_type=trainer.device.type, enabled=trainer.enable_amp):
            losses = loss_func(interaction)
        parts = losses if isinstance(losses, tuple) else (losses,)
        loss = sum(parts) if isinstance(losses, tuple) else losses
        exact = [part.detach().to(torch.float64) for part in parts]
        totals = exact if totals is None else [t + e for t, e in zip(totals, exact)]
        flag = torch.isnan(loss.detach())
        nan_seen = flag if nan_seen is None else nan_seen | flag
        if (batch_idx + 1) % NAN_CHECK_EVERY == 0:
            _raise_if_nan(nan_seen)
        scaler.scale(loss).backward()
        if trainer.clip_grad_norm:
            clip_grad_norm_(trainer.model.parameters(), **trainer.clip_grad_norm)
        scaler.step(trainer.optimizer)
        scaler.update()
        if trainer.gpu_available and show_progress:
            iter_data.set_postfix_str(
                set_color("GPU RAM: " + get_gpu_usage(trainer.device), "yellow")
            )
    if totals is None:
        return None
    _raise_if_nan(nan_seen)
    values = [total.item() for total in totals]
    return tuple(values) if isinstance(losses, tuple) else values[0]


def _raise_if_nan(nan_seen: torch.Tensor) -> None:
    if bool(nan_seen):
        raise ValueError("Training loss is nan")  # RecBole's _check_nan's words
