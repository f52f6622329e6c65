"""Interrupted runs: one line saying what was kept, exit code 130, and a resume that ends
exactly where an uninterrupted run ends."""

from pathlib import Path

import pytest
import torch

import recbole_freq.quick_start.resume as resume_module
from conftest import without_transformer_settings
from recbole_freq.cli import main
from recbole_freq.jobs.compare import compare
from recbole_freq.quick_start.quick_start import RunInterrupted, resume_run, run


def interrupt_at_epoch(monkeypatch, epoch: int):
    """Ctrl-C right after the resume state before ``epoch`` was written."""
    original = resume_module.save_resume_state
    calls = []

    def save_then_interrupt(path, trainer, loaders, next_epoch):
        original(path, trainer, loaders, next_epoch)
        calls.append(next_epoch)
        if next_epoch == epoch:
            raise KeyboardInterrupt

    monkeypatch.setattr(
        "recbole_freq.quick_start.quick_start.save_resume_state", save_then_interrupt
    )
    return calls


def interrupted_comparison(model, shared, out, monkeypatch):
    """``--compare model`` (seed 5) into ``out``, Ctrl-C after the resume state before
    epoch 1: ``(the command's arguments, the run's resume state)``."""
    args = ["--compare", model, "--dataset=tiny", "--seeds", "5", "--out", str(out)]
    interrupt_at_epoch(monkeypatch, 1)
    assert main([*args, *cli(shared)]) == 130
    monkeypatch.undo()
    return args, out / "partial" / f"{model}-seed5.resume.pth"


def comparable(summary: dict) -> dict:
    """What must not change when a run is interrupted and resumed."""
    history = [
        {k: v for k, v in e.items() if k not in ("train_seconds", "valid_seconds")}
        for e in summary["history"]
    ]
    keys = ("test_result", "best_valid_result", "best_valid_score", "best_epoch", "epochs_run")
    return {"history": history, "weights": summary["weights_sha256"]} | {
        k: summary[k] for k in keys
    }


@pytest.mark.parametrize("model", ["SASRec", "BSARec"])
def test_a_resumed_run_ends_with_the_metrics_of_an_uninterrupted_one(
    small_config, monkeypatch, model
):
    config = dict(small_config, epochs=4)
    uninterrupted = run(model, "tiny", config_dict=config)
    calls = interrupt_at_epoch(monkeypatch, 2)
    with pytest.raises(RunInterrupted, match="Resume with: python -m recbole_freq --resume"):
        run(model, "tiny", config_dict=config)
    assert calls == [1, 2]
    monkeypatch.undo()
    (state_file,) = Path(small_config["checkpoint_dir"]).glob("*.resume.pth")
    resumed = resume_run(state_file)
    assert comparable(resumed) == comparable(uninterrupted)
    assert not state_file.exists()  # removed once the run is complete
    # Its time counts both segments, not only the last one.
    assert resumed["segments"] == 2 and uninterrupted["segments"] == 1
    assert resumed["total_seconds_covers"] == "every segment"
    last_segment = sum(epoch["train_seconds"] for epoch in resumed["history"][2:])
    earlier = sum(epoch["train_seconds"] for epoch in resumed["history"][:2])
    assert resumed["total_seconds"] >= last_segment + earlier


def cli(config: dict) -> list[str]:
    return [f"--{key}={value}" for key, value in config.items()]


def test_ctrl_c_in_a_training_run_is_one_line_and_130(small_config, monkeypatch, capsys):
    interrupt_at_epoch(monkeypatch, 1)
    code = main(["--model=SASRec", "--dataset=tiny", *cli(dict(small_config, epochs=3))])
    err = capsys.readouterr().err
    assert code == 130 and err.count("\n") == 1
    assert err.startswith("interrupted: training stopped in epoch 1; epoch 0 is kept in ")
    state_file = err.rsplit("--resume ", 1)[1].strip()
    monkeypatch.undo()
    assert main(["--resume", state_file]) == 0
    assert "epochs run: 3" in capsys.readouterr().out


