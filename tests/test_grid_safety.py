"""What a comparison's output folder must never lose (issue 71): no write or delete
through a link planted in ``partial/``, and a finished run's resume state kept until its
run file is stored."""

import contextlib
import errno
import json
import os

import pytest
from test_grid import cli_args, overrides_of

from recbole_freq.cli import main
from recbole_freq.jobs.compare import compare, execution
from recbole_freq.utils.files import OutputWriteError


@pytest.mark.parametrize("planted", ["link", "pipe", "linked folder"])
def test_a_planted_link_or_pipe_in_partial_is_refused_before_training(
    small_config, tmp_path, capsys, planted
):
    out = tmp_path / "cmp"
    victim_folder = tmp_path / "elsewhere"
    victim_folder.mkdir()
    victim = victim_folder / "victim.pth"
    victim.write_bytes(b"precious")
    if planted == "linked folder":
        out.mkdir()
        (out / "partial").symlink_to(victim_folder, target_is_directory=True)
    else:
        (out / "partial").mkdir(parents=True)
        state = out / "partial" / "SASRec-seed1.resume.pth"
        if planted == "link":
            state.symlink_to(victim)
        else:
            os.mkfifo(state)
    args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(out)]
    code = main([*args, *cli_args(overrides_of(small_config, epochs=1))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and ("not a regular file" in err[0] or "not a folder" in err[0])
    assert victim.read_bytes() == b"precious"
    assert sorted(p.name for p in victim_folder.iterdir()) == ["victim.pth"]
    assert not (out / "runs").exists() or not list((out / "runs").iterdir())


def test_a_run_file_that_cannot_be_written_keeps_the_finished_run(
    small_config, tmp_path, monkeypatch, capsys
):
    """The resume state goes only once the run file is stored: a failed store leaves it,
    says where the summary went, ``--resume`` of it is refused (it would finish the run
    outside the grid), and the same command then stores the run with the numbers of a
    run that never failed."""
    overrides = overrides_of(small_config, epochs=3)
    out = tmp_path / "cmp"
    real_store = execution.store_run

    def full_disk(*args, **kwargs):
        raise OutputWriteError(errno.ENOSPC, "cannot write runs/SASRec-seed1.json: no space")

    monkeypatch.setattr(execution, "store_run", full_disk)
    lines = []
    result = compare("SASRec", "tiny", seeds="1", overrides=overrides, out=out, log=lines.append)
    assert len(result["failed"]) == 1 and not result["complete"]
    state = out / "partial" / "SASRec-seed1.resume.pth"
    assert state.is_file()
    (failed,) = [line for line in lines if line.startswith("FAILED")]
    assert "no space" in failed and str(state) in failed and "summary is in" in failed
    summary_file = failed.split("summary is in ")[1].split(";")[0]
    assert json.loads(open(summary_file).read())["test_result"]

    # --resume of the grid's state would finish the run outside the grid: refused.
    before = state.read_bytes()
    assert main(["--resume", str(state)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "continue it with that comparison's command" in err[0]
    assert state.read_bytes() == before

    monkeypatch.setattr(execution, "store_run", real_store)
    compare("SASRec", "tiny", seeds="1", overrides=overrides, out=out, log=lines.append)
    assert not state.exists()
    stored = json.loads((out / "runs" / "SASRec-seed1.json").read_text())["summary"]
    compare("SASRec", "tiny", seeds="1", overrides=overrides, out=tmp_path / "whole", log=print)
    whole = json.loads((tmp_path / "whole" / "runs" / "SASRec-seed1.json").read_text())["summary"]
    assert stored["test_result"] == whole["test_result"]
    assert stored["epochs_run"] == whole["epochs_run"] == 3


def test_torch_threads_against_threads_per_run_is_one_line(small_config, tmp_path, capsys):
    """A packed run trains with its torch_threads: a different --threads_per_run would
    print one count and train with another (and bypass the check against the cores)."""
    args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(tmp_path)]
    args += ["--parallel", "1", "--threads_per_run", "1", "--torch_threads=2"]
    code = main([*args, *cli_args(overrides_of(small_config, epochs=1))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1
    assert "--torch_threads=2 and --threads_per_run 1 both set the threads" in err[0]
    assert not (tmp_path / "runs").exists()


def test_an_interrupted_grid_run_advises_the_grid_command_not_resume(tmp_path):
    from recbole_freq.quick_start.quick_start import _interrupted_training
    from recbole_freq.quick_start.resume import comparison_folder_of

    state = tmp_path / "out" / "partial" / "BSARec@variant=x-seed42.resume.pth"
    state.parent.mkdir(parents=True)
    state.write_bytes(b"state")
    assert comparison_folder_of(state) == tmp_path / "out"
    assert comparison_folder_of(tmp_path / "saved" / "BSARec-Nov-28.resume.pth") is None
    (tmp_path / "p").symlink_to(state.parent, target_is_directory=True)  # a linked partial/
    assert comparison_folder_of(tmp_path / "p" / state.name) == (tmp_path / "out").resolve()

    class Stopped:
        current_epoch = 3

    line = _interrupted_training(Stopped(), state)
    assert "Continue with the same command" in line and "--resume" not in line


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process table in /proc")
def test_killing_a_packed_grid_ends_its_workers(small_config, tmp_path):
    """kill -9 of the grid's driver: its packed run stops too (parent-death signal), so
    no orphan trains on, deletes its resume state or races a new grid's copy of it."""
    import signal
    import subprocess
    import sys
    import time

    overrides = overrides_of(small_config, epochs=100000, stopping_step=100000)
    command = [sys.executable, "-m", "recbole_freq", "--compare", "SASRec", "--dataset=tiny"]
    command += ["--seeds", "1", "--parallel", "1", "--threads_per_run", "1"]
    command += ["--out", str(tmp_path / "cmp"), *cli_args(overrides)]
    driver = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    state = tmp_path / "cmp" / "partial" / "SASRec-seed1.resume.pth"
    workers = []
    try:
        deadline = time.time() + 120
        while not state.is_file() and time.time() < deadline:
            time.sleep(0.2)  # the worker has trained an epoch and kept its state
        assert state.is_file()
        workers = _children(driver.pid)
        assert workers
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.time() + 30
        while any(_alive(pid) for pid in workers) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in workers)
        assert state.is_file()  # the run's completed epochs stay for the next grid
    finally:
        for pid in [driver.pid, *_children(driver.pid), *workers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _stored_state(small_config, tmp_path, monkeypatch, seeds="1"):
    """A grid whose run files cannot be stored: its runs' resume states stay (epochs
    0-1 of 3 done)."""

    def full_disk(*args, **kwargs):
        raise OutputWriteError(errno.ENOSPC, "no space")

    monkeypatch.setattr(execution, "store_run", full_disk)
    out = tmp_path / "cmp"
    overrides = overrides_of(small_config, epochs=3)
    result = compare("SASRec", "tiny", seeds=seeds, overrides=overrides, out=out, log=print)
    assert result["failed"]
    monkeypatch.undo()
    return out, overrides


@pytest.mark.parametrize("next_epoch", [999, -5])
def test_a_state_with_impossible_progress_is_refused(
    small_config, tmp_path, monkeypatch, capsys, next_epoch
):
    import torch

    out, overrides = _stored_state(small_config, tmp_path, monkeypatch)
    state_file = out / "partial" / "SASRec-seed1.resume.pth"
    state = torch.load(state_file, weights_only=True)
    assert state["next_epoch"] == 2 and len(state["history"]) == 2
    state["next_epoch"] = next_epoch
    torch.save(state, state_file)
    before = state_file.read_bytes()
    capsys.readouterr()
    args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(out)]
    assert main([*args, *cli_args(overrides)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot continue this run" in err[-1]
    assert state_file.read_bytes() == before
    assert not (out / "runs" / "SASRec-seed1.json").exists()


def test_another_seeds_state_is_not_shown_as_this_runs_progress(
    small_config, tmp_path, monkeypatch, capsys
):
    import shutil

    out, overrides = _stored_state(small_config, tmp_path, monkeypatch)
    shutil.copy(
        out / "partial" / "SASRec-seed1.resume.pth", out / "partial" / "SASRec-seed2.resume.pth"
    )
    capsys.readouterr()
    args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1,2", "--out", str(out)]
    main([*args, *cli_args(overrides), "--status"])
    unfinished = (out / "unfinished.md").read_text()
    assert (
        "SASRec, seed 2 (its resume state is not usable: it is the state of a run with "
        "seed 1, not 2)" in unfinished
    )
    assert "| SASRec | 2 |" not in unfinished and "| SASRec | 1 |" in unfinished


def test_a_run_file_copied_under_another_runs_name_is_refused(small_config, tmp_path, capsys):
    out = tmp_path / "cmp"
    overrides = overrides_of(small_config, epochs=1)
    args = ["--compare", "SASRec,BSARec", "--dataset=tiny", "--seeds", "1", "--out", str(out)]
    assert main([*args, *cli_args(overrides)]) == 0
    runs = out / "runs"
    (runs / "SASRec-seed1.json").write_text((runs / "BSARec-seed1.json").read_text())
    capsys.readouterr()
    assert main([*args, *cli_args(overrides)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SASRec-seed1.json: it records the run of model 'BSARec'" in err[0]


@pytest.mark.parametrize(
    "edit, message",
    [
        ("digest removed", "records no digest"),
        ("fingerprint removed, digest recomputed", "records no fingerprint of its data"),
    ],
)
def test_a_run_file_without_its_digest_or_data_fingerprint_is_refused(
    small_config, tmp_path, capsys, edit, message
):
    """Issue 71, case 6: a run file whose digest was deleted was accepted, and one whose
    ``dataset_sha256`` was deleted skipped the data check."""
    from recbole_freq.jobs.compare.runs import record_digest

    out = tmp_path / "cmp"
    args = ["--compare", "SASRec", "--dataset=tiny", "--out", str(out)]
    args += cli_args(overrides_of(small_config, epochs=1))
    assert main([*args, "--seeds", "1"]) == 0
    path = out / "runs" / "SASRec-seed1.json"
    record = json.loads(path.read_text())
    del record["digest"]
    if edit.startswith("fingerprint"):
        del record["summary"]["dataset_sha256"]
        record["digest"] = record_digest(record)
    path.write_text(json.dumps(record, indent=2))
    stored = path.read_bytes()
    capsys.readouterr()
    assert main([*args, "--seeds", "1,2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "SASRec-seed1.json" in err[0]
    assert path.read_bytes() == stored and not (out / "runs" / "SASRec-seed2.json").exists()


def _alpha_of_an_older_property_file(config: dict) -> None:
    assert config["alpha"] != 0.1
    config["alpha"] = 0.1


def _trc_skip_not_yet_recorded(config: dict) -> None:
    assert config["trc_skip"] == "identity_and_truncated"
    del config["trc_skip"]


@pytest.mark.parametrize(
    "model, edit, message",
    [
        # A property file changed between two calls (BSARec's alpha here, written into
        # the stored run as a run of the old file would record it).
        (
            "BSARec",
            _alpha_of_an_older_property_file,
            "was trained with other settings than BSARec gets now (alpha 0.1 then, ",
        ),
        # PolyRec's run files from before trc_skip existed do not record it; they were
        # trained with the identity skip replaced (truncated), no longer the default.
        (
            "PolyRec",
            _trc_skip_not_yet_recorded,
            "(trc_skip 'truncated' then, 'identity_and_truncated' now)",
        ),
    ],
    ids=["changed-property-file", "run-from-before-a-setting-existed"],
)
def test_runs_of_other_settings_are_not_mixed_into_a_row(
    small_config, tmp_path, capsys, model, edit, message
):
    """A stored run trained with other settings than its entry gets now: the next call
    refuses to add runs of today's settings to that row, in one line."""
    from recbole_freq.jobs.compare.runs import record_digest

    out = tmp_path / "cmp"
    overrides = overrides_of(small_config, epochs=1)
    args = ["--compare", model, "--dataset=tiny", "--out", str(out), *cli_args(overrides)]
    assert main([*args, "--seeds", "1"]) == 0
    path = out / "runs" / f"{model}-seed1.json"
    record = json.loads(path.read_text())
    edit(record["summary"]["config"])
    del record["digest"]
    record["digest"] = record_digest(record)
    path.write_text(json.dumps(record, indent=2))
    capsys.readouterr()
    assert main([*args, "--seeds", "1,2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (out / "runs" / f"{model}-seed2.json").exists()


def test_settings_the_model_decides_do_not_stop_the_next_seed(small_config, tmp_path, capsys):
    """Rec-Denoiser leaves its backbone's switches unset (~) and records what the backbone
    decided (input_position_embedding True, ...): its stored run is today's settings, and
    the next call adds the next seed beside it."""
    out = tmp_path / "cmp"
    overrides = overrides_of(small_config, epochs=1)
    args = ["--compare", "RecDenoiser", "--dataset=tiny", "--out", str(out), *cli_args(overrides)]
    assert main([*args, "--seeds", "1"]) == 0
    recorded = json.loads((out / "runs" / "RecDenoiser-seed1.json").read_text())
    assert recorded["summary"]["config"]["input_position_embedding"] is True
    assert main([*args, "--seeds", "1,2"]) == 0, capsys.readouterr().err
    assert (out / "runs" / "RecDenoiser-seed2.json").is_file()


def test_a_failed_run_ends_the_grid_in_one_line_with_its_tables_and_the_way_on(
    small_config, tmp_path, monkeypatch, capsys
):
    """A run that fails (here its run file cannot be stored; a killed worker takes the
    same path) ends the command with exit 1, one error line naming it and the command
    that continues, and unfinished.md written: no traceback."""

    def full_disk(*args, **kwargs):
        raise OutputWriteError(errno.ENOSPC, "cannot write SASRec-seed2.json: no space")

    real_store = execution.store_run

    def second_fails(out, settings, entry, seed, summary):
        return (full_disk if seed == 2 else real_store)(out, settings, entry, seed, summary)

    monkeypatch.setattr(execution, "store_run", second_fails)
    out = tmp_path / "cmp"
    args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1,2", "--out", str(out)]
    assert main([*args, *cli_args(overrides_of(small_config, epochs=2))]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: 1 run(s) failed: SASRec on tiny, seed 2")
    assert "Continue with: " in err[0] and "--seeds 1,2" in err[0]
    assert (out / "runs" / "SASRec-seed1.json").is_file()
    assert "SASRec" in (out / "unfinished.md").read_text()


def test_one_dataset_of_a_grid_read_from_the_grids_folder_is_refused(
    small_config, tmp_path, capsys
):
    out = tmp_path / "grid"
    (out / "tiny" / "runs").mkdir(parents=True)
    args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(out)]
    assert main([*args, "--status", *cli_args(overrides_of(small_config))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"give --out {out / 'tiny'}" in err[0]


def test_a_run_file_whose_per_user_ranks_are_not_a_mapping_is_one_line(
    small_config, tmp_path, capsys
):
    from recbole_freq.jobs.compare.runs import record_digest

    out = tmp_path / "cmp"
    overrides = overrides_of(small_config, epochs=1)
    args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(out)]
    assert main([*args, *cli_args(overrides)]) == 0
    path = out / "runs" / "SASRec-seed1.json"
    record = json.loads(path.read_text())
    record["summary"]["test_per_user"] = "x"
    del record["digest"]
    record["digest"] = record_digest(record)
    path.write_text(json.dumps(record))
    capsys.readouterr()
    assert main([*args, *cli_args(overrides)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "test_per_user is not a mapping" in err[0]


def test_a_state_whose_history_holds_nan_is_refused_before_training(
    small_config, tmp_path, monkeypatch, capsys
):
    import torch

    out, overrides = _stored_state(small_config, tmp_path, monkeypatch)
    state_file = out / "partial" / "SASRec-seed1.resume.pth"
    state = torch.load(state_file, weights_only=True)
    state["history"][0]["valid_score"] = float("nan")
    torch.save(state, state_file)
    capsys.readouterr()
    args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(out)]
    assert main([*args, *cli_args(overrides)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a finite number" in err[0]


def test_temporary_files_of_killed_runs_are_removed_from_partial_and_runs(small_config, tmp_path):
    out = tmp_path / "cmp"
    dead = 2**22 + 12345  # above any pid this machine hands out (pid_max <= 2**22)
    for name in ("partial", "runs"):
        (out / name).mkdir(parents=True)
        (out / name / f".SASRec-seed1.x.recbole-freq.{dead}-00ff00ff00ff00ff.tmp").write_bytes(
            b"half"
        )
        (out / name / "notes.txt").write_text("mine")
    compare("SASRec", "tiny", seeds="1", overrides=overrides_of(small_config, epochs=1),
            out=out, log=print, status=True)  # fmt: skip
    for name in ("partial", "runs"):
        assert sorted(p.name for p in (out / name).iterdir()) == ["notes.txt"]


@contextlib.contextmanager
def unwritable(folder):
    """``folder`` made unwritable for this process: by its mode for a user, by the
    immutable attribute for root (whom no mode stops); skips where neither can be set."""
    import subprocess

    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("running as root where chattr +i is not allowed: no folder is unwritable")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_read_only_partial_folder_is_one_line_before_training(small_config, tmp_path, capsys):
    """Issue 71, case 16: a read-only ``partial/`` failed one epoch into training."""
    out = tmp_path / "cmp"
    (out / "partial").mkdir(parents=True)
    (out / "partial" / "notes.txt").write_text("mine")
    args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(out)]
    with unwritable(out / "partial"):
        code = main([*args, *cli_args(overrides_of(small_config, epochs=1))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and "cannot write to the partial/ folder of --out" in err[0]
    assert sorted(p.name for p in (out / "partial").iterdir()) == ["notes.txt"]
    assert not (out / "runs").exists() or not list((out / "runs").iterdir())
    assert not list(tmp_path.rglob("*.pth"))


def test_a_time_limit_that_lets_nothing_start_says_so_instead_of_continue_with(
    small_config, tmp_path, capsys
):
    args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(tmp_path)]
    code = main([*args, "--time_limit", "0.0000001", *cli_args(overrides_of(small_config))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert len(err) == 1 and "give a longer --time_limit" in err[0]
    assert "Continue with" not in err[0]


def test_a_grid_state_without_a_data_fingerprint_advises_what_the_grid_accepts(
    small_config, tmp_path, monkeypatch, capsys
):
    import torch

    from recbole_freq.checkpoint.schema import to_plain_checkpoint
    from recbole_freq.quick_start.resume import load_resume_state

    out, overrides = _stored_state(small_config, tmp_path, monkeypatch)
    state_file = out / "partial" / "SASRec-seed1.resume.pth"
    state = load_resume_state(state_file)
    state["config"]["dataset_sha256"] = None
    state.pop("dataset_sha256")
    torch.save(to_plain_checkpoint(state), state_file)
    capsys.readouterr()
    args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(out)]
    assert main([*args, *cli_args(overrides)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "records no dataset fingerprint" in err[0]
    assert "--trust_data" not in err[0] and f"delete {state_file}" in err[0]


def test_a_second_grid_into_a_busy_folder_is_refused_before_planning(
    small_config, tmp_path, monkeypatch, capsys
):
    import recbole_freq.jobs.compare as compare_module
    from recbole_freq.jobs.compare.runs import lock_out_dir

    out = tmp_path / "cmp"
    out.mkdir()
    held = lock_out_dir(out)  # another comparison writing it right now
    planned = []
    monkeypatch.setattr(compare_module, "plan", lambda *args: planned.append(args))
    try:
        args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(out)]
        assert main([*args, *cli_args(overrides_of(small_config))]) == 2
    finally:
        held.release()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another comparison is writing" in err[0]
    assert planned == []


def test_an_interrupt_outside_training_does_not_claim_nothing_was_written(capsys):
    """SIGTERM while a grid writes its tables printed 'nothing was written' though the
    run file and two tables were on disk."""
    from recbole_freq.cli.common import report_interrupt

    assert report_interrupt(KeyboardInterrupt()) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing was written" not in err
    assert "each file it had written is whole" in err


def test_status_of_a_running_grid_reads_its_progress_and_writes_nothing(
    small_config, tmp_path, monkeypatch, capsys
):
    from recbole_freq.jobs.compare.runs import lock_out_dir

    out, overrides = _stored_state(small_config, tmp_path, monkeypatch)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    held = lock_out_dir(out)  # the grid is running
    try:
        args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(out)]
        capsys.readouterr()
        assert main([*args, *cli_args(overrides), "--status"]) == 3
    finally:
        held.release()
    shown = capsys.readouterr().out
    assert "| SASRec | 1 | 2 |" in shown and "read only" in shown
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("job", ["--compare", "--analyze"])
def test_an_out_name_too_long_is_a_usage_error_everywhere(small_config, tmp_path, capsys, job):
    out = tmp_path / ("x" * 300)
    if job == "--compare":
        args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(out)]
        args += cli_args(overrides_of(small_config))
    else:
        args = ["--analyze", "nothing.json", "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "too long" in err[0]


LATE_SIGNAL = """
import atexit, os, runpy, signal, sys, time
sys.argv = ["run_recbole_freq.py", "--model=SASRec", "--help"]


def late():  # while the interpreter shuts down, after the job's result was printed
    os.kill(os.getpid(), signal.{name})
    time.sleep(0.5)


atexit.register(late)
runpy.run_path({script!r}, run_name="__main__")
"""


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_an_interrupt_while_the_interpreter_exits_keeps_the_jobs_exit_code(tmp_path, name):
    """Issue 71, case 11: a signal after the job had finished printed a traceback or
    turned its exit code into 130."""
    import subprocess
    import sys
    from pathlib import Path

    script = str(Path(__file__).resolve().parent.parent / "run_recbole_freq.py")
    done = subprocess.run(
        [sys.executable, "-c", LATE_SIGNAL.format(name=name, script=script)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "usage" in done.stdout.lower() and done.stderr == ""


def test_runs_of_different_code_share_a_table_only_when_asked(small_config, tmp_path, capsys):
    """Issue 70: a comparison tabled runs of different commits without a word; it now
    refuses before training, naming each code and its runs, unless --mixed_code, and then
    its table names them."""
    from recbole_freq.jobs.compare.runs import record_digest

    out = tmp_path / "cmp"
    args = ["--compare", "SASRec", "--dataset=tiny", "--out", str(out)]
    args += cli_args(overrides_of(small_config, epochs=1))
    assert main([*args, "--seeds", "1"]) == 0
    path = out / "runs" / "SASRec-seed1.json"
    record = json.loads(path.read_text())
    record["summary"]["environment"]["code"] = {
        "commit": "0123456789abcdef",
        "uncommitted_changes": False,
    }
    del record["digest"]
    record["digest"] = record_digest(record)
    path.write_text(json.dumps(record, indent=2))
    capsys.readouterr()
    code = main([*args, "--seeds", "1,2"])
    err = capsys.readouterr().err.strip().splitlines()
    from recbole_freq.utils.reproducibility import code_identity

    if not code_identity()["commit"]:
        pytest.skip("this checkout records no commit (not a git checkout)")
    assert code == 2
    assert len(err) == 1 and "0123456789: SASRec-seed1" in err[0] and "--mixed_code" in err[0]
    assert not (out / "runs" / "SASRec-seed2.json").exists()
    assert main([*args, "--seeds", "1,2", "--mixed_code"]) == 0
    table = (out / "comparison.md").read_text()
    assert "**Code.** These runs were made by different code" in table
    assert "0123456789: SASRec-seed1" in table


def test_unfinished_md_shows_a_missing_best_epoch_as_a_dash():
    """Issue 69: a run with no validated epoch yet showed its best epoch as "None"."""
    from recbole_freq.jobs.compare.unfinished import unfinished_markdown

    row = {"model": "SASRec", "seed": 1, "epochs_stored": 1, "best_epoch": None, "valid_metric": "NDCG@20",
           "best_valid_score": None, "last_valid_score": None, "train_hours": 0.1,
           "curve": [], "valid_ndcg@20": None}  # fmt: skip
    text = unfinished_markdown([row], [], ["ndcg@20"])
    assert "| SASRec | 1 | 1 | - | - | - | - | 0.10 |" in text and "None" not in text
