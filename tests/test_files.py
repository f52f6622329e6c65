"""Nothing lost: every file is written whole or not at all, never through a planted link,
and output locations are checked before any training starts."""

import errno
import os
from pathlib import Path

import pytest
import torch

from recbole_freq.checkpoint.loader import load_checkpoint
from recbole_freq.cli import main
from recbole_freq.utils import files
from recbole_freq.utils.files import OutputPathError, OutputWriteError, check_writable, write_atomic


class DiskFullAfter:
    """A binary file object that fails with ENOSPC once ``limit`` bytes were written."""

    def __init__(self, handle, limit):
        self.handle, self.left = handle, limit

    def write(self, data):
        data = bytes(data)
        if len(data) > self.left:
            self.handle.write(data[: self.left])
            self.left = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.left -= len(data)
        return self.handle.write(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()


@pytest.fixture
def disk_full_after(monkeypatch):
    """``disk_full_after(n, suffix)``: every write of a file whose name ends in ``suffix``
    fails with ENOSPC after ``n`` bytes; returns the list of files it failed."""
    failed = []

    def install(limit, suffix=""):
        original = files._open_temporary

        def open_temporary(path):
            handle = original(path)
            # The temporary of <name> is .<name>.recbole-freq.<pid>-<random>.tmp
            if not path.name[1:].split(".recbole-freq.")[0].endswith(suffix):
                return handle
            failed.append(path.name)
            return DiskFullAfter(handle, limit)

        monkeypatch.setattr(files, "_open_temporary", open_temporary)
        return failed

    return install


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_a_failed_write_keeps_the_previous_file(tmp_path, disk_full_after):
    target = tmp_path / "result.json"
    write_atomic(target, "good\n")
    disk_full_after(3)
    with pytest.raises(OutputWriteError) as caught:
        write_atomic(target, "new content that does not fit")
    message = str(caught.value)
    assert message == f"cannot write {target}: No space left on device; the previous file was kept"
    assert caught.value.errno == errno.ENOSPC
    assert target.read_text() == "good\n" and leftovers(tmp_path) == []


def test_an_interrupted_write_leaves_nothing(tmp_path):
    target = tmp_path / "figure.png"

    def interrupted(handle):
        handle.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, interrupted)
    assert list(tmp_path.iterdir()) == []


def test_a_link_planted_at_the_temporary_name_is_never_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    target = tmp_path / "summary.json"
    monkeypatch.setattr("dataset_prep.atomic.secrets.token_hex", lambda n: "0123456789abcdef")
    planted = files.temporary_name(target)
    planted.symlink_to(victim)
    with pytest.raises(OutputWriteError, match="File exists; nothing was changed"):
        write_atomic(target, "{}")
    assert victim.read_text() == "the user's file\n" and not target.exists()
    assert planted.is_symlink()  # not ours: left alone


