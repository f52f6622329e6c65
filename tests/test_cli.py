"""The entry point: summary, overrides, property files, and clear errors on bad input."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, WITHOUT_SITE_HOOK
from recbole_freq.cli import main
from recbole_freq.config.configurator import FreqConfig, property_files


def cli_args(config: dict) -> list[str]:
    return [f"--{key}={value}" for key, value in config.items()]


def test_main_prints_readable_summary(small_config, capsys):
    code = main(["--model=BSARec", "--dataset=tiny", *cli_args(dict(small_config, epochs=1))])
    out = capsys.readouterr().out
    assert code == 0
    for text in (
        "BSARec on tiny",
        "epochs run: 1",
        "hit@5",
        "ndcg@20",
        "valid (best)",
        "checkpoint:",
        ".pth",
    ):
        assert text in out


def test_overrides_and_config_files_follow_recbole_priority(tiny_data, tmp_path):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("alpha: 0.1\nc: 5\nlearning_rate: 0.01\n")
    second.write_text("alpha: 0.3\n")
    config = FreqConfig(
        "BSARec",
        "tiny",
        config_file_list=[str(first), str(second)],
        cmd_overrides={"c": "7", "data_path": str(tiny_data)},
    )
    assert (config["alpha"], config["c"], config["learning_rate"]) == (0.3, 7, 0.01)
    assert config["hidden_size"] == 64 and config["hidden_dropout_prob"] == 0.5  # model yaml
    assert config["eval_args"]["split"] == {"LS": "valid_and_test"}  # overall.yaml


def test_paper_settings_are_ready_property_files():
    files = property_files("BSARec", "lastfm", paper=True)
    assert files[-1].endswith(os.path.join("paper", "BSARec", "lastfm.yaml"))
    config = FreqConfig("BSARec", "lastfm", cmd_overrides={"data_path": "unused"}, paper=True)
    assert (config["alpha"], config["c"], config["n_heads"], config["learning_rate"]) == (
        0.9,
        3,
        1,
        0.001,
    )
    with pytest.raises(ValueError, match="no paper settings for BSARec on 'tiny'"):
        property_files("BSARec", "tiny", paper=True)


def test_config_ignores_foreign_command_line_flags(monkeypatch):
    # Ray workers and pytest pass their own flags; RecBole's Config would read them.
    monkeypatch.setattr(sys, "argv", ["worker", "--alpha=0.123", "--node-ip-address=1.2.3.4"])
    assert FreqConfig("BSARec", "lastfm", cmd_overrides={"data_path": "x"})["alpha"] == 0.9


BAD_INPUTS = [
    (["--model=NoSuchModel"], "unknown model 'NoSuchModel'"),
    (["--dataset=amazon-toys-games"], "dataset 'amazon-toys-games' is not prepared"),
    (["--dataset=amazon-toys-games"], "python -m dataset_prep amazon-toys-games --raw"),
    (["--alpha=1.5"], r"alpha=1.5 must lie in [0, 1]"),
    (["--c=0"], "c=0 is out of range"),
    (["--c=200"], "c=200 is out of range for MAX_ITEM_LIST_LENGTH=12"),
    (["--n_heads=3"], "hidden_size=16 is not divisible by n_heads=3"),
    (
        ["--model=FBSARec", "--fusion_branches=['bsa','nope']"],
        "fusion_branches=['bsa', 'nope'] is invalid",
    ),
    (["--config_files", "missing.yaml"], "config file 'missing.yaml' does not exist"),
    # RecBole's launcher keys (data-parallel training) that cannot run.
    (["--nproc=0"], "nproc=0: a run needs at least 1 process"),
    (["--world_size=4"], "world_size=4 spans machines (nproc=1 here): give ip and port"),
    (["--nproc=2", "--offset=1"], "nproc=2 processes from offset=1 exceed world_size=2"),
    (["--nproc=2", "--train_batch_size=63"], "train_batch_size=63 does not split into"),
]


@pytest.mark.parametrize("args,message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_is_a_clear_error(small_config, capsys, args, message):
    given = {arg[2:].split("=", 1)[0] for arg in args if "=" in arg}
    base = {
        key: value for key, value in {"dataset": "tiny", **small_config}.items() if key not in given
    }
    code = main([*cli_args(base), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err


def test_malformed_override_is_a_usage_error(capsys):
    assert main(["--model=BSARec", "alpha=0.5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--key=value" in err and "--help" in err
    # argparse's own errors too: one line, not a usage block.
    assert main(["--recommend"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected one argument" in err


def test_entry_point_script_exits_non_zero_on_unknown_model(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "run_recbole_freq.py"), "--model=Nope"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "unknown model 'Nope'" in result.stderr and "BSARec" in result.stderr
    assert "Traceback" not in result.stderr


def test_extra_test_modes_add_the_sampled_protocol_without_retraining(small_config):
    from recbole_freq.quick_start.quick_start import run

    config = dict(small_config, epochs=1, extra_test_modes=["uni100"])
    summary = run("SASRec", "wide", config_dict=config)
    sampled = summary["extra_test_results"]["uni100"]
    assert set(sampled) == set(summary["test_result"])
    # Ranked among 100 sampled items instead of all 150: never a worse rank.
    for metric, value in summary["test_result"].items():
        assert sampled[metric] >= value - 1e-4
    again = run("SASRec", "wide", config_dict=config)
    assert again["extra_test_results"] == summary["extra_test_results"]
    assert again["checkpoint"] != summary["checkpoint"]


def test_unknown_extra_test_mode_is_an_error(small_config):
    from recbole_freq.quick_start.quick_start import run

    with pytest.raises(ValueError, match="not a RecBole evaluation mode"):
        run("SASRec", "tiny", config_dict=dict(small_config, epochs=1, extra_test_modes=["x5"]))


def test_conflicting_jobs_are_a_usage_error(capsys):
    assert main(["--compare", "SASRec", "--hyper_file", "x.hyper"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --compare and --hyper_file are separate jobs; give one\n"


def test_help_lists_every_job_and_each_job_has_its_own(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for job in ("--compare", "--hyper_file", "--analyze", "--recommend", "--resume"):
        assert job in text
    assert "--epochs=N" in text and "accept_unknown_keys" in text and "130" in text
    for job, usage in (("--analyze", "--analyze CHECKPOINT"), ("--recommend", "--recommend")):
        assert main([job, "--help"]) == 0
        assert usage in capsys.readouterr().out


def test_config_files_as_one_space_separated_string(tiny_data, tmp_path, capsys):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("epochs: 1\nhidden_size: 16\ninner_size: 32\n")
    second.write_text("n_layers: 1\nn_heads: 1\nshow_progress: False\nstate: WARNING\n")
    base = ["--model=SASRec", "--dataset=tiny", f"--data_path={tiny_data}"]
    assert main([*base, f"--config_files={first} {second}"]) == 0
    out = capsys.readouterr().out
    summary_file = next(line for line in out.splitlines() if line.startswith("summary:"))
    config = json.loads(open(summary_file.split(None, 1)[1]).read())["config"]
    assert (config["epochs"], config["n_layers"], config["n_heads"]) == (1, 1, 1)


def test_jobs_and_the_python_api_never_import_the_command_line():
    """The command line sits on top: it imports the jobs, no job or API module imports it
    (so following argv never loops back, and a job is usable from Python alone)."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "recbole_freq"
    offenders = []
    for path in package.rglob("*.py"):
        relative = path.relative_to(package)
        if relative.parts[0] in ("cli", "__main__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(
                name == "recbole_freq.cli" or name.startswith("recbole_freq.cli.") for name in names
            ):
                offenders.append(str(relative))
    assert offenders == []


