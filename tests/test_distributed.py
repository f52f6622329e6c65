"""Data-parallel training (``--nproc``, ``recbole_freq.quick_start.distributed``): RecBole's DDP
machinery on the CPU (gloo), two real processes on the tiny dataset, evaluation equal to
one process's on the same checkpoint, one writing process, and what an in-batch
contrastive objective means across ranks."""

import json
import random
import socket
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import first_batch, main_with_ctrl_c_once, prepare
from recbole_freq.cli import main
from recbole_freq.jobs.evaluate import evaluate_checkpoint


def cli_args(config: dict) -> list[str]:
    return [f"--{key}={value}" for key, value in config.items()]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def one_process_group() -> dict:
    """The keys RecBole's launcher gives a process, for a group of this process alone."""
    return dict(local_rank=0, world_size=1, nproc=1, ip="127.0.0.1", port=free_port(), offset=0)


def last_error_line(capsys) -> str:
    """The ``error:`` line a failed run printed, for the assertion message."""
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    return errors[-1] if errors else "no error line"


def only_run(tmp_path: Path):
    """The checkpoint, summary and log files of the one run in ``tmp_path``."""
    checkpoints = sorted((tmp_path / "saved").glob("*.pth"))
    summaries = sorted((tmp_path / "saved").glob("*.json"))
    logs = sorted((tmp_path / "log").rglob("*.log"))
    assert len(checkpoints) == len(summaries) == len(logs) == 1, (checkpoints, summaries, logs)
    assert checkpoints[0].stem == summaries[0].stem == logs[0].stem
    return checkpoints[0], json.loads(summaries[0].read_text()), logs[0].read_text()


# ------------------------------------------------------------ RecBole's DDP set-up (compat)


def test_recboles_device_setup_opens_a_gloo_group_without_cuda(small_config):
    """Compat fix 14: RecBole opens an nccl group on cuda:<rank> whatever the machine has
    (RuntimeError without a GPU); here a gloo group on the CPU."""
    from recbole_freq.config.configurator import FreqConfig

    try:
        config = FreqConfig(
            "SASRec", "tiny", config_dict=one_process_group(), cmd_overrides=small_config
        )
        assert torch.distributed.is_initialized()
        assert torch.distributed.get_backend() == "gloo"
        assert config["single_spec"] is False
        assert config["device"] == torch.device("cpu")
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_recboles_trainer_wraps_a_cpu_model_for_data_parallel(small_config):
    """Compat fix 15: RecBole's trainer passes device_ids=[local_rank], which torch
    refuses for a CPU module."""
    from recbole_freq.config.configurator import FreqConfig
    from recbole_freq.protocol import trainer_for
    from recbole_freq.quick_start.quick_start import load_splits, new_model

    try:
        config = FreqConfig(
            "SASRec", "tiny", config_dict=one_process_group(), cmd_overrides=small_config
        )
        _, (train, _, _) = load_splits(config)
        trainer = trainer_for(config, new_model(config, train))
        wrapped = trainer.distributed_model
        assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel)
        assert wrapped.device_ids is None and wrapped.module is trainer.model
        # The training loader is sharded, the evaluation loaders are whole.
        assert isinstance(train.sampler, torch.utils.data.distributed.DistributedSampler)
        assert train.sampler.seed == config["seed"]
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


# --------------------------------------------------------------- two processes, end to end


def test_two_processes_train_and_evaluate_as_one(small_config, tmp_path, capsys):
    """--nproc 2 trains BSARec in two gloo processes; one of them writes one log, one
    checkpoint, one summary and one TensorBoard folder; the test metrics equal those of
    evaluating that checkpoint in this one process; the run is deterministic."""
    config = dict(small_config, state="INFO")
    args = ["--model=BSARec", "--dataset=tiny", *cli_args(config), "--nproc=2"]
    rendezvous_folders = set(Path(tempfile.gettempdir()).glob("recbole-freq-rendezvous-*"))
    assert main(args) == 0, last_error_line(capsys)
    checkpoint, summary, log = only_run(tmp_path)
    assert summary["processes"] == 2 and summary["config"]["world_size"] == 2
    # Without a port the processes met through a file, removed after the run: no port
    # picked free by the launcher that another program could take in between.
    assert summary["config"]["port"] is None
    assert set(Path(tempfile.gettempdir()).glob("recbole-freq-rendezvous-*")) == rendezvous_folders
    assert len(list((tmp_path / "log_tensorboard").iterdir())) == 1
    assert log.count("test result") == 1 and "best valid" in log
    (one_process,) = evaluate_checkpoint(checkpoint, [summary["protocol"]["protocol"]])
    assert one_process["test_result"] == summary["test_result"]
    assert one_process["test_per_user"] == summary["test_per_user"]

    for path in (tmp_path / "saved").iterdir():
        path.unlink()
    assert main(args) == 0, last_error_line(capsys)
    again = json.loads(next((tmp_path / "saved").glob("*.json")).read_text())
    assert again["weights_sha256"] == summary["weights_sha256"]
    assert again["test_result"] == summary["test_result"]


