"""A researcher's own model beside the plugin's, from their own module (issue 69): named
``package.module:Class`` on the command line or passed as a class to ``run``, its
defaults read from ``<Class>.yaml`` beside its module, its settings judged by what its
source reads, its layout by what it declares; the tiny models in ``tests/user_models/``
(outside the package) train, and compare beside SASRec."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_grid import cli_args, overrides_of

from conftest import without_transformer_settings
from recbole_freq.cli import main
from recbole_freq.config.configurator import USER_MODELS
from recbole_freq.quick_start import run

LOWPASS = "user_models.lowpass:LowPassSASRec"
LAST_ITEM = "user_models.last_item:LastItemLinear"
HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _forget_user_models():
    yield
    USER_MODELS.clear()


def test_a_model_on_the_core_from_its_own_module_trains_with_its_own_defaults(small_config):
    summary = run(LOWPASS, "tiny", config_dict=dict(small_config, epochs=1))
    assert summary["model"] == "LowPassSASRec"
    assert summary["config"]["lp_alpha"] == 0.3 and summary["config"]["lp_keep"] == 4
    # the core's sizes come from TransformerRecommender.yaml, the user's over them
    assert summary["config"]["hidden_size"] == small_config["hidden_size"]
    assert 0 <= summary["test_result"]["ndcg@10"] <= 1

    from user_models.lowpass import LowPassSASRec

    again = run(LowPassSASRec, "tiny", config_dict=dict(small_config, epochs=1, lp_alpha=0.5))
    assert again["config"]["lp_alpha"] == 0.5 and again["model"] == "LowPassSASRec"


def test_the_command_line_reads_the_users_keys_and_refuses_a_typo(small_config, capsys):
    args = ["--model=" + LOWPASS, "--dataset=tiny", *cli_args(dict(small_config, epochs=1))]
    assert main([*args, "--lp_alfa=0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lp_alfa" in err[0]
    assert main([*args, "--lp_keep=2"]) == 0


def test_a_recbole_style_model_runs_in_either_layout_when_it_declares_how_it_reads_rows(
    small_config, capsys
):
    config = without_transformer_settings(dict(small_config, epochs=1))
    config.pop("hidden_size")  # its size is embedding_size (LastItemLinear.yaml)
    for layout in ("right", "left"):
        summary = run(LAST_ITEM, "tiny", config_dict=dict(config, sequence_layout=layout))
        assert summary["model"] == "LastItemLinear"
    args = ["--model=user_models.last_item:Undeclared", "--dataset=tiny", *cli_args(config)]
    assert main([*args, "--sequence_layout=left"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "left_layout_reads = 'lengths'" in err[0]


@pytest.mark.parametrize(
    "model, message",
    [
        ("nosuch.module:Model", "cannot import nosuch.module"),
        ("user_models.lowpass:Missing", "user_models.lowpass has no Missing"),
        ("user_models.lowpass:torch", "is not a sequential recommender"),
        ("user_models.lowpass:", "name your own model as package.module:Class"),
    ],
)
def test_a_model_that_cannot_be_loaded_is_one_line(small_config, capsys, model, message):
    assert main([f"--model={model}", "--dataset=tiny", *cli_args(small_config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_class_named_like_a_known_model_is_refused(small_config, tmp_path, capsys, monkeypatch):
    (tmp_path / "clash.py").write_text(
        "from user_models.lowpass import LowPassSASRec\n\n\n"
        "class SASRec(LowPassSASRec):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["--model=clash:SASRec", "--dataset=tiny", *cli_args(small_config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "named like the RecBole model SASRec" in err[0]


def test_the_users_model_compares_beside_sasrec_in_packed_processes(small_config, tmp_path):
    """The comparison's packed workers are fresh processes: they import the module the
    command named (PYTHONPATH, as a user sets it)."""
    out = tmp_path / "cmp"
    argv = ["--compare", f"{LOWPASS},SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(out)]
    argv += ["--parallel", "2", "--threads_per_run", "1"]
    argv += cli_args(overrides_of(small_config, epochs=1))
    script = HERE.parent / "run_recbole_freq.py"
    env = dict(os.environ, PYTHONPATH=str(HERE), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(script), *argv], capture_output=True, text=True, env=env,
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    stored = json.loads((out / "runs" / f"{LOWPASS}-seed1.json").read_text())
    assert stored["summary"]["model"] == "LowPassSASRec"
    table = (out / "comparison.md").read_text()
    assert f"| {LOWPASS} |" in table and "SASRec (baseline)" in table
    assert f"Improv. {LOWPASS}" in table


def test_reloading_the_users_model_needs_its_module_trusted(
    small_config, tmp_path, capsys, monkeypatch
):
    """Its checkpoints and resume states name its class: loading imports its module, so
    only with --trust_module (restore_model's trust_module); without it, one line says so."""
    from test_resume import interrupt_at_epoch

    from recbole_freq.quick_start.quick_start import RunInterrupted
    from recbole_freq.quick_start.restore import restore_model

    summary = run(LOWPASS, "tiny", config_dict=dict(small_config, epochs=1))
    USER_MODELS.clear()  # a later process: nothing names the module yet
    checkpoint = summary["checkpoint"]
    assert main(["--recommend", checkpoint, "--users", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "give --trust_module user_models.lowpass" in err[0]
    assert (
        main(["--recommend", checkpoint, "--users", "1", "--trust_module", "user_models.other"])
        == 2
    )
    capsys.readouterr()
    assert (
        main(["--recommend", checkpoint, "--users", "1", "--trust_module", "user_models.lowpass"])
        == 0
    )
    USER_MODELS.clear()
    model, *_ = restore_model(checkpoint, trust_module="user_models.lowpass")
    assert type(model).__name__ == "LowPassSASRec"

    interrupt_at_epoch(monkeypatch, 2)
    with pytest.raises(RunInterrupted):
        run(LOWPASS, "tiny", config_dict=dict(small_config, epochs=3))
    monkeypatch.undo()
    USER_MODELS.clear()
    (state,) = Path(small_config["checkpoint_dir"]).glob("*.resume.pth")
    assert main(["--resume", str(state)]) == 2
    assert "--trust_module user_models.lowpass" in capsys.readouterr().err
    assert main(["--resume", str(state), "--trust_module", "user_models.lowpass"]) == 0


def test_an_installed_package_declares_its_models_by_name(
    small_config, tmp_path, monkeypatch, capsys
):
    """A package's entry points (group recbole_freq.models) name its models: --help lists
    them, --model takes the name, and their checkpoints reload (installed code, as
    RecBole's)."""
    info = tmp_path / "lowpass_models-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lowpass-models\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[recbole_freq.models]\nLowPassSASRec = user_models.lowpass:LowPassSASRec\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "installed: LowPassSASRec;" in capsys.readouterr().out.replace("\n  ", " ")
    summary = run("LowPassSASRec", "tiny", config_dict=dict(small_config, epochs=1))
    assert summary["config"]["lp_alpha"] == 0.3
    USER_MODELS.clear()
    assert main(["--recommend", summary["checkpoint"], "--users", "1"]) == 0


def test_the_users_model_is_searched_and_analysed(small_config, tmp_path):
    """The worked example through the search (Ray's worker processes import the module
    from PYTHONPATH, as a user sets it) and --analyze (with its consent)."""
    pytest.importorskip("ray")
    hyper = tmp_path / "lp.hyper"
    hyper.write_text("lp_alpha choice [0.5]\n")  # one trial: the import path is the point
    settings = {k: v for k, v in small_config.items() if k not in ("seed",)}
    argv = ["--model=" + LOWPASS, "--dataset=tiny", "--hyper_file", str(hyper), "--num_cpus=1"]
    argv += ["--verbose=0", "--storage_path", str(tmp_path / "results"), "--name", "lp"]
    argv += cli_args(dict(settings, epochs=1, checkpoint_dir=str(tmp_path / "saved")))
    script = HERE.parent / "run_recbole_freq.py"
    env = dict(os.environ, PYTHONPATH=str(HERE), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(script), *argv], capture_output=True, text=True, env=env,
        cwd=tmp_path, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    best = (tmp_path / "results" / "lp" / "best.yaml").read_text()
    assert f"--model={LOWPASS} --dataset=tiny --config_files" in best

    summary = run(LOWPASS, "tiny", config_dict=dict(small_config, epochs=1))
    USER_MODELS.clear()
    args = ["--analyze", summary["checkpoint"], "--out", str(tmp_path / "analysis")]
    assert main([*args, "--trust_module", "user_models.lowpass"]) == 0
    assert (tmp_path / "analysis" / "analysis.json").is_file()


def test_an_interrupted_comparison_of_the_users_model_shows_and_continues_its_state(
    small_config, tmp_path, monkeypatch, capsys
):
    """Its state records the class name, its entry the import path: the grid must read
    the state as this run's (it called it 'not usable' and would train again)."""
    from test_resume import interrupt_at_epoch

    out = tmp_path / "cmp"
    args = ["--compare", LOWPASS, "--dataset=tiny", "--seeds", "1", "--out", str(out)]
    args += cli_args(overrides_of(small_config, epochs=3))
    interrupt_at_epoch(monkeypatch, 2)
    assert main(args) == 130
    monkeypatch.undo()
    capsys.readouterr()
    assert main([*args, "--status"]) == 3
    # Issue 69: it said "the tables hold the runs stored so far" and wrote no table.
    said = capsys.readouterr().err
    assert "the comparison table comes once every run is stored" in said
    assert "stored so far" not in said and not (out / "comparison.md").exists()
    unfinished = (out / "unfinished.md").read_text()
    assert f"| {LOWPASS} | 1 | 2 |" in unfinished and "not usable" not in unfinished
    USER_MODELS.clear()
    assert main(args) == 0
    assert "continues at epoch 2" in capsys.readouterr().out
    assert (out / "runs" / f"{LOWPASS}-seed1.json").is_file()


def test_an_entrys_own_settings_file_reaches_that_entry_alone(small_config, tmp_path, capsys):
    """Issue 69: ``Mine@config=mine.yaml`` gives one entry its own settings; the other
    models of the comparison keep theirs (here SASRec's dropout)."""
    (tmp_path / "lp.yaml").write_text("lp_alpha: 0.7\nhidden_dropout_prob: 0.2\n")
    out = tmp_path / "cmp"
    entry = f"{LOWPASS}@config=lp.yaml"
    args = ["--compare", f"{entry},SASRec", "--dataset=tiny", "--seeds", "1", "--out", str(out)]
    assert main([*args, *cli_args(overrides_of(small_config, epochs=1))]) == 0
    mine = json.loads((out / "runs" / f"{entry}-seed1.json").read_text())["summary"]["config"]
    sasrec = json.loads((out / "runs" / "SASRec-seed1.json").read_text())["summary"]["config"]
    assert mine["lp_alpha"] == 0.7 and mine["hidden_dropout_prob"] == 0.2
    assert sasrec["hidden_dropout_prob"] != 0.2
    assert f"| {LOWPASS} [lp.yaml] |" in (out / "comparison.md").read_text()
    bad = [
        "--compare",
        f"{LOWPASS}@config=../lp.yaml",
        "--dataset=tiny",
        "--out",
        str(tmp_path / "x"),
    ]
    assert main([*bad, *cli_args(overrides_of(small_config))]) == 2
    assert "must be a plain name" in capsys.readouterr().err


def test_a_setting_the_users_model_reads_but_nobody_set_is_named(
    small_config, tmp_path, monkeypatch, capsys
):
    """Issue 69: a model whose yaml lacked a setting failed with "TypeError: unsupported
    operand type(s) for *: 'NoneType' and 'int'", naming no setting."""
    (tmp_path / "scaled.py").write_text(
        "from user_models.lowpass import LowPassSASRec\n\n\n"
        "class ScaledLowPass(LowPassSASRec):\n"
        "    def __init__(self, config, dataset):\n"
        "        super().__init__(config, dataset)\n"
        "        self.scale = config['lp_scale'] * 2\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["--model=scaled:ScaledLowPass", "--dataset=tiny", *cli_args(small_config)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "settings its code reads are not set: lp_scale (give them" in err[0]
    assert main([*args, "--lp_scale=0.5"]) == 0