def test_python_dash_m_runs_the_same_command_line():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "recbole_freq", "--compare", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: python -m recbole_freq --compare" in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "recbole_freq", "--compare", "A", "--hyper_file", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr == "error: --compare and --hyper_file are separate jobs; give one\n"


@pytest.mark.parametrize(
    "argv0, command",
    [
        ("/home/u/venv/bin/recbole-freq", "recbole-freq"),
        (
            "/home/u/venv/lib/python3.12/site-packages/recbole_freq/__main__.py",
            "python -m recbole_freq",
        ),
        ("run_recbole_freq.py", "python run_recbole_freq.py"),
        ("../my checkout/run_recbole_freq.py", "python '../my checkout/run_recbole_freq.py'"),
        ("-c", "python -m recbole_freq"),  # the Python API: a command that always works
    ],
)
def test_hints_name_the_command_that_was_run(argv0, command):
    from recbole_freq.utils.command import invoked_command

    assert invoked_command(argv0) == command


def test_the_installed_script_names_itself_in_usage_and_hints(tmp_path):
    """Usage lines and the 'Resume with' / 'train it' hints follow sys.argv[0]."""
    import subprocess
    import sys

    script = tmp_path / "recbole-freq"
    script.write_text("import sys\nfrom recbole_freq.cli import main\nsys.exit(main())\n")
    done = subprocess.run(
        [sys.executable, str(script), "--recommend", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: recbole-freq --recommend")
    done = subprocess.run(
        [sys.executable, str(script), "--config_files", "no/such/file"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "recbole-freq --help lists them" in done.stderr


def _modules_loaded_by(code: str) -> set[str]:
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", code + "\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


HEAVY = ("torch", "sklearn", "recbole.config", "recbole.trainer", "pandas", "ray")


@pytest.mark.parametrize(
    "job", [[], ["--compare"], ["--hyper_file"], ["--analyze"], ["--recommend"], ["--evaluate"]]
)
def test_help_answers_without_loading_torch_or_recbole(job):
    """Every --help is read before anything heavy loads (it took 8 s when every import
    ran)."""
    loaded = _modules_loaded_by(
        "import sys, contextlib, io\n"
        f"sys.argv = ['run_recbole_freq.py', *{job!r}, '--help']\n"
        "from recbole_freq.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    try:\n        main()\n    except SystemExit:\n        pass\n"
        "assert out.getvalue().startswith('usage: '), out.getvalue()\n"
    )
    assert not [name for name in (*HEAVY, "matplotlib") if name in loaded]


def test_importing_the_plugin_is_light_and_its_names_load_on_use():
    loaded = _modules_loaded_by("import recbole_freq")
    assert not [name for name in HEAVY if name in loaded]
    loaded = _modules_loaded_by(
        "from recbole_freq import FreqConfig, MODELS, get_model_class\n"
        "assert 'BSARec' in MODELS and get_model_class('BSARec').__name__ == 'BSARec'\n"
        "assert FreqConfig.__name__ == 'FreqConfig'\n"
    )
    assert "torch" in loaded and "recbole.config" in loaded


def test_recbole_modules_imported_before_the_plugin_are_patched_at_its_import():
    """The fixes are applied when a RecBole module is first imported, or at once for one
    that a program imported before the plugin."""
    code = WITHOUT_SITE_HOOK + (
        "import recbole.trainer.trainer as t\n"
        "import recbole.utils as u\n"
        "assert t.torch.__name__ == 'torch'\n"
        "import recbole_freq\n"
        "assert t.torch.__name__ == 'torch_with_safe_checkpoint_files'\n"
        "assert hasattr(u.init_logger, '__wrapped__')\n"
        "from recbole.data.dataset import Dataset\n"
        "assert hasattr(Dataset._download, '__wrapped__')\n"
    )
    _modules_loaded_by(code)


def test_help_names_the_models_and_data_parallel_flags(capsys):
    from recbole_freq.model import MODELS
    from recbole_freq.utils.command import PLUGIN_MODEL_NAMES

    # --help named no model and left out --nproc (it must not import torch for the list).
    assert list(PLUGIN_MODEL_NAMES) == sorted(MODELS)
    with pytest.raises(SystemExit):
        main(["--help"])
    printed = " ".join(capsys.readouterr().out.split())
    assert "models (--model): " + ", ".join(PLUGIN_MODEL_NAMES) in printed
    assert "--nproc=N" in printed and "--group_offset" in printed
    assert "1 the environment failed (an output could not be written, memory ran out, " in printed