def test_rec_denoiser_trains_data_parallel_under_its_papers_protocol(
    small_config, tmp_path, capsys
):
    """RecDenoiser under --protocol=sasrec (eq. 4's BCE through the ARM objective) in two
    processes: the sparsity scale is one process's (the global batch), and the re-seeded
    extra test modes (100 unseen negatives, full ranking) equal evaluating the checkpoint
    in one process."""
    from recbole_freq.quick_start.quick_start import new_model

    overrides = dict(small_config, protocol="sasrec", epochs=1)
    args = [
        "--model=RecDenoiser",
        "--dataset=wide",
        *cli_args(overrides),
        "--nproc=2",
        "--extra_test_modes=['uni100','full']",
    ]
    assert main(args) == 0, last_error_line(capsys)
    checkpoint, summary, _ = only_run(tmp_path)
    extra = summary["extra_test_results"]
    sampled, full = evaluate_checkpoint(checkpoint, ["sasrec", "mode=full"])
    assert sampled["test_result"] == extra["uni100"]
    assert full["test_result"] == extra["full"]
    config, train, _, _ = prepare("RecDenoiser", overrides, dataset="wide")
    assert summary["model_report"]["sparsity_scale"] == new_model(config, train).sparsity_scale


# The models whose training step differs from those the tests above run data-parallel
# (BSARec, RecDenoiser, PolyRec, DuoRec): augmented views, masked items, time intervals,
# recurrent and convolutional encoders.  SASRec, FBSARec, FMLPRec, SSEPT and
# BERT4RecDenoiser share those steps (another token mixer, embedding or mask on one of
# them), so they were dropped from this 15-s-a-model test to keep the suite's time.
OTHER_MODELS = ["CL4SRec", "FEARec", "TiSASRec", "BERT4Rec", "GRU4Rec", "Caser"]


def test_compare_trains_the_other_training_steps_data_parallel(small_config, tmp_path, capsys):
    """--compare with --nproc 2: each model of another training step trains an epoch in
    two processes, and each stored run says so."""
    out = tmp_path / "cmp"
    # FEARec's time delays need MAX_ITEM_LIST_LENGTH >= 36 at its default topk_factor.
    config = {k: v for k, v in small_config.items() if k != "seed"}
    config.update(epochs=1, MAX_ITEM_LIST_LENGTH=40)
    argv = ["--compare", ",".join(OTHER_MODELS), "--dataset=tiny", "--seeds", "3"]
    assert main([*argv, "--out", str(out), *cli_args(config), "--nproc=2"]) == 0, last_error_line(
        capsys
    )
    runs = [json.loads(path.read_text()) for path in (out / "runs").glob("*.json")]
    assert len(runs) == len(OTHER_MODELS)
    for stored in runs:
        summary = stored.get("summary", stored)
        assert summary["processes"] == 2, summary["model"]
        assert all(0 <= value <= 1 for value in summary["test_result"].values())


