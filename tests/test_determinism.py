"""The same run twice gives the same numbers (``utils.reproducibility``): the same seed,
settings and thread count in two fresh processes give identical losses, metrics and
weights; another thread count adds floats in another order, which the run file records;
``deterministic: True`` pins the threads and turns torch's deterministic algorithms on."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import write_sequences
from dataset_prep import convert_one_line
from recbole_freq.cli import main
from recbole_freq.quick_start import run
from recbole_freq.utils.reproducibility import apply_determinism, environment_record

# Large enough that torch splits some reductions over threads (60 users do not).
RUN = textwrap.dedent(
    """
    import json, sys
    from recbole_freq.quick_start import run
    summary = run("BSARec", "mid", config_dict=json.loads(sys.argv[1]), saved=True)
    print(json.dumps({key: summary[key] for key in
        ("history", "test_result", "best_valid_result", "weights_sha256", "environment")}))
    """
)


@pytest.fixture(scope="module")
def mid_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("mid")
    raw = write_sequences(root / "mid.txt", n_users=200, n_items=300, min_len=5, max_len=40)
    convert_one_line(raw, root, "mid", show_progress=False)
    return root


def run_in_fresh_process(data: Path, out: Path, **settings) -> dict:
    config = dict(
        data_path=str(data),
        checkpoint_dir=str(out),
        epochs=1,
        train_batch_size=64,
        show_progress=False,
        state="WARNING",
        seed=11,
        **settings,
    )
    done = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(config)],
        capture_output=True,
        text=True,
        cwd=out.parent,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def numbers(result: dict) -> tuple:
    losses = [epoch["train_loss"] for epoch in result["history"]]
    return losses, result["best_valid_result"], result["test_result"], result["weights_sha256"]


@pytest.fixture(scope="module")
def runs(mid_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    return {
        "two threads": run_in_fresh_process(mid_data, out / "a", torch_threads=2),
        "two threads again": run_in_fresh_process(mid_data, out / "b", torch_threads=2),
        "one thread": run_in_fresh_process(mid_data, out / "c", torch_threads=1),
    }


def test_the_same_run_twice_in_fresh_processes_gives_identical_numbers(runs):
    first, second = runs["two threads"], runs["two threads again"]
    assert numbers(first) == numbers(second)  # every loss bit, metric and weight
    assert first["environment"] == second["environment"]


def test_another_thread_count_is_recorded_and_moves_only_the_last_bits(runs):
    """Torch's CPU reductions split over threads add in another order: the loss can part
    in its last digits, and training then follows another path.  The run file says which
    thread count decided its numbers."""
    one, two = runs["one thread"], runs["two threads"]
    assert one["environment"]["torch_threads"] == 1
    assert two["environment"]["torch_threads"] == 2
    for a, b in zip(numbers(one)[0], numbers(two)[0]):
        assert a == pytest.approx(b, rel=1e-6)


def test_every_run_file_records_what_decides_its_numbers(runs):
    record = runs["one thread"]["environment"]
    for key in (
        "torch",
        "recbole",
        "numpy",
        "python",
        "device",
        "device_name",
        "torch_threads",
        "deterministic_algorithms",
    ):
        assert record[key] not in (None, ""), key
    assert record["torch"] == torch.__version__
    assert record["deterministic_algorithms"] is False


def test_a_run_file_records_the_commit_of_the_code_it_ran():
    """The commit of the checkout the package runs from, and whether it had uncommitted
    changes (issue 70: no run file could say which code made it)."""
    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=False)  # fmt: skip
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    code = environment_record({"device": "cpu"})["code"]
    assert code["commit"] == head.stdout.strip()
    changed = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", ".",
         ":(exclude)benchmarks/results"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert code["uncommitted_changes"] is bool(changed)


def test_stored_results_changing_are_not_uncommitted_code(tmp_path):
    """A run file or resume state written, changed or missing under benchmarks/results
    (a lent machine is sent the tree without some states) leaves the code unchanged; an
    edited package file does not."""
    from recbole_freq.utils.reproducibility import checkout_state

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "recbole_freq").mkdir()
    (tmp_path / "recbole_freq" / "model.py").write_text("x = 1\n")
    results = tmp_path / "benchmarks" / "results" / "a" / "partial"
    results.mkdir(parents=True)
    (results / "run.resume.pth").write_bytes(b"state")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    commit, changed = checkout_state(tmp_path)
    assert len(commit) == 40 and changed is False
    (results / "run.resume.pth").unlink()
    assert checkout_state(tmp_path) == (commit, False)
    (tmp_path / "recbole_freq" / "model.py").write_text("x = 2\n")
    assert checkout_state(tmp_path) == (commit, True)
    assert checkout_state(tmp_path / "recbole_freq") == (None, None)  # not a checkout


def test_deterministic_pins_threads_and_turns_deterministic_algorithms_on_and_off_again():
    before = torch.get_num_threads()
    try:
        apply_determinism({"deterministic": True, "torch_threads": None, "device": "cpu"})
        record = environment_record({"device": "cpu"})
        assert record["torch_threads"] == 1
        assert record["deterministic_algorithms"] is True
        apply_determinism({"deterministic": True, "torch_threads": 2, "device": "cpu"})
        assert torch.get_num_threads() == 2
        # A later run in the same process that asks for neither gets torch's defaults.
        apply_determinism({"deterministic": False, "torch_threads": None, "device": "cpu"})
        assert torch.get_num_threads() == before
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(before)


def test_paper_settings_turn_determinism_on(small_config):
    from recbole_freq.config.configurator import FreqConfig

    for model in ("BSARec", "SASRec"):
        config = FreqConfig(model, "lastfm", cmd_overrides=small_config, paper=True)
        assert config["deterministic"] is True
    assert FreqConfig("SASRec", "lastfm", cmd_overrides=small_config)["deterministic"] is False


def test_a_run_under_deterministic_records_it(small_config):
    summary = run("SASRec", "tiny", config_dict=dict(small_config, epochs=1, deterministic=True))
    assert summary["environment"]["deterministic_algorithms"] is True
    assert summary["environment"]["torch_threads"] == 1
    torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("value", ["0", "two", "1.5"])
def test_a_thread_count_that_is_not_one_is_one_line(small_config, capsys, value):
    argv = ["--model=SASRec", "--dataset=tiny", f"--torch_threads={value}"]
    argv += [f"--{key}={val}" for key, val in small_config.items()]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torch_threads" in err[0], err
