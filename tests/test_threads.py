"""Torch's threads on a shared CPU (``recbole_freq/utils/threads.py``): OpenMP's own spin
with the package's governor shortening it while the cores are contended (a passive wait
policy where the governor cannot work), unless the user chose a policy; the thread count
from the cores the process may use; both in the run file."""

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
# sleeps between regions; sleeping threads do not.  Prints the CPU seconds of 100
# regions under OpenMP's default, with the governor's team held, and after its release.
SPIN = textwrap.dedent(
    """
    import json, time
    import recbole_freq
    import torch
    from recbole_freq.utils import threads
    torch.set_num_threads(2)
    values = torch.randn(1_000_000)

    def regions():
        for _ in range(20):
            values.mul_(1.0)
        started = time.process_time()
        for _ in range(100):
            values.mul_(1.0)
            time.sleep(0.004)
        return time.process_time() - started

    governor = threads.SpinGovernor(threads.ctypes.CDLL(threads._loaded_libgomp_path()))
    governor.team_threads = 2
    default = regions()
    governor.engage()
    engaged = regions()
    governor.release()
    time.sleep(0.2)
    print(json.dumps({"default": default, "engaged": engaged, "released": regions(),
                      "record": governor.record()}))
    """
)

# A run's process with other processes holding every core: the governor, started by the
# run's thread setting, must see its threads wait and shorten the spin.
CONTENDED = textwrap.dedent(
    """
    import json, time
    import recbole_freq
    import torch
    from recbole_freq.utils import threads
    from recbole_freq.utils.reproducibility import apply_determinism
    apply_determinism({"deterministic": False, "torch_threads": 2, "device": "cpu"})
    governor = threads.govern_spinning(2)
    values = torch.randn(1_000_000)
    deadline = time.monotonic() + 30
    while not governor.engaged and time.monotonic() < deadline:
        values.mul_(1.0)
    print(json.dumps({"engaged": governor.engaged, **threads.governor_record()}))
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


def test_importing_the_package_keeps_openmps_policy_under_the_governor_unless_the_user_chose_one():
    fresh = json.loads(fresh_python(POLICY, "package first"))
    assert fresh == {
        "environ": None,
        "spin": None,
        "omp_wait_policy": None,
        "gomp_spincount": None,
        "omp_wait_policy_set_by": threads.SET_BY_GOVERNOR,
    }
    chosen = json.loads(fresh_python(POLICY, "package first", OMP_WAIT_POLICY="active"))
    assert chosen["environ"] == chosen["omp_wait_policy"] == "active"
    assert chosen["spin"] is None and chosen["omp_wait_policy_set_by"] == threads.SET_BY_USER
    spin = json.loads(fresh_python(POLICY, "package first", GOMP_SPINCOUNT="0"))
    assert spin["environ"] is None and spin["gomp_spincount"] == "0"
    assert spin["omp_wait_policy_set_by"] == threads.SET_BY_USER
    # A process started by one that set the passive fallback inherits the choice.
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
    # The governor works on the OpenMP that torch loaded, whichever came first.
    late = json.loads(fresh_python(POLICY, "torch first"))
    assert late["environ"] is None and late["omp_wait_policy_set_by"] == threads.SET_BY_GOVERNOR


def test_where_the_governor_cannot_work_the_package_sets_a_passive_policy(monkeypatch):
    for variable in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", threads.SET_BY_PACKAGE_MARK):
        monkeypatch.setenv(variable, "placeholder")  # restored to its state at teardown
        monkeypatch.delenv(variable)
    monkeypatch.setattr(threads, "governor_unavailable", lambda: "not Linux")
    monkeypatch.setattr(threads, "_wait_policy_set_by", None)
    monkeypatch.setattr(threads, "_wait_policy", (None, None))
    monkeypatch.delitem(sys.modules, "torch")  # as if torch were not loaded yet
    threads.choose_wait_policy()
    assert (os.environ["OMP_WAIT_POLICY"], os.environ["GOMP_SPINCOUNT"]) == ("PASSIVE", "1000")
    assert threads.wait_policy_record()["omp_wait_policy_set_by"] == threads.SET_BY_PACKAGE
    # Too late for the environment to matter, and said so.
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setattr(threads, "_wait_policy_set_by", None)
    monkeypatch.setattr(threads, "_governor", None)
    threads.choose_wait_policy()
    assert threads.wait_policy_record()["omp_wait_policy_set_by"] == threads.SET_TOO_LATE
    assert threads.govern_spinning(2) is None  # no governor under a policy it did not choose


def test_the_governor_cannot_work_under_a_cpu_quota_below_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(threads, "_cores_at_import", 4)
    monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda: 2)
    if sys.platform.startswith("linux"):
        assert threads.governor_unavailable() == "a CPU quota below the affinity mask"
    monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda: None)
    monkeypatch.setattr(threads, "_read_run_delays", lambda skip=None: {})
    assert threads.governor_unavailable() is not None


def test_the_governor_engages_after_two_contended_intervals_and_releases_after_quiet_ones():
    governor = threads.SpinGovernor(libgomp=None, engage_after=2, release_after=3)
    assert [governor.observe(rate) for rate in (0.001, 0.5, 0.002, 0.5)] == [None] * 4
    assert governor.observe(0.4) == "engage"  # the second contended interval in a row
    governor.engaged = True
    governor._streak = 0
    # Still contended, then one quiet interval (a phase on one thread), then contended:
    # the quiet streak starts again.
    assert [governor.observe(rate) for rate in (0.3, 0.0, 0.0, 0.4, 0.0, 0.0)] == [None] * 6
    assert governor.observe(0.01) == "release"


def test_the_governor_finds_torchs_libgomp_beside_scikit_learns():
    site = "/venv/lib/python3.11/site-packages"
    maps = [
        f"7f01-7f02 r--p 00000000 08:01 11 {site}/scikit_learn.libs/libgomp-e985bcbb.so.1.0.0",
        f"7f03-7f04 r-xp 00000000 08:01 12 {site}/torch/lib/libgomp.so.1",
        "7f05-7f06 rw-p 00000000 00:00 0 ",
    ]
    torch_folder = f"{site}/torch"
    assert threads.torchs_libgomp(maps, torch_folder) == f"{site}/torch/lib/libgomp.so.1"
    assert threads.torchs_libgomp(maps[:1], torch_folder) == maps[0].split()[-1]  # the only one
    assert threads.torchs_libgomp([maps[0], maps[0].replace("e985", "a111")], torch_folder) is None
    assert threads.torchs_libgomp(maps[2:], torch_folder) is None


def test_the_governors_team_puts_libgomp_over_its_cpu_count():
    governor = threads.SpinGovernor(libgomp=type("Gomp", (), {"omp_get_num_procs": lambda: 8}))
    governor.team_threads = 8
    assert governor.helper_team_size() == 2  # 1 + 7 + 1 = 9 threads managed, over 8 CPUs
    governor.team_threads = 3
    assert governor.helper_team_size() == 7  # 1 + 2 + 6 = 9
    governor.team_threads = 1
    governor.engage()  # a run on one thread: no team to shorten the spin of
    assert not governor.engaged and governor.engagements == 0


@pytest.mark.skipif(threads.usable_cores() < 2, reason="needs 2 cores for 2 OpenMP threads")
@pytest.mark.skipif(threads.governor_unavailable() is not None, reason="no spin governor here")
def test_with_the_governors_team_held_torchs_threads_sleep_between_parallel_regions():
    """What the governor is for: under OpenMP's default each worker spins about 3 ms
    after every region (about 0.3 s of CPU over these 100 regions, measured 0.55-0.76 s
    here), CPU time another process on the machine needed; while the governor holds its
    team libgomp spins 100 times and they sleep almost at once (measured 0.03-0.04 s),
    and after its release they spin again."""
    spent = json.loads(fresh_python(SPIN))
    assert spent["engaged"] < 0.5 * spent["default"], spent
    assert spent["released"] > 2 * spent["engaged"], spent
    assert spent["record"]["engagements"] == 1


@pytest.mark.skipif(threads.usable_cores() < 2, reason="needs 2 cores for 2 OpenMP threads")
@pytest.mark.skipif(threads.governor_unavailable() is not None, reason="no spin governor here")
def test_the_governor_shortens_the_spin_while_other_processes_hold_the_cores():
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(threads.usable_cores())
    ]
    try:
        seen = json.loads(fresh_python(CONTENDED))
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert seen["engaged"] and seen["engagements"] == 1, seen


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
    assert record["omp_wait_policy"] is None
    assert record["omp_wait_policy_set_by"] == threads.SET_BY_GOVERNOR


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
        assert record["omp_wait_policy_set_by"] in (
            threads.SET_BY_GOVERNOR,
            threads.SET_BY_PACKAGE,
            threads.SET_BY_USER,
        )
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(before)