def test_a_link_at_the_target_is_refused_neither_followed_nor_replaced(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    target = tmp_path / "out.csv"
    target.symlink_to(victim)
    with pytest.raises(OutputPathError, match="it is a symbolic link"):
        write_atomic(target, "a,b\n")
    assert victim.read_text() == "the user's file\n"
    assert target.is_symlink() and leftovers(tmp_path) == []


def test_temporary_names_are_unpredictable(tmp_path):
    names = {files.temporary_name(tmp_path / "x.pth").name for _ in range(50)}
    assert len(names) == 50 and all(n.startswith(".x.pth.") for n in names)


def test_wrong_kinds_of_output_paths(tmp_path):
    (tmp_path / "folder").mkdir()
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(OutputPathError, match="it is a folder"):
        write_atomic(tmp_path / "folder", "x")
    with pytest.raises(OutputPathError, match="is a file, not a folder"):
        check_writable(a_file, "--out")
    with pytest.raises(OutputWriteError, match="cannot write to --out .*: Not a directory"):
        check_writable(a_file / "sub", "--out")


def test_a_failed_checkpoint_resave_keeps_the_previous_checkpoint(small_config, disk_full_after):
    from test_untrusted_files import trained_trainer

    trainer, _ = trained_trainer(small_config, epochs=0)
    trainer._save_checkpoint(0)
    path = trainer.saved_model_file
    good = open(path, "rb").read()
    disk_full_after(4096, ".pth")
    with pytest.raises(OutputWriteError, match="No space left on device; the previous file was"):
        trainer._save_checkpoint(1)
    assert open(path, "rb").read() == good and load_checkpoint(path)["epoch"] == 0
    assert leftovers(Path(path).parent) == []


def cli(config: dict) -> list[str]:
    return [f"--{key}={value}" for key, value in config.items()]


def test_a_full_disk_at_the_checkpoint_is_one_line_exit_1(
    small_config, tmp_path, disk_full_after, capsys
):
    failures = disk_full_after(1000, ".pth")
    code = main(["--model=SASRec", "--dataset=tiny", *cli(dict(small_config, epochs=1))])
    err = capsys.readouterr().err
    assert code == 1 and failures
    assert err.count("\n") == 1 and "No space left on device; nothing was written" in err
    assert not list((tmp_path / "saved").iterdir())  # no half-written checkpoint


def test_results_are_printed_when_the_summary_cannot_be_written(
    small_config, tmp_path, disk_full_after, capsys
):
    disk_full_after(10, ".json")
    code = main(["--model=SASRec", "--dataset=tiny", *cli(dict(small_config, epochs=1))])
    captured = capsys.readouterr()
    assert code == 1
    assert "ndcg@20" in captured.out and "SASRec on tiny" in captured.out  # results kept
    assert captured.err.count("\n") == 1
    assert "its results are printed above and its checkpoint" in captured.err
    (checkpoint,) = (tmp_path / "saved").glob("*.pth")
    assert load_checkpoint(checkpoint)["state_dict"]
    assert not list((tmp_path / "saved").glob("*.json")) and leftovers(tmp_path / "saved") == []


def test_output_locations_are_checked_before_training(small_config, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    config = dict(small_config, epochs=1, checkpoint_dir=str(blocker / "saved"))
    assert main(["--model=SASRec", "--dataset=tiny", *cli(config)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write to checkpoint_dir") and err.count("\n") == 1
    assert not (tmp_path / "log").exists() or not list((tmp_path / "log").rglob("*.log"))
    args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(blocker / "c")]
    assert main(args + cli({k: v for k, v in small_config.items() if k != "seed"})) == 1
    assert capsys.readouterr().err.startswith("error: cannot write to --out")


def test_recommend_and_analyze_outputs_of_the_wrong_kind(small_config, tmp_path, capsys):
    from recbole_freq.quick_start.quick_start import run

    checkpoint = run("SASRec", "tiny", config_dict=dict(small_config, epochs=1))["checkpoint"]
    capsys.readouterr()
    folder = tmp_path / "a-folder"
    folder.mkdir()
    assert main(["--recommend", checkpoint, "--users", "1", "--output", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --output {folder} is a folder; name a file to write instead\n"
    assert list(folder.iterdir()) == [] and leftovers(tmp_path) == []
    a_file = tmp_path / "report.txt"
    a_file.write_text("keep me")
    assert main(["--analyze", checkpoint, "--out", str(a_file)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out {a_file} is a file, not a folder")
    assert a_file.read_text() == "keep me"


def test_torch_save_through_the_writer_round_trips(tmp_path):
    target = tmp_path / "w.pth"
    write_atomic(target, lambda handle: torch.save({"w": torch.arange(5)}, handle))
    assert torch.equal(torch.load(target)["w"], torch.arange(5))


KILLED_MID_WRITE = """
import os, signal, sys
from pathlib import Path
from dataset_prep.atomic import Stage
stage = Stage(Path(sys.argv[1]))
handle = stage.open("tiny.inter")
handle.write(b"x" * 100000)
handle.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_leftovers_of_a_killed_preparation_are_removed_by_the_next(tmp_path):
    import subprocess
    import sys

    from conftest import write_sequences
    from dataset_prep import convert_one_line

    target = tmp_path / "data" / "tiny"
    target.mkdir(parents=True)
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(target)])
    assert killed.returncode == -9
    (leftover,) = [p.name for p in target.iterdir()]
    assert leftover.startswith(".tiny.inter.") and leftover.endswith(".tmp")
    # A live process's temporary file is not touched.
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = target / f".tiny.item.recbole-freq.{sleeper.pid}-{'ab' * 8}.tmp"
        live.write_bytes(b"in progress")
        convert_one_line(write_sequences(tmp_path / "tiny.txt"), tmp_path / "data", "tiny")
        names = sorted(p.name for p in target.iterdir())
        assert leftover not in names and live.name in names
        assert "tiny.inter" in names
    finally:
        sleeper.kill()
        sleeper.wait()


def test_output_folders_are_cleaned_of_a_killed_runs_temporaries(tmp_path):
    stale = tmp_path / ".model.pth.recbole-freq.999999999-0123456789abcdef.tmp"
    stale.write_bytes(b"half a checkpoint")
    # Other programs' temporary files, however old, whatever their pattern: never ours.
    others = [
        ".notes.0123456789ab.tmp",
        ".draft.99999-0123456789abcdef.tmp",
        ".model.pth.999999999-0123456789abcdef.tmp",
        ".notes.tmp",
    ]
    for name in others:
        (tmp_path / name).write_text("theirs")
        os.utime(tmp_path / name, (0, 0))  # two hours old and more
    check_writable(tmp_path, "checkpoint_dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)


def test_two_preparations_of_one_dataset_never_interleave(tmp_path):
    import fcntl

    from conftest import write_sequences
    from dataset_prep import convert_one_line
    from dataset_prep.errors import UsageError

    raw = write_sequences(tmp_path / "tiny.txt")
    target = tmp_path / "data" / "tiny"
    target.mkdir(parents=True)
    (target / "tiny.inter").write_text("kept\n")
    other = os.open(target, os.O_RDONLY)  # another preparation holds the folder
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        with pytest.raises(UsageError, match="another dataset_prep is writing .* right now"):
            convert_one_line(raw, tmp_path / "data", "tiny", show_progress=False, force=True)
        assert sorted(p.name for p in target.iterdir()) == ["tiny.inter"]
        assert (target / "tiny.inter").read_text() == "kept\n"
    finally:
        os.close(other)
    convert_one_line(raw, tmp_path / "data", "tiny", show_progress=False, force=True)
    assert sorted(p.name for p in target.iterdir()) == ["tiny.inter", "tiny.stats.json"]


@pytest.fixture
def fails_instead_of_hanging():
    """A read that would wait forever fails the test instead of stopping the suite."""
    import signal

    def hung(*_):
        raise TimeoutError("the command waited on a read that never ends")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(240)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_pipes_and_devices_are_refused_never_read(
    small_config, tmp_path, capsys, fails_instead_of_hanging
):
    from recbole_freq.quick_start.quick_start import run

    checkpoint = run("SASRec", "tiny", config_dict=dict(small_config, epochs=1))["checkpoint"]
    capsys.readouterr()
    # A pipe named like the run summary beside the checkpoint hung --recommend and
    # --evaluate (the summary is only a cross-check: left unread).
    summary = Path(checkpoint).with_suffix(".json")
    summary.unlink()
    os.mkfifo(summary)
    assert main(["--recommend", checkpoint, "--users", "1"]) == 0
    assert main(["--evaluate", checkpoint, "--under", "recbole"]) == 0
    capsys.readouterr()
    # A config file linked to /dev/zero was read until MemoryError.
    endless = tmp_path / "ref.yaml"
    endless.symlink_to("/dev/zero")
    assert main(["--model=SASRec", "--dataset=tiny", "--config_files", str(endless), *cli(small_config)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert f"config file {endless} is a device, not a regular file" in err and err.count("\n") == 1
    # The checkpoint itself a pipe.
    fifo = tmp_path / "model.pth"
    os.mkfifo(fifo)
    assert main(["--recommend", str(fifo), "--users", "1"]) == 2
    assert f"checkpoint {fifo} is a pipe, not a regular file" in capsys.readouterr().err
    # A pipe among a comparison's stored runs hung --compare.
    out = tmp_path / "cmp"
    (out / "runs").mkdir(parents=True)
    os.mkfifo(out / "runs" / "SASRec-seed1.json")
    config = {k: v for k, v in small_config.items() if k != "seed"}
    argv = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(out)]
    assert main([*argv, *cli(dict(config, epochs=1))]) == 2
    err = capsys.readouterr().err
    assert "SASRec-seed1.json is a pipe, not a regular file" in err and err.count("\n") == 1
