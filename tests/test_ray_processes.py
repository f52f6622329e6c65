"""A local Ray started by a comparison (``--ray``) or a search ends with its driver,
however the driver ends (issue 71, case 10): SIGTERM is the command line's one line and
143, Ctrl-C while Ray starts is 130 with nothing left, ``kill -9`` of the driver leaves
no Ray process behind (its agents ignore SIGTERM), and a search stopped before Ray saved
its state does not advise ``--resume``."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_grid import cli_args, overrides_of

pytest.importorskip("ray")
pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/environ"), reason="reads the process table from /proc"
)

SCRIPT = Path(__file__).resolve().parent.parent / "run_recbole_freq.py"


def process_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, start time, command line) of every live process."""
    table = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, UnicodeDecodeError):
            continue
        if fields[0] != "Z":
            table[int(name)] = (int(fields[1]), fields[19], command.strip())
    return table


def below(pid: int) -> dict[int, tuple[str, str]]:
    """Every process below ``pid`` now: pid -> (start time, command line)."""
    table = process_table()
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, start, command) in table.items():
            if ppid == parent and child not in found:
                found[child] = (start, command)
                frontier.append(child)
    return found


def start(argv, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *argv], cwd=cwd, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for(condition, timeout=180.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def ray_is_starting(process) -> bool:
    return any("gcs_server" in command for _, command in below(process.pid).values())


def ray_processes(process) -> dict[int, tuple[str, str]]:
    """The Ray processes below the driver, once its agents run (what kill -9 left)."""
    wait_for(lambda: any("ray::" in command for _, command in below(process.pid).values()))
    found = {pid: seen for pid, seen in below(process.pid).items() if "ray" in seen[1].lower()}
    assert any("raylet" in command for _, command in found.values()), found
    return found


def assert_ended(processes: dict, within=30.0):
    def left():
        table = process_table()
        return {
            pid: seen for pid, seen in processes.items() if table.get(pid, (0, None))[1] == seen[0]
        }

    deadline = time.monotonic() + within
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = left()
    for pid in alive:  # never leave them to the next test
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not alive, alive


def comparison(small_config, tmp_path, epochs):
    overrides = overrides_of(small_config, epochs=epochs)
    out = tmp_path / "cmp"
    argv = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1", "--ray", "--out", str(out)]
    return [*argv, *cli_args(overrides)], out


@pytest.mark.parametrize("how", ["SIGTERM in training", "kill -9 in training"])
def test_a_comparison_on_ray_ends_with_its_driver(small_config, tmp_path, how):
    argv, out = comparison(small_config, tmp_path, epochs=500)
    process = start(argv, tmp_path)
    wait_for(lambda: list((out / "partial").glob("*.resume.pth")))
    ray = ray_processes(process)
    process.send_signal(signal.SIGTERM if how.startswith("SIGTERM") else signal.SIGKILL)
    _, err = process.communicate(timeout=120)
    if how.startswith("SIGTERM"):
        assert process.returncode == 143, err
        assert "SIGTERM received" not in err and "Traceback" not in err, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("interrupted: 0 of 1 runs are stored") and "Continue with" in last
    assert list((out / "partial").glob("*.resume.pth"))  # the epochs done are kept
    assert_ended(ray)


def test_ctrl_c_while_ray_starts_leaves_nothing_running(small_config, tmp_path):
    argv, _ = comparison(small_config, tmp_path, epochs=2)
    process = start(argv, tmp_path)
    wait_for(lambda: ray_is_starting(process))
    started = below(process.pid)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("interrupted:") and "Traceback" not in err
    assert_ended(started)


def test_a_search_stopped_while_ray_starts_advises_the_same_command_not_resume(
    small_config, tmp_path
):
    hyper = tmp_path / "space.hyper"
    hyper.write_text("alpha choice [0.1,0.5]\n")
    argv = ["--model=BSARec", "--dataset=tiny", "--hyper_file", str(hyper), "--name", "sg7"]
    argv += ["--storage_path", str(tmp_path / "results"), *cli_args(overrides_of(small_config))]
    process = start(argv, tmp_path)
    wait_for(lambda: ray_is_starting(process))
    started = below(process.pid)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert "nothing to resume. Start it with the same command: " in last, err
    assert "--resume" not in last and last.endswith("--name sg7 " + " ".join(argv[6:]))
    assert not (tmp_path / "results" / "sg7").exists()  # so the same command starts it
    assert_ended(started)
