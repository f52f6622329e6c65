"""Torch's threads on a shared CPU (``recbole_freq/utils/threads.py``): a passive OpenMP
wait policy from every entry point unless the user chose one, the thread count from the
cores the process may use, both in the run file."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import REPO_ROOT, write_sequences
from dataset_prep import convert_one_line
from recbole_freq.utils import threads
from recbole_freq.utils.reproducibility import apply_determinism, environment_record

POLICY = textwrap.dedent(
    """
    import json, os, sys
    if sys.argv[1] == "torch first":
        import torch
    import recbole_freq
    from recbole_freq.utils.threads import wait_policy_record
    print(json.dumps({"environ": os.environ.get("OMP_WAIT_POLICY"),
                      "spin": os.environ.get("GOMP_SPINCOUNT"), **wait_policy_record()}))
    """
)

# OpenMP threads that spin after each parallel region burn CPU time while the program
# sleeps between regions; sleeping threads do not.
SPIN = textwrap.dedent(
    """
    import sys, time
    if sys.argv[1] == "torch first":
        import torch
    import recbole_freq
    import torch
    torch.set_num_threads(2)
    values = torch.randn(1_000_000)
    for _ in range(20):
        values.mul_(1.0)
    started = time.process_time()
    for _ in range(100):
        values.mul_(1.0)
        time.sleep(0.004)
    print(time.process_time() - started)
    """
)


def fresh_python(script: str, *args: str, **environ) -> str:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "RECBOLE_FREQ_"))
    }
    env.update(environ)
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_importing_the_package_sets_a_passive_wait_policy_unless_the_user_chose_one():
    fresh = json.loads(fresh_python(POLICY, "package first"))
    assert fresh == {
        "environ": "PASSIVE",
        "spin": "1000",
        "omp_wait_policy": "PASSIVE",
        "gomp_spincount": "1000",
        "omp_wait_policy_set_by": threads.SET_BY_PACKAGE,
    }
    chosen = json.loads(fresh_python(POLICY, "package first", OMP_WAIT_POLICY="active"))
    assert chosen["environ"] == chosen["omp_wait_policy"] == "active"
    assert chosen["spin"] is None and chosen["omp_wait_policy_set_by"] == threads.SET_BY_USER
    spin = json.loads(fresh_python(POLICY, "package first", GOMP_SPINCOUNT="0"))
    assert spin["environ"] is None and spin["gomp_spincount"] == "0"
    assert spin["omp_wait_policy_set_by"] == threads.SET_BY_USER
    # A process started by one that set it (a --compare worker) inherits the choice.
    inherited = json.loads(
        fresh_python(
            POLICY,
            "package first",
            OMP_WAIT_POLICY="PASSIVE",
            GOMP_SPINCOUNT="1000",
            RECBOLE_FREQ_OMP_WAIT_POLICY="PASSIVE 1000",
        )
    )
    assert inherited["omp_wait_policy_set_by"] == threads.SET_BY_PACKAGE
    # OpenMP read its environment when torch loaded: too late to change, and said so.
    late = json.loads(fresh_python(POLICY, "torch first"))
    assert late["environ"] is None and late["omp_wait_policy"] is None
    assert late["omp_wait_policy_set_by"] == threads.SET_TOO_LATE


@pytest.mark.skipif(threads.usable_cores() < 2, reason="needs 2 cores for 2 OpenMP threads")
def test_with_the_passive_policy_torchs_threads_sleep_between_parallel_regions():
    """What the policy is for: under OpenMP's default each worker spins about 3 ms after
    every region (about 0.3 s of CPU over these 100 regions, measured 0.66 s here),
    CPU time another process on the machine needed; passive after a short spin, they
    sleep almost at once (measured 0.03 s)."""
    spinning = float(fresh_python(SPIN, "torch first"))
    sleeping = float(fresh_python(SPIN, "package first"))
    assert sleeping < 0.5 * spinning, (sleeping, spinning)


def test_cgroup_quota_rounds_up_to_whole_cpus(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert threads.cgroup_cpu_limit(tmp_path) == 2
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.cgroup_cpu_limit(tmp_path) == 1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert threads.cgroup_cpu_limit(tmp_path) is None
    assert threads.cgroup_cpu_limit(tmp_path / "absent") is None


def test_default_threads_follow_the_affinity_mask_and_the_quota(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda: None)
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(cores)
    try:
        assert threads.default_threads() == (cores, "the cores this process may use")
        monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda: 1)
        assert threads.default_threads() == (1, "the cores this process may use")
        monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda: None)
        if cores > 1:  # fewer threads asked for before the run are kept
            torch.set_num_threads(1)
            assert threads.default_threads()[0] == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert threads.default_threads()[1] == "OMP_NUM_THREADS"
    finally:
        torch.set_num_threads(before)


RUN_ON_ONE_CORE = textwrap.dedent(
    """
    import json, os, sys
    import recbole_freq
    import torch
    # After torch loaded OpenMP, whose own default is the cores it saw then: the run
    # must follow what the process may use now (a scheduler's taskset, a quota).
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    from recbole_freq.quick_start import run
    summary = run("SASRec", "few", config_dict=json.loads(sys.argv[1]))
    print(json.dumps(summary["environment"]))
    """
)


@pytest.mark.skipif(threads.usable_cores() < 2, reason="needs 2 cores to take one away")
def test_a_run_takes_its_threads_from_the_cores_it_may_use_and_records_them(tmp_path):
    raw = write_sequences(tmp_path / "few.txt", n_users=40, n_items=30)
    convert_one_line(raw, tmp_path, "few", show_progress=False)
    settings = dict(
        data_path=str(tmp_path), checkpoint_dir=str(tmp_path / "saved"), epochs=1,
        hidden_size=8, inner_size=16, n_layers=1, n_heads=1, MAX_ITEM_LIST_LENGTH=8,
        show_progress=False, state="WARNING", seed=3,
    )  # fmt: skip
    record = json.loads(fresh_python(RUN_ON_ONE_CORE, json.dumps(settings)))
    assert record["usable_cores"] == 1 and record["torch_threads"] == 1
    assert record["torch_threads_set_by"] == "the cores this process may use"
    assert record["omp_wait_policy"] == "PASSIVE"
    assert record["omp_wait_policy_set_by"] == threads.SET_BY_PACKAGE


def test_the_record_says_which_rule_set_the_threads():
    before = torch.get_num_threads()
    try:
        apply_determinism({"deterministic": True, "torch_threads": None, "device": "cpu"})
        assert environment_record({"device": "cpu"})["torch_threads_set_by"].startswith(
            "deterministic"
        )
        apply_determinism({"deterministic": False, "torch_threads": 1, "device": "cpu"})
        assert environment_record({"device": "cpu"})["torch_threads_set_by"] == "torch_threads"
        apply_determinism({"deterministic": False, "torch_threads": None, "device": "cpu"})
        record = environment_record({"device": "cpu"})
        assert record["usable_cores"] == threads.usable_cores()
        assert record["omp_wait_policy_set_by"] in (threads.SET_BY_PACKAGE, threads.SET_BY_USER)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(before)