def test_ctrl_c_in_the_first_epoch_says_nothing_can_be_resumed(small_config, monkeypatch, capsys):
    from recbole_freq.protocol import trainer as trainer_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_module, "train_pass", interrupted)  # inside the first epoch
    assert main(["--model=SASRec", "--dataset=tiny", *cli(small_config)]) == 130
    assert "before any epoch completed; nothing to resume" in capsys.readouterr().err


def test_resume_refuses_other_settings_and_other_files(small_config, tmp_path, capsys):
    summary = run("SASRec", "tiny", config_dict=dict(small_config, epochs=1))
    assert main(["--resume", "x.resume.pth", "--epochs=3"]) == 2
    assert "give no other settings" in capsys.readouterr().err
    assert main(["--resume", summary["checkpoint"]]) == 2
    assert "is not a recbole-freq resume state" in capsys.readouterr().err
    assert main(["--resume", str(tmp_path / "missing.resume.pth")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_resume_state_is_loaded_without_running_code(tmp_path, capsys):
    from test_untrusted_files import plant_checkpoint

    marker = tmp_path / "PAYLOAD_RAN"
    planted = plant_checkpoint(tmp_path / "evil.resume.pth", marker)
    assert main(["--resume", str(planted)]) == 2
    assert "refusing to load" in capsys.readouterr().err and not marker.exists()


def test_ctrl_c_in_a_comparison_keeps_runs_and_resumes_the_unfinished_one(
    small_config, tmp_path, monkeypatch, capsys
):
    shared = without_transformer_settings({k: v for k, v in small_config.items() if k != "seed"})
    shared["epochs"] = 3
    reference = compare("SASRec,GRU4Rec", "tiny", seeds="5", overrides=shared, out=tmp_path / "ref")
    out = tmp_path / "cmp"
    args = ["--compare", "SASRec,GRU4Rec", "--dataset=tiny", "--seeds", "5", "--out", str(out)]
    original = resume_module.save_resume_state

    def interrupt_in_second_run(path, trainer, loaders, next_epoch):
        original(path, trainer, loaders, next_epoch)
        if trainer.config["model"] == "GRU4Rec" and next_epoch == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(
        "recbole_freq.quick_start.quick_start.save_resume_state", interrupt_in_second_run
    )
    assert main([*args, *cli(shared)]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1 of 2 runs are stored in" in err
    assert "GRU4Rec-seed5.resume.pth" in err and "Continue with the same command" in err
    monkeypatch.undo()
    assert main([*args, *cli(shared)]) == 0
    again = {
        r["model"]: r
        for r in compare("SASRec,GRU4Rec", "tiny", seeds="5", overrides=shared, out=out)["rows"]
    }
    expected = {r["model"]: r for r in reference["rows"]}
    for model in ("SASRec", "GRU4Rec"):
        means = {f"{m}_mean": expected[model][f"{m}_mean"] for m in reference["metrics"]}
        assert means and all(again[model][k] == v for k, v in means.items()), model
    assert not list((out / "partial").glob("*"))


def test_a_forged_resume_state_writes_only_beside_itself(small_config, tmp_path, monkeypatch):
    import torch

    from recbole_freq.checkpoint.loader import load_checkpoint

    interrupt_at_epoch(monkeypatch, 2)
    with pytest.raises(RunInterrupted):
        run("SASRec", "tiny", config_dict=dict(small_config, epochs=3))
    monkeypatch.undo()
    (state_file,) = Path(small_config["checkpoint_dir"]).glob("*.resume.pth")
    victim = tmp_path / "elsewhere" / "victim.pth"
    victim.parent.mkdir()
    victim.write_bytes(b"precious")
    victim.with_suffix(".json").write_text("{}")
    state = load_checkpoint(state_file)
    state["checkpoint_file"] = str(victim)  # what earlier versions wrote and obeyed
    state["config"]["checkpoint_dir"] = str(victim.parent)
    forged = tmp_path / "forged" / "run.resume.pth"
    forged.parent.mkdir()
    torch.save(state, forged, pickle_protocol=4)
    summary = resume_run(forged)
    assert victim.read_bytes() == b"precious" and victim.with_suffix(".json").read_text() == "{}"
    assert summary["checkpoint"] == str(forged.parent.resolve() / "run.pth")
    assert load_checkpoint(summary["checkpoint"])["state_dict"]  # the best weights, written
    assert sorted(p.name for p in forged.parent.iterdir()) == ["run.json", "run.pth"]


def test_resume_through_a_link_is_refused_and_the_linked_state_is_untouched(
    small_config, tmp_path, monkeypatch, capsys
):
    """Issue 71, case 1: ``--resume <link>`` wrote its checkpoint beside the link's
    target and removed the target at the end."""
    interrupt_at_epoch(monkeypatch, 2)
    with pytest.raises(RunInterrupted):
        run("SASRec", "tiny", config_dict=dict(small_config, epochs=3))
    monkeypatch.undo()
    saved = Path(small_config["checkpoint_dir"])
    (state_file,) = saved.glob("*.resume.pth")
    before = {p.name: p.read_bytes() for p in saved.iterdir() if p.is_file()}
    link = tmp_path / "elsewhere" / "run.resume.pth"
    link.parent.mkdir()
    link.symlink_to(state_file)
    assert main(["--resume", str(link)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a symbolic link, not a regular file" in err[0]
    assert {p.name: p.read_bytes() for p in saved.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in link.parent.iterdir()) == ["run.resume.pth"]


def test_a_stopped_segment_leaves_no_checkpoint_without_a_summary(small_config, monkeypatch):
    """Issue 69: each interrupted or time-limited segment left its own checkpoint in
    checkpoint_dir, with no summary beside it; the resume state holds its best weights."""
    interrupt_at_epoch(monkeypatch, 2)
    with pytest.raises(RunInterrupted):
        run("SASRec", "tiny", config_dict=dict(small_config, epochs=3))
    monkeypatch.undo()
    saved = Path(small_config["checkpoint_dir"])
    (state,) = saved.glob("*.resume.pth")
    assert sorted(p.name for p in saved.iterdir()) == [state.name]
    summary = resume_run(state)
    checkpoint = Path(summary["checkpoint"])
    assert sorted(p.name for p in saved.iterdir()) == sorted(
        [checkpoint.name, checkpoint.with_suffix(".json").name]
    )


def test_a_resumed_run_logs_into_its_first_log(small_config, tmp_path, monkeypatch):
    """Issue 69: a run stopped twice left three logs; each resumed segment now appends to
    the first one, after a line naming the segment."""
    interrupt_at_epoch(monkeypatch, 2)
    with pytest.raises(RunInterrupted):
        run("SASRec", "tiny", config_dict=dict(small_config, epochs=3, state="INFO"))
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)  # undo() also left the test's folder (RecBole logs to ./log)
    (state,) = Path(small_config["checkpoint_dir"]).glob("*.resume.pth")
    resume_run(state)
    (log,) = (tmp_path / "log" / "SASRec").glob("*.log")
    text = log.read_text()
    assert "---- segment 2 of this run (resumed) ----" in text
    assert text.index("resumed from") > text.index("segment 2 of this run")


def _start(argv, cwd, env=None):
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "run_recbole_freq.py"
    return subprocess.Popen(
        [sys.executable, str(script), *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ctrl_c_as_at_a_terminal,
    )


def _ctrl_c_as_at_a_terminal():
    # A run started from a terminal gets SIGINT's default; one started as a script's
    # background job (`pytest ... &`) inherits it ignored, and Python then leaves it
    # ignored until the run installs its own handler, so a Ctrl-C during the imports
    # would be lost whatever the run does.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigterm_in_a_training_run_is_one_line_the_resume_command_and_143(small_config, tmp_path):
    import signal
    import time

    process = _start(
        ["--model=SASRec", "--dataset=tiny", *cli(dict(small_config, epochs=500))], tmp_path
    )
    saved = Path(small_config["checkpoint_dir"])
    deadline = time.monotonic() + 120
    while not list(saved.glob("*.resume.pth")) and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted: training stopped in epoch") and "--resume " in last


def test_ctrl_c_while_starting_is_one_line_and_130(small_config, tmp_path):
    import signal
    import time

    # A prepared dataset and a long run: whenever the signal lands (imports, data,
    # training), the run is still going; a missing dataset would end it with exit 2
    # before a late signal on a fast or an idle machine.
    argv = ["--model=SASRec", "--dataset=tiny", *cli(dict(small_config, epochs=500))]
    process = _start(argv, tmp_path)
    time.sleep(0.4)  # torch and RecBole are still being imported
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("interrupted:"), err
    assert "Traceback" not in err


FAKE_TORCH_INTERRUPTED_FROM_C = """
import ctypes, os, signal
# Ctrl-C lands while C code runs a Python callback, as it can while torch's C++ code
# (pybind11) initialises; ctypes, like pybind11, cannot carry the exception out.
compare = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


def ctrl_c(a, b):
    os.kill(os.getpid(), signal.SIGINT)
    return 0


pair = (ctypes.c_int * 2)(2, 1)
ctypes.CDLL(None).qsort(pair, 2, ctypes.sizeof(ctypes.c_int), compare(ctrl_c))
raise SystemExit(7)  # reached only if the interrupt was lost in the callback
"""


def test_ctrl_c_while_torch_loads_ends_the_run_at_once_with_one_line_and_130(tmp_path):
    """CI saw Ctrl-C during ``import torch`` abort the process (SIGABRT, "terminate called
    after throwing an instance of 'pybind11::error_already_set'"); a stand-in torch makes
    that moment certain."""
    import os

    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_TORCH_INTERRUPTED_FROM_C)
    env = dict(os.environ, PYTHONPATH=str(fake.parent))
    process = _start(["--model=SASRec", "--dataset=tiny"], tmp_path, env=env)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert err.strip().splitlines() == ["interrupted: while torch was loading; stopped at once"], (
        err
    )


def test_resume_refuses_data_prepared_again_and_states_without_a_fingerprint(
    small_config, tmp_path, monkeypatch, capsys
):
    import torch

    from conftest import permuted_items, write_sequences
    from dataset_prep import convert_one_line
    from recbole_freq.checkpoint.loader import load_checkpoint

    data = tmp_path / "data"
    raw = write_sequences(tmp_path / "shop.txt", seed=4)
    convert_one_line(raw, data, "shop", show_progress=False)
    config = dict(small_config, epochs=3, data_path=str(data))
    interrupt_at_epoch(monkeypatch, 2)
    with pytest.raises(RunInterrupted):
        run("SASRec", "shop", config_dict=config)
    monkeypatch.undo()
    (state_file,) = Path(small_config["checkpoint_dir"]).glob("*.resume.pth")
    recorded = load_checkpoint(state_file)["config"]["dataset_sha256"]

    # The same users and items, permuted: it continued on the other data with exit 0.
    permuted = permuted_items(raw, tmp_path / "permuted.txt")
    convert_one_line(permuted, data, "shop", show_progress=False, force=True)
    assert main(["--resume", str(state_file)]) == 2
    err = capsys.readouterr().err
    assert f"was trained on dataset 'shop' with sha256 {recorded[:16]}" in err
    assert "now holds sha256" in err and err.count("\n") == 1
    assert state_file.exists()  # nothing consumed

    # A state that records no fingerprint proves nothing: refused unless --trust_data.
    convert_one_line(raw, data, "shop", show_progress=False, force=True)
    state = load_checkpoint(state_file)
    state["config"]["dataset_sha256"] = None
    torch.save(state, state_file, pickle_protocol=4)
    assert main(["--resume", str(state_file)]) == 2
    assert "records no dataset fingerprint" in capsys.readouterr().err
    assert main(["--resume", str(state_file), "--trust_data"]) == 0
    assert not state_file.exists()


def test_a_run_continued_on_another_machine_records_what_decided_each_segment(
    small_config, tmp_path, monkeypatch
):
    """A grid run may continue on another machine (a GPU's epochs, then a CPU's): the
    machine's own settings do not block it, and its file keeps every segment's
    environment; a state written before those records gives its settings' device and
    threads."""
    import json

    import torch

    from recbole_freq.checkpoint.loader import load_checkpoint
    from recbole_freq.checkpoint.schema import to_plain_checkpoint
    from recbole_freq.jobs.compare.execution import _finished_line

    shared = {k: v for k, v in small_config.items() if k != "seed"} | {"epochs": 3}
    shared["torch_threads"] = 1
    out = tmp_path / "cmp"
    args, state_file = interrupted_comparison("SASRec", shared, out, monkeypatch)
    state = load_checkpoint(state_file)
    (first,) = state["environments"]
    assert first["device"] == "cpu" and first["torch_threads"] == 1
    # The same state as an earlier version wrote it on a machine with a GPU (where
    # RecBole's use_gpu is True); the run continues here, on a CPU.
    del state["environments"]
    state["config"]["use_gpu"] = True
    torch.save(to_plain_checkpoint(state), state_file)
    assert main([*args, *cli(shared)]) == 0
    summary = json.loads((out / "runs" / "SASRec-seed5.json").read_text())["summary"]
    assert summary["earlier_segments_environment"] == [
        {
            "device": "cpu",
            "torch_threads": 1,
            "recorded": "from the resume state's settings; it predates environment records",
        }
    ]
    assert summary["environment"]["device"] == "cpu" and summary["segments"] == 2
    assert "trained on" not in _finished_line(summary)  # one device throughout
    # Had the first segment run on a GPU (no GPU here), the progress line says so.
    summary["earlier_segments_environment"][0]["device"] = "cuda:0"
    assert _finished_line(summary).endswith("; trained on cuda:0, then cpu")
    uninterrupted = run("SASRec", "tiny", config_dict=dict(shared, seed=5))
    assert uninterrupted["earlier_segments_environment"] == []


def test_status_tables_unfinished_runs_from_their_resume_states_without_training(
    small_config, tmp_path, monkeypatch, capsys
):
    """``--status`` trains nothing: a run stopped after two epochs is listed in
    ``unfinished.md`` / ``.csv`` with its resume state's epochs, best epoch and validation
    curve, a run never started is named, the exit code is 3 with the command that
    continues; once every run is stored the files are gone."""
    import csv

    from recbole_freq.quick_start.resume import load_resume_state

    shared = without_transformer_settings({k: v for k, v in small_config.items() if k != "seed"})
    shared["epochs"] = 4
    out = tmp_path / "cmp"
    args = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "5", "--out", str(out)]
    interrupt_at_epoch(monkeypatch, 2)
    assert main([*args, *cli(shared)]) == 130
    monkeypatch.undo()
    state_file = out / "partial" / "SASRec-seed5.resume.pth"
    kept = state_file.read_bytes()
    capsys.readouterr()

    with_unstarted = [a if a != "5" else "5,6" for a in args]
    assert main([*with_unstarted, "--status", *cli(shared)]) == 3
    captured = capsys.readouterr()
    assert "1 run(s) unfinished and 1 not started" in captured.err
    assert "Continue with:" in captured.err and "--status" not in captured.err
    assert state_file.read_bytes() == kept and not list((out / "runs").glob("*.json"))

    state = load_resume_state(state_file)
    history = state["history"]
    scores = [epoch["valid_score"] for epoch in history]
    best = max(history, key=lambda epoch: epoch["valid_score"])
    markdown = (out / "unfinished.md").read_text()
    assert markdown in captured.out and "Not started: SASRec, seed 6." in markdown
    assert f"| SASRec | 5 | 2 | {best['epoch']} | {best['valid_score']:.4f} |" in markdown
    assert ", ".join(f"{score:.4f}" for score in scores) in markdown
    (row,) = csv.DictReader((out / "unfinished.csv").open())
    assert row["epochs_stored"] == "2" and row["valid_metric"] == state["config"]["valid_metric"]
    assert [float(s) for s in row["curve"].split(";")] == pytest.approx(scores)
    assert float(row["valid_hit@10"]) == pytest.approx(best["valid"]["hit@10"])

    assert main([*args, *cli(shared)]) == 0
    assert (out / "comparison.md").is_file() and not state_file.exists()
    assert not (out / "unfinished.md").exists() and not (out / "unfinished.csv").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA continues it")
def test_a_state_recorded_on_cuda_continues_on_a_cpu_machine(small_config, monkeypatch, capsys):
    from recbole_freq.checkpoint.schema import to_plain_checkpoint
    from recbole_freq.quick_start.resume import load_resume_state

    interrupt_at_epoch(monkeypatch, 1)
    main(["--model=SASRec", "--dataset=tiny", *cli(dict(small_config, epochs=3))])
    state_file = capsys.readouterr().err.rsplit("--resume ", 1)[1].strip()
    monkeypatch.undo()
    state = load_resume_state(state_file)
    state["config"]["device"] = torch.device("cuda")  # as a lent GPU's run records it
    state["config"]["use_gpu"] = True
    state.pop("dataset_sha256")
    torch.save(to_plain_checkpoint(state), state_file)
    assert main(["--resume", state_file]) == 0
    assert "epochs run: 3" in capsys.readouterr().out


def test_matched_epochs_read_stored_runs_and_resume_states_alike(
    small_config, tmp_path, monkeypatch, capsys
):
    """``benchmarks/matched_epochs.py``: each run's best validation score within the same
    first epochs, from a stored run and from an unfinished run's resume state (read with
    the restricted loader), and no entry for a span the unfinished run has not reached."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location(
        "matched_epochs", Path(__file__).resolve().parents[1] / "benchmarks" / "matched_epochs.py"
    )
    matched = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(matched)

    shared = without_transformer_settings({k: v for k, v in small_config.items() if k != "seed"})
    shared["epochs"] = 3
    out = tmp_path / "cmp"
    args = ["--compare", "SASRec", "--dataset=tiny", "--out", str(out)]
    assert main([*args, "--seeds", "5", *cli(shared)]) == 0
    interrupt_at_epoch(monkeypatch, 2)
    assert main([*args, "--seeds", "6", *cli(shared)]) == 130
    monkeypatch.undo()
    stored, state = out / "runs" / "SASRec-seed5.json", out / "partial" / "SASRec-seed6.resume.pth"
    capsys.readouterr()

    assert (
        matched.main([str(stored), str(state), "--reference", "SASRec-seed5", "--epochs", "3,1,2"])
        == 0
    )
    table = capsys.readouterr().out.splitlines()
    finished = [e["valid_score"] for e in json.loads(stored.read_text())["summary"]["history"]]
    unfinished = [e["valid_score"] for e in resume_module.load_resume_state(state)["history"]]
    assert len(finished) == 3 and len(unfinished) == 2
    assert table[0] == "| epochs | SASRec-seed5 | SASRec-seed6 |"
    for span, line in zip((1, 2), table[2:4]):
        base, other = max(finished[:span]), max(unfinished[:span])
        assert line == (
            f"| 0-{span - 1} | {base:.4f} | {other:.4f} ({100 * (other / base - 1):+.1f}%) |"
        )
    assert table[4] == f"| 0-2 | {max(finished):.4f} | - |"
    assert matched.main([str(stored), "--reference", "BSARec-seed5", "--epochs", "2"]) == 2
    assert "--reference 'BSARec-seed5' is none of the runs" in capsys.readouterr().err
