"""Data-parallel training (``--nproc N``): RecBole's own DDP machinery, launched by the
plugin and made exact where RecBole's is not.

RecBole 1.2.1 (``run_recbole(..., nproc=N)``) spawns N processes; each builds its
``Config`` with a ``local_rank``, which opens the process group (``nccl`` on CUDA,
``gloo`` on the CPU: compat fix 14), wraps the model in ``DistributedDataParallel``
(fix 15) and trains on its shard of every mini-batch: a ``DistributedSampler`` hands
each rank ``train_batch_size / world_size`` rows of each global batch, and DDP's reduce
hooks (``set_reduce_hook``, ``sync_grad_loss``) average the gradients over the ranks
before every optimizer step, so all ranks hold the same weights.

The plugin keeps that for training and changes three things:

- **Evaluation is one process's.**  RecBole shards the evaluation rows too and averages
  each rank's metrics (``_map_reduce``), after rounding them, weighted by rows that
  ``DistributedSampler`` repeats to even out the shards: the numbers differ from one
  process's on the same weights.  Here the evaluation loaders are whole, global rank 0
  evaluates every row and broadcasts the result, so validation (hence early stopping,
  on every rank alike) and test metrics are those of one process on the same weights.
- **One process writes**: global rank 0 writes the log, checkpoint, summary and
  TensorBoard events (fix 16); the others log errors only.  A data-parallel run keeps no
  resume state (``--resume`` is for one-process runs).
- **Shuffling follows the seed**: RecBole's ``DistributedSampler`` shuffles with seed 0
  whatever ``seed`` says; here it uses ``seed``.

What each training objective means with N ranks (every rank computes its loss on its own
shard, and the gradients are averaged):

- a loss that is a mean over rows (RecBole's CE and BPR, BERT4Rec's cloze loss) has the
  gradient of the mean over the global batch, as in one process;
- SASRec's per-position BCE (``--protocol=sasrec``) is averaged per rank, so a rank's
  targets weigh ``1 / (ranks x its targets)``, not ``1 / all targets``: equal when the
  shards hold as many target positions;
- Rec-Denoiser: the sparsity scale of ``batch_targets`` / ``batch`` uses
  ``train_batch_size``, the global batch, so beta presses on the masks as in one process;
  each rank draws its own mask noise (ARM / AR), so the masks' gradient is the mean of
  ``world_size`` independent estimates (unbiased, lower variance); the Jacobian term is
  a mean over rows, as the loss;
- in-batch contrastive terms (PolyRec, DuoRec, CL4SRec, FEARec) use **per-rank
  negatives**: each anchor is contrasted with the other rows of its rank's shard,
  ``train_batch_size / world_size - 1`` of them instead of ``train_batch_size - 1``.
  Gathering the other ranks' views would cost an all-gather per step and is not done;
  to keep one process's negatives, multiply ``train_batch_size`` by ``world_size``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import tempfile

import torch

from recbole_freq.utils.process_group import meet_through_file
from recbole_freq.utils.signals import RunInterrupted

__all__ = [
    "DataParallelError",
    "data_parallel_settings",
    "is_data_parallel",
    "run_data_parallel",
    "shard_training_loader",
    "whole_loaders",
]

# Keys RecBole's launcher gives each process (``recbole.quick_start.run``).
LAUNCH_KEYS = ("nproc", "world_size", "ip", "port", "offset")


class DataParallelError(ValueError):
    """Data-parallel settings that cannot run, or a process of the run that failed."""


def is_data_parallel(config) -> bool:
    """Whether this process is one of a data-parallel run (its group is open)."""
    return config["single_spec"] is False


def data_parallel_settings(config) -> dict | None:
    """``{nproc, world_size, ip, port, offset}`` when ``config`` asks for more than one
    process, else ``None``; a setting that cannot run is ``DataParallelError``."""
    nproc, world_size = config["nproc"], config["world_size"]
    for key, value in (("nproc", nproc), ("world_size", world_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise DataParallelError(f"{key}={value!r} must be a whole number of processes")
    nproc = 1 if nproc is None else nproc
    world_size = nproc if world_size in (None, -1) else world_size
    if nproc < 1:
        raise DataParallelError(f"nproc={nproc}: a run needs at least 1 process")
    if nproc == 1 and world_size == 1:
        return None
    offset = config["offset"] or 0
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise DataParallelError(f"offset={offset!r} must be a whole number >= 0")
    if offset + nproc > world_size:
        raise DataParallelError(
            f"nproc={nproc} processes from offset={offset} exceed world_size={world_size}; "
            "on one machine give nproc alone, on several give each machine's nproc, the "
            "total world_size and its offset (the global rank of its first process)"
        )
    batch = config["train_batch_size"]
    if isinstance(batch, int) and batch % world_size:
        # RecBole gives each process batch // world_size rows: the global batch would
        # silently shrink (and Rec-Denoiser's beta scale, which reads it, would be off).
        raise DataParallelError(
            f"train_batch_size={batch} does not split into world_size={world_size} equal "
            f"shards; use a multiple of {world_size} (e.g. {batch - batch % world_size} or "
            f"{batch + world_size - batch % world_size})"
        )
    ip, port = config["ip"], config["port"]
    if world_size > nproc and (ip is None or port is None):
        raise DataParallelError(
            f"world_size={world_size} spans machines (nproc={nproc} here): give ip and port "
            "of the machine whose offset is 0, the same on every machine"
        )
    if torch.cuda.is_available() and str(config["gpu_id"] or ""):
        gpus = str(config["gpu_id"]).split(",")
        if len(gpus) < nproc:
            raise DataParallelError(
                f"nproc={nproc} processes need as many GPUs, but gpu_id={config['gpu_id']!r} "
                f"names {len(gpus)}; list one per process (e.g. gpu_id: '0,1')"
            )
    return {
        "nproc": nproc,
        "world_size": world_size,
        "ip": ip or "127.0.0.1",
        # No port on one machine: the processes meet through a file (``run_data_parallel``).
        "port": None if port is None else int(port),
        "offset": offset,
    }


@contextlib.contextmanager
def whole_loaders(config):
    """RecBole's loaders built inside are not sharded (``single_spec``): evaluation
    loaders of a data-parallel run, and every loader before the training one is
    sharded (``shard_training_loader``)."""
    parallel = config["single_spec"]
    config["single_spec"] = True
    try:
        yield
    finally:
        config["single_spec"] = parallel


def shard_training_loader(config, loader):
    """``loader`` rebuilt on the same rows with RecBole's ``DistributedSampler``: this
    rank's ``train_batch_size / world_size`` rows of each global batch, shuffled with
    ``seed`` (RecBole's sampler would use 0 whatever the seed)."""
    sharded = type(loader)(config, loader._dataset, loader._sampler, shuffle=loader.shuffle)
    sharded.sampler.seed = int(config["seed"])
    return sharded


def run_data_parallel(run_config, config_args: tuple, saved: bool, settings: dict):
    """Run ``run_config`` (``quick_start.run_config``, a module-level function each
    spawned process imports) in ``settings['nproc']`` processes of a
    data-parallel group and return global rank 0's summary (``None`` on a machine whose
    processes do not include rank 0).  ``config_args``: ``FreqConfig``'s arguments
    (model, dataset, config files, config_dict, command-line overrides, paper,
    shared_with), from which each process rebuilds the config with its rank.  A failure
    in any process ends them all and is raised here as that process raised it."""
    if settings["port"] is not None:
        return _spawn_and_wait(run_config, config_args, saved, settings, None)
    with tempfile.TemporaryDirectory(
        prefix="recbole-freq-rendezvous-", ignore_cleanup_errors=True
    ) as folder:
        return _spawn_and_wait(
            run_config, config_args, saved, settings, os.path.join(folder, "store")
        )


def _spawn_and_wait(
    run_config, config_args: tuple, saved: bool, settings: dict, rendezvous: str | None
):
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    queue = mp.get_context("spawn").SimpleQueue()
    context = mp.spawn(
        _worker,
        args=(run_config, config_args, saved, settings, rendezvous, queue),
        nprocs=settings["nproc"],
        join=False,
    )
    messages = []
    # torch logs a warning for each process it stops after another failed; the failure
    # itself is reported below, in one line.
    spawn_log = logging.getLogger("torch.multiprocessing.spawn")
    level = spawn_log.level
    spawn_log.setLevel(logging.ERROR)
    try:
        while True:
            # Drained while waiting: a summary larger than the pipe's buffer would
            # otherwise block its sender and the run would never end.
            while not queue.empty():
                messages.append(queue.get())
            try:
                if context.join(timeout=0.5):
                    break
            except ProcessException as failure:
                while not queue.empty():
                    messages.append(queue.get())
                raise _failure(messages, failure) from None
    except KeyboardInterrupt as interrupt:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
        for process in context.processes:
            process.join(timeout=10)
        raise RunInterrupted(
            "training stopped; a data-parallel run keeps no resume state, so it starts "
            "again from epoch 0 (the checkpoint of its best epoch so far, if any, is kept)"
        ) from interrupt
    finally:
        spawn_log.setLevel(level)
    while not queue.empty():
        messages.append(queue.get())
    summaries = [payload for kind, _, payload in messages if kind == "summary"]
    return summaries[0] if summaries else None


def _failure(messages, failure) -> BaseException:
    errors = [(rank, payload) for kind, rank, payload in messages if kind == "error"]
    if not errors:
        return DataParallelError(
            f"process {failure.error_index} of the data-parallel run ended without a result "
            f"({type(failure).__name__}: {str(failure).strip().splitlines()[-1]})"
        )
    rank, payload = min(errors, key=lambda error: error[0])
    try:
        return pickle.loads(payload)
    except Exception:  # noqa: BLE001 - an error that does not unpickle is still reported
        return DataParallelError(f"process {rank} of the data-parallel run failed: {payload!r}")


def _worker(
    local_rank: int,
    run_config,
    config_args: tuple,
    saved: bool,
    settings: dict,
    rendezvous,
    queue,
) -> None:
    from recbole_freq.config.configurator import FreqConfig

    meet_through_file(rendezvous)
    rank = settings["offset"] + local_rank
    model, dataset, config_files, config_dict, *rest = config_args
    config_dict = {**(config_dict or {}), **settings, "local_rank": local_rank}
    try:
        config = FreqConfig(model, dataset, config_files, config_dict, *rest)
        summary = run_config(config, saved=saved)
        # No process tears its group down while another still uses it.
        torch.distributed.barrier()
        if rank == 0:
            queue.put(("summary", rank, summary))
    except Exception as error:
        try:
            payload = pickle.dumps(error)
        except Exception:  # noqa: BLE001 - unpicklable errors travel as text
            payload = pickle.dumps(DataParallelError(f"{type(error).__name__}: {error}"))
        queue.put(("error", rank, payload))
        raise
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
