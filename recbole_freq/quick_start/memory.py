"""A memory guard: refuse a run whose training step cannot fit the machine.

A Transformer's training step holds, per layer and sequence, a few ``n x n`` attention
matrices per head and a few ``n x hidden`` activations, so memory grows with the square
of ``MAX_ITEM_LIST_LENGTH``; a length of 2,000 on a 24 GB machine was killed by the
kernel instead of stopping with a message.  Before a model is built, ``check_memory``
estimates the step's peak from the settings and the dataset's size::

    bytes = 4 * ( attention * B * layers * heads * n^2      (attention matrices)
                + activations * B * layers * n * (hidden + inner)
                + 3 * B * scored * items                     (CE logits, softmax, gradient)
                + 4 * parameters )                           (weights, gradients, Adam)

``B`` is ``train_batch_size``, ``scored`` the positions whose scores over all items the
loss needs (1, or the masked positions of a cloze model).  The two coefficients per
model family come from ``benchmarks/bench_memory.py``, which measures the peak resident
memory of real training steps at several batch sizes and lengths and fits them so that
the estimate is never below a measured peak (results in
``benchmarks/results/memory-calibration-cpu.md``).  A run whose estimate exceeds the
memory available is refused with one line (estimate, available, what to lower);
``memory_check: False`` skips the check.  On CUDA the same estimate is only a warning:
the calibration is the CPU's, CUDA's fused attention holds less, and a CUDA
out-of-memory error ends the run with one line (``TrainingOutOfMemory``) instead of a
kernel kill.  Attention with time intervals (TiSASRec) adds a third term,
``RELATION_COEFFICIENT * B * layers * heads * n * (n + time_span + 1)``.  Models without
a calibration (most RecBole built-ins) are not checked.  Separately, a length far beyond
the longest history in the data is a warning: the padding costs memory and time.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

# Measured by benchmarks/bench_memory.py (CPU, torch 2.13): per model family, the number
# of float32 n x n attention matrices per head and of n x (hidden + inner) activations
# per layer and sequence that a training step holds at its peak.
COEFFICIENTS = {
    "SASRec": (2.94, 12.17),  # RecBole's, explicit softmax attention
    "BSARec": (4.02, 8.57),
    "FBSARec": (3.52, 12.43),
    "PolyRec": (6.59, 17.08),  # Chebyshev terms of A, contrastive second pass
    "RecDenoiser": (11.36, 16.1),  # masks, ARM's two passes, Jacobian projections
    "BERT4RecDenoiser": (11.13, 16.48),
}
# Attention with time intervals (TiSASRec's, ``time_intervals: True``) adds, per layer
# and head, tensors of n x (n + buckets) values (each query's products with the
# time_span + 1 interval embeddings, each row's probabilities summed per interval) and,
# per step, the float64 and int64 n x n interval matrices: the estimate adds this many
# float32 values times batch * layers * heads * n * (n + time_span + 1).  Fitted on five
# measured steps (ml-100k, every interval bucket in use, hidden 64, 2 layers, 2 heads;
# batch x length 256x50 to 32x500: -0.47 to 0.93 needed;
# benchmarks/results/memory-tisasrec-cpu.md) and rounded up, so that no estimate is below
# its measurement.
RELATION_COEFFICIENT = 1.0
# Models whose memory is their family's plus the relation term.
RELATION_FAMILIES = {"TiSASRec": "SASRec"}
# A length at least this many times the longest history is mostly padding.
PADDING_WARNING_FACTOR = 2


class MemoryGuardError(ValueError):
    """The run's estimated peak memory exceeds what the machine has (a usage error:
    the fix is a smaller setting)."""


@dataclass(frozen=True)
class StepShape:
    """The sizes that set a training step's memory."""

    batch: int
    length: int
    hidden: int
    inner: int
    heads: int
    layers: int
    items: int
    scored: int  # positions scored against every item (CE)
    buckets: int = 0  # interval embeddings of attention with time intervals (0: none)

    @property
    def parameters(self) -> int:
        per_layer = 4 * self.hidden * (self.hidden + 1) + 2 * self.hidden * self.inner
        return (self.items + self.length) * self.hidden + self.layers * per_layer

    def terms(self) -> tuple[float, float, float]:
        """``(attention, activations, fixed)`` element counts of the formula above."""
        attention = self.batch * self.layers * self.heads * self.length**2
        activations = self.batch * self.layers * self.length * (self.hidden + self.inner)
        fixed = 3 * self.batch * self.scored * self.items + 4 * self.parameters
        return float(attention), float(activations), float(fixed)


