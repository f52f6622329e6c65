"""RecBole's data-parallel set-up on machines without CUDA, one process writing.

14. ``Config._init_device`` opens RecBole's data-parallel process group (a config with
    ``local_rank``, as ``run_recbole(..., nproc=N)`` gives each process) with the ``nccl``
    backend and a CUDA device whatever the machine has, after asserting one ``gpu_id``
    per process: on a machine without CUDA every data-parallel run failed at that
    assertion.  Without CUDA the replacement opens a ``gloo`` group on the CPU; with
    CUDA it does what RecBole does (``nccl``, ``cuda:<local_rank>``), the assertion a
    one-line ``ValueError``.  The process that writes (global rank 0, ``local_rank +
    offset``) keeps the log; the others log errors only, as RecBole quiets them.  No
    RecBole issue found (#1684 asks for CPU DDP).  Test:
    ``test_distributed.test_recboles_device_setup_opens_a_gloo_group_without_cuda``.

15. ``AbstractTrainer.__init__`` wraps the model in ``DistributedDataParallel`` with
    ``device_ids=[local_rank]``, which torch refuses for a module on the CPU.  The
    replacement passes device ids only for a CUDA model.  Test:
    ``test_distributed.test_recboles_trainer_wraps_a_cpu_model_for_data_parallel``.

16. Every RecBole trainer opens a TensorBoard writer, named after its log file, in every
    process of a data-parallel run: the quiet processes (no log file) each left an
    empty ``log_tensorboard/model-<time>`` folder.  Only the writing process opens one
    now.  Test: ``test_distributed.test_two_processes_train_and_evaluate_as_one``.
"""

from __future__ import annotations

import os

from recbole_freq.compat.import_hooks import when_imported
from recbole_freq.utils.process_group import init_method, writing_rank


def _init_device_without_cuda(original):
    def _init_device(self):
        values = self.final_config_dict
        if "local_rank" not in values:
            return original(self)
        import torch

        gpu_id = values["gpu_id"]
        gpu_id = ",".join(map(str, gpu_id)) if isinstance(gpu_id, tuple) else str(gpu_id)
        values["gpu_id"] = gpu_id
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu_id
        local_rank, nproc = int(values["local_rank"]), int(values["nproc"])
        cuda = bool(gpu_id) and torch.cuda.is_available()
        if cuda and len(gpu_id.split(",")) < nproc:
            raise ValueError(
                f"nproc={nproc} processes need as many GPUs, but gpu_id={gpu_id!r} names "
                f"{len(gpu_id.split(','))}; list one per process (e.g. gpu_id: '0,1')"
            )
        torch.distributed.init_process_group(
            backend="nccl" if cuda else "gloo",
            rank=local_rank + int(values["offset"]),
            world_size=int(values["world_size"]),
            init_method=init_method(values),
        )
        values["single_spec"] = False
        if cuda:
            values["device"] = torch.device("cuda", local_rank)
            torch.cuda.set_device(local_rank)
        else:
            values["device"] = torch.device("cpu")
        if not writing_rank(values):
            values["state"] = "error"
            values["show_progress"] = False
            values["verbose"] = False

    _init_device.__wrapped__ = original
    return _init_device


def data_parallel_without_cuda() -> None:
    when_imported("recbole.config.configurator", _patch_init_device)
    when_imported("recbole.trainer.trainer", _patch_trainer_data_parallel)


def _patch_init_device(configurator) -> None:
    Config = configurator.Config
    Config._init_device = _init_device_without_cuda(Config._init_device)


def _patch_trainer_data_parallel(trainer_module) -> None:
    original_init = trainer_module.AbstractTrainer.__init__

    def __init__(self, config, model):
        self.config = config
        self.model = model
        if not config["single_spec"]:
            import torch

            self.model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
            on_cuda = torch.device(config["device"]).type == "cuda"
            self.distributed_model = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[config["local_rank"]] if on_cuda else None
            )

    __init__.__wrapped__ = original_init
    trainer_module.AbstractTrainer.__init__ = __init__
    original_tensorboard = trainer_module.get_tensorboard

    def get_tensorboard(logger):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return _NoTensorBoard()
        return original_tensorboard(logger)

    trainer_module.get_tensorboard = get_tensorboard


class _NoTensorBoard:
    """The TensorBoard writer of a process that writes nothing (fix 16)."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None