def test_a_failing_process_ends_the_run_with_its_one_line_error(small_config, capsys):
    """An error inside the processes (a model that cannot be built: the processes build
    it, the launcher does not) ends the run with that process's one line and exit 2."""
    config = dict(small_config, n_heads=3)  # hidden_size 16
    code = main(["--model=SASRec", "--dataset=tiny", *cli_args(config), "--nproc=2"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().count("\n") == 0 and "attention heads" in err


# -------------------------------------------------- in-batch contrastive terms across ranks


def _rng_state():
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def _set_rng_state(state):
    torch.set_rng_state(state[0])
    np.random.set_state(state[1])
    random.setstate(state[2])


def _contrastive_gradient_worker(rank, port, model_name, overrides, queue):
    import torch.distributed as dist

    from recbole_freq.config.configurator import FreqConfig
    from recbole_freq.protocol import trainer_for
    from recbole_freq.quick_start.quick_start import load_splits, new_model

    group = dict(local_rank=rank, world_size=2, nproc=2, ip="127.0.0.1", port=port, offset=0)
    try:
        config = FreqConfig(model_name, "tiny", config_dict=group, cmd_overrides=overrides)
        _, (train, _, _) = load_splits(config)
        trainer = trainer_for(config, new_model(config, train))
        # DDP gave every rank rank 0's weights; a plain copy for the one-process side.
        reference = new_model(config, train)
        reference.load_state_dict(trainer.model.state_dict())
        shard = first_batch(train)
        shards, states = [None, None], [None, None]
        dist.all_gather_object(shards, shard)
        dist.all_gather_object(states, _rng_state())

        # One step as RecBole's _train_epoch takes it under DDP.
        _set_rng_state(states[rank])
        trainer.model.train()
        trainer.set_reduce_hook()
        loss = trainer.model.calculate_loss(shard)
        loss = sum(loss) if isinstance(loss, tuple) else loss
        (loss + trainer.sync_grad_loss()).backward()
        averaged = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}

        # One process: each shard's loss with its own rank's random draws, gradients
        # averaged (per-rank negatives).
        expected = {n: torch.zeros_like(p) for n, p in reference.named_parameters()}
        reference.train()
        for part, state in zip(shards, states):
            _set_rng_state(state)
            reference.zero_grad()
            loss = reference.calculate_loss(part)
            (sum(loss) if isinstance(loss, tuple) else loss).backward()
            for name, parameter in reference.named_parameters():
                if parameter.grad is not None:
                    expected[name] += parameter.grad / 2
        worst = max(float((averaged[n] - expected[n]).abs().max()) for n in expected)
        scale = max(float(expected[n].abs().max()) for n in expected)
        queue.put((rank, worst, scale, len(shard)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("model", ["DuoRec", "PolyRec"])
def test_in_batch_contrastive_terms_use_per_rank_negatives(small_config, model):
    """The documented meaning of an in-batch contrastive term under DDP: each rank
    contrasts its own shard, and the gradient every rank applies is the mean of the
    shards' gradients, computed here in one process from the same rows and draws."""
    import torch.multiprocessing as mp

    overrides = dict(small_config, hidden_dropout_prob=0.0, attn_dropout_prob=0.0)
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(
        _contrastive_gradient_worker,
        args=(free_port(), model, overrides, queue),
        nprocs=2,
        join=True,
    )
    results = sorted(queue.get() for _ in range(2))
    for rank, worst, scale, rows in results:
        assert rows == small_config["train_batch_size"] // 2
        assert scale > 0 and worst <= 1e-5 * max(scale, 1.0), (rank, worst, scale)


def test_ctrl_c_stops_every_process_in_one_line(small_config, tmp_path, capsys):
    """Ctrl-C (SIGINT to the launching process) ends the processes and prints one line
    saying that a data-parallel run starts again; the best checkpoint so far is kept."""
    config = dict(small_config, epochs=500, stopping_step=500)
    args = ["--model=SASRec", "--dataset=tiny", *cli_args(config), "--nproc=2"]
    code = main_with_ctrl_c_once(args, lambda: any((tmp_path / "saved").glob("*.pth")))
    err = capsys.readouterr().err.strip()
    assert code == 130, err
    assert err.count("\n") == 0 and "keeps no resume state" in err
    assert len(list((tmp_path / "saved").glob("*.pth"))) == 1


def test_two_launches_form_one_run_as_two_machines_would(small_config, tmp_path, capsys):
    """The several-machines form on one machine: a second launch (--offset=1, its own
    folder) joins through --ip/--port; it writes nothing and says so, and the first writes
    the run, whose metrics equal one process's on its checkpoint."""
    import subprocess
    import sys

    from conftest import REPO_ROOT

    port = free_port()
    group = ["--world_size=2", "--ip=127.0.0.1", f"--port={port}"]
    args = ["--model=BSARec", "--dataset=tiny", *cli_args(dict(small_config, epochs=1)), *group]
    other = tmp_path / "other-machine"
    other.mkdir()
    second = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "run_recbole_freq.py"), *args, "--offset=1"],
        cwd=other,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert main([*args, "--offset=0"]) == 0, last_error_line(capsys)
        out, err = second.communicate(timeout=300)
    finally:
        second.kill()
    assert second.returncode == 0, err
    assert "the machine with offset 0 writes" in out
    assert not any(other.rglob("*.pth")) and not any(other.rglob("*.log"))
    checkpoint, summary, _ = only_run(tmp_path)
    assert summary["processes"] == 2
    (one_process,) = evaluate_checkpoint(checkpoint, [summary["protocol"]["protocol"]])
    assert one_process["test_result"] == summary["test_result"]