def step_shape(config, n_items: int) -> StepShape | None:
    """The step shape of ``config``'s model, or None when it has no Transformer sizes."""
    needed = ("train_batch_size", "MAX_ITEM_LIST_LENGTH", "hidden_size", "n_heads", "n_layers")
    if any(not isinstance(config[key], int) for key in needed):
        return None
    hidden = config["hidden_size"]
    inner = config["inner_size"] if isinstance(config["inner_size"], int) else 4 * hidden
    length = config["MAX_ITEM_LIST_LENGTH"]
    scored = 1
    if config["model"] == "BERT4RecDenoiser" or config["model"] == "BERT4Rec":
        ratio = config["mask_ratio"] if config["mask_ratio"] is not None else 0.2
        scored = max(1, math.ceil(ratio * length))
    if config["loss_type"] not in (None, "CE"):
        scored = 0
    return StepShape(
        batch=config["train_batch_size"],
        length=length,
        hidden=hidden,
        inner=inner,
        heads=config["n_heads"],
        layers=config["n_layers"],
        items=n_items,
        scored=scored,
        buckets=_interval_buckets(config),
    )


def _interval_buckets(config) -> int:
    """``time_span + 1`` when attention reads time intervals, else 0."""
    if config["time_intervals"] is not True:
        return 0
    span = config["time_span"]
    return (span if isinstance(span, int) and span > 0 else 256) + 1


def estimate_bytes(model: str, shape: StepShape) -> int | None:
    """Estimated peak bytes of one training step above the set-up footprint, or None
    for a model without a calibration."""
    family = RELATION_FAMILIES.get(model, model)
    if family not in COEFFICIENTS:
        return None
    attention, activations = COEFFICIENTS[family]
    relations = 0.0
    if shape.buckets:
        relations = RELATION_COEFFICIENT * shape.batch * shape.layers * shape.heads
        relations *= shape.length * (shape.length + shape.buckets)
    a, b, fixed = shape.terms()
    return int(4 * (attention * a + activations * b + fixed + relations))


def available_bytes(device) -> int | None:
    """Memory the run can still take on ``device``: free GPU memory, or on the CPU the
    smaller of the kernel's ``MemAvailable`` and the room left in this process's cgroup.
    None when unknown."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    candidates = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                candidates.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    room = _cgroup_room()
    if room is not None:
        candidates.append(room)
    return min(candidates) if candidates else None


def _cgroup_room() -> int | None:
    """Bytes left under this process's cgroup v2 memory limit, or None without one."""
    try:
        relative = Path("/proc/self/cgroup").read_text().strip().splitlines()[0].split("::", 1)
        folder = Path("/sys/fs/cgroup") / relative[1].lstrip("/") if len(relative) == 2 else None
        if folder is None:
            return None
        limit = (folder / "memory.max").read_text().strip()
        if limit == "max":
            return None
        used = int((folder / "memory.current").read_text().strip())
        return max(0, int(limit) - used)
    except (OSError, ValueError, IndexError):
        return None


def longest_history(dataset) -> int:
    """The most interactions any user has in ``dataset`` (a RecBole dataset): the
    longest sequence a model of this data ever reads is one shorter."""
    users = dataset.inter_feat[dataset.uid_field]
    users = users.numpy() if hasattr(users, "numpy") else np.asarray(users)
    return int(np.bincount(users).max()) if len(users) else 0


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_memory(config, dataset, logger=None, users_longest: int | None = None) -> int | None:
    """Refuse a step that cannot fit (see the module docstring).  ``users_longest``:
    ``longest_history(dataset)`` taken before ``data_preparation`` (which rewrites the
    dataset's interactions); by default it is taken now.  Returns the estimate in bytes
    (None when not estimated)."""
    logger = logger or logging.getLogger()
    longest = (users_longest or longest_history(dataset)) - 1
    shape = step_shape(config, dataset.item_num)
    estimate = estimate_bytes(config["model"], shape) if shape is not None else None
    available = available_bytes(config["device"]) if estimate is not None else None
    if available is not None and estimate > available and config["memory_check"] is not False:
        message = _refusal(config, shape, estimate, available, longest)
        if not str(config["device"]).startswith("cuda"):
            raise MemoryGuardError(message)
        # Calibrated on the CPU: CUDA's fused attention holds less, and running out of GPU
        # memory is an error the run reports (TrainingOutOfMemory), not a kernel kill.
        logger.warning(f"{message} (estimate from the CPU calibration; trying anyway)")
    return estimate


def warn_about_padding(config, users_longest: int, logger=None) -> None:
    """Warn about a ``MAX_ITEM_LIST_LENGTH`` far beyond the longest history."""
    logger = logger or logging.getLogger()
    longest = users_longest - 1
    length = config["MAX_ITEM_LIST_LENGTH"]
    if isinstance(length, int) and longest > 0 and length >= PADDING_WARNING_FACTOR * longest:
        logger.warning(
            f"MAX_ITEM_LIST_LENGTH={length} is far beyond the longest history in "
            f"{config['dataset']} ({longest} items): the extra positions are padding that "
            f"costs memory and time; MAX_ITEM_LIST_LENGTH={longest} holds every history"
        )


class TrainingOutOfMemory(RuntimeError):
    """The device ran out of memory during the run (an environment failure, exit 1)."""

    def __init__(self, config):
        super().__init__(
            f"out of memory on {config['device']} while running {config['model']} "
            f"(train_batch_size={config['train_batch_size']}, eval_batch_size="
            f"{config['eval_batch_size']}, MAX_ITEM_LIST_LENGTH="
            f"{config['MAX_ITEM_LIST_LENGTH']}): lower one of them, or free the device"
        )


def _refusal(config, shape: StepShape, estimate: int, available: int, longest: int) -> str:
    model = config["model"]
    # Largest batch whose estimate fits (memory is affine in the batch size).
    per_row = (estimate_bytes(model, _with(shape, batch=2)) or 0) - (
        estimate_bytes(model, _with(shape, batch=1)) or 0
    )
    base = (estimate_bytes(model, _with(shape, batch=1)) or 0) - per_row
    batch_fits = int((available - base) // per_row) if per_row > 0 else 0
    length_fits = shape.length
    while length_fits > 1 and estimate_bytes(model, _with(shape, length=length_fits)) > available:
        length_fits = max(1, int(length_fits * 0.9))
    lower = []
    if batch_fits >= 1:
        lower.append(f"train_batch_size (at most {batch_fits})")
    if length_fits < shape.length:
        hint = f"; the longest history has {longest}" if longest > 0 else ""
        lower.append(f"MAX_ITEM_LIST_LENGTH (about {length_fits}{hint})")
    lower.append("n_layers or n_heads")
    return (
        f"{model} needs about {_gib(estimate)} per training step (train_batch_size="
        f"{shape.batch}, MAX_ITEM_LIST_LENGTH={shape.length}, hidden_size={shape.hidden}, "
        f"n_heads={shape.heads}, n_layers={shape.layers}) but {_gib(available)} is available "
        f"on {config['device']}; lower {', or '.join(lower)}, or set memory_check=False to try anyway"
    )


def _with(shape: StepShape, **changes) -> StepShape:
    return replace(shape, **changes)
