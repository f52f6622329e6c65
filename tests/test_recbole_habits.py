"""What an experienced RecBole user does next just works: their metrics in the summary, the
result in the log, RecBole's reload API, their own ``run_recbole`` left alone."""

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from conftest import REPO_ROOT, WITHOUT_SITE_HOOK
from recbole_freq.cli import main
from recbole_freq.cli.train import _default_job_files, build_parser, format_summary
from recbole_freq.compat.logs import current_log_file
from recbole_freq.quick_start.quick_start import run

# RecBole's collector crashed on these after the first evaluation (compat fix 10).
NON_ACCURACY_METRICS = ["ItemCoverage", "AveragePopularity", "GiniIndex", "TailPercentage"]


@pytest.mark.parametrize("metric", NON_ACCURACY_METRICS)
def test_recboles_non_accuracy_metrics_are_evaluated(small_config, metric):
    summary = run(
        "SASRec",
        "tiny",
        config_dict=dict(small_config, metrics=["Hit", metric], topk=[3], valid_metric="Hit@3"),
    )
    key = f"{metric.lower()}@3"
    # a share of the catalogue or of the lists (average popularity: a training count)
    upper = 1.0 if metric != "AveragePopularity" else float("inf")
    assert 0 < summary["test_result"][key] <= upper
    assert [0 < epoch["valid"][key] <= upper for epoch in summary["history"]] == [True, True]


def test_training_prints_no_grad_scaler_deprecation(small_config):
    # torch.cuda.amp.GradScaler, as RecBole's trainer builds it each epoch (compat fix 11).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run("SASRec", "tiny", config_dict=dict(small_config, epochs=1))
    assert [str(w.message) for w in caught if "GradScaler" in str(w.message)] == []


def test_the_summary_shows_the_metrics_the_user_chose(small_config, capsys):
    overrides = dict(
        small_config, epochs=1, metrics="['MRR','NDCG']", topk="[5]", valid_metric="MRR@5"
    )
    assert (
        main(["--model=SASRec", "--dataset=tiny", *[f"--{k}={v}" for k, v in overrides.items()]])
        == 0
    )
    out = capsys.readouterr().out
    assert "by valid MRR@5" in out
    rows = [line.split()[0] for line in out.splitlines() if "@" in line.split(" ")[0]]
    assert rows == ["mrr@5", "ndcg@5"]


def test_a_summary_shows_every_metric_it_holds():
    summary = {
        "model": "SASRec", "dataset": "tiny", "seed": 1, "device": "cpu",
        "config": {"data_path": "d"}, "epochs_run": 1, "stopped_early": False,
        "best_epoch": 0, "valid_metric": "MRR@5", "total_seconds": 1.0,
        "train_seconds_per_epoch": 1.0, "parameters": 10, "checkpoint": "c.pth",
        "best_valid_result": {"hit@5": 0.5, "mrr@5": 0.25, "averagepopularity@5": 12.5},
        "test_result": {"hit@5": 0.4, "mrr@5": 0.2, "averagepopularity@5": 11.0},
        "log_file": "log/SASRec/c.log", "protocol": {"label": "sasrec+loss_type=CE"},
    }  # fmt: skip
    text = format_summary(summary)
    assert "SASRec on tiny  protocol sasrec+loss_type=CE  (seed 1" in text.splitlines()[1]
    for row in ("hit@5", "mrr@5", "averagepopularity@5"):
        assert row in text
    assert "log:        log/SASRec/c.log" in text


def test_the_log_ends_with_the_result_and_names_the_checkpoint(small_config):
    summary = run(
        "SASRec", "wide", config_dict=dict(small_config, extra_test_modes=["uni100"], state="INFO")
    )
    log, checkpoint = Path(summary["log_file"]), Path(summary["checkpoint"])
    assert log.stem == checkpoint.stem and Path(summary["summary_file"]).stem == log.stem
    last_lines = log.read_text().splitlines()[-3:]
    assert [line.split("INFO  ")[1].split(":")[0].strip() for line in last_lines] == [
        "best valid",
        "test result",
        "test result (uni100)",
    ]
    test_line = last_lines[1]
    assert f"hit@10 : {summary['test_result']['hit@10']}" in test_line


def test_recboles_load_data_and_model_reloads_a_plugin_checkpoint(small_config):
    from recbole.quick_start import load_data_and_model
    from recbole.utils.case_study import full_sort_topk

    from recbole_freq.quick_start.restore import restore_model

    summary = run("BSARec", "tiny", config_dict=dict(small_config, epochs=1))
    config, model, dataset, _, _, test_data = load_data_and_model(summary["checkpoint"])
    assert config["model"] == "BSARec" and type(model).__name__ == "BSARec"
    users = dataset.token2id(dataset.uid_field, ["1", "2", "3"])
    scores, items = full_sort_topk(users, model, test_data, k=5, device=config["device"])
    # The plugin's own API scores the same model the same way.
    own, _, _, (_, _, own_test), _ = restore_model(summary["checkpoint"])
    own_scores, own_items = full_sort_topk(users, own, own_test, k=5, device="cpu")
    assert torch.equal(items.cpu(), own_items) and torch.allclose(scores.cpu(), own_scores)


def test_recboles_load_data_and_model_runs_no_code_from_a_checkpoint(tmp_path):
    from recbole.quick_start import load_data_and_model

    from recbole_freq.checkpoint.schema import UntrustedCheckpointError

    path = tmp_path / "evil.pth"
    torch.save({"config": subprocess.Popen, "state_dict": {}}, path)
    with pytest.raises(UntrustedCheckpointError):
        load_data_and_model(str(path))


def test_a_programs_own_recbole_run_may_download_but_a_plugin_run_never(tmp_path, monkeypatch):
    import recbole.data.dataset.dataset as dataset_module
    from recbole.config import Config
    from recbole.data import create_dataset

    from recbole_freq.config.configurator import FreqConfig
    from recbole_freq.data.guard import DatasetNotPreparedError

    asked = []

    class NoNetworkHere(Exception):
        pass

    def decide_download(url):
        asked.append(url)
        raise NoNetworkHere

    monkeypatch.setattr(dataset_module, "decide_download", decide_download)
    overrides = {"data_path": str(tmp_path), "train_neg_sample_args": None}
    with pytest.raises(NoNetworkHere):
        create_dataset(Config("SASRec", "ml-1m", config_dict=overrides))
    assert len(asked) == 1 and "ml-1m" in asked[0]  # RecBole's own behaviour, untouched
    with pytest.raises(DatasetNotPreparedError):
        create_dataset(FreqConfig("SASRec", "ml-1m", config_dict=overrides))
    assert len(asked) == 1


IMPORT_CHECK = """
import sys
{first}
print("ray" in sys.modules)
from recbole.quick_start import load_data_and_model
import recbole.quick_start.quick_start as quick_start
print(load_data_and_model.__module__, quick_start.load_data_and_model.__module__,
      quick_start.torch.load.__module__)
"""


@pytest.mark.parametrize(
    "first", ["import recbole_freq", "import recbole.quick_start, recbole_freq"]
)
def test_importing_the_plugin_imports_no_ray_and_still_guards_recboles_quick_start(first):
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_CHECK.format(first=first)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    ray_imported, modules = done.stdout.splitlines()
    assert ray_imported == ("True" if "recbole.quick_start" in first else "False")
    assert modules.split() == ["recbole_freq.compat.trainer"] * 3


def test_a_plain_training_run_imports_no_ray(tiny_data, tmp_path):
    code = (
        "import sys\n"
        "from recbole_freq.cli import main\n"
        f"code = main(['--model=SASRec', '--dataset=tiny', '--data_path={tiny_data}',"
        f" '--checkpoint_dir={tmp_path}', '--epochs=1', '--hidden_size=16',"
        " '--inner_size=32', '--show_progress=False', '--state=WARNING'])\n"
        "print(code, 'ray' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "0 False"


def test_a_recbole_model_gives_run_recboles_numbers(tmp_path):
    # BERT4Rec's masking transform draws from Python's random, and so does RecBole's FLOPs
    # count (it runs the transform once) before training: without the same count the
    # plugin trains on other masks (ml-100k, these settings: epoch-0 loss 1313.4267 instead
    # of 1313.1623).  On the tiny dataset the draws happen not to change the masks.
    from recbole.quick_start import run_recbole

    overrides = dict(
        hidden_size=16, inner_size=32, n_layers=1, n_heads=1, MAX_ITEM_LIST_LENGTH=20,
        epochs=1, train_batch_size=512, show_progress=False, state="INFO",
        checkpoint_dir=str(tmp_path / "saved"),
    )  # fmt: skip
    ours = run("BERT4Rec", "ml-100k", config_dict=overrides, saved=False)
    theirs = run_recbole(
        model="BERT4Rec",
        dataset="ml-100k",
        config_file_list=[str(REPO_ROOT / "properties" / "overall.yaml")],  # same settings
        config_dict=overrides,
        saved=False,
    )
    theirs_log = Path(current_log_file()).read_text()
    ours_log = Path(ours["log_file"]).read_text()
    assert train_losses(ours_log) == train_losses(theirs_log) and len(train_losses(ours_log)) == 1
    assert ours["test_result"] == dict(theirs["test_result"])
    assert "FLOPs" in ours_log


def train_losses(log: str) -> list[str]:
    return re.findall(r"train loss: ([0-9.]+)", log)


@pytest.mark.parametrize(
    "argv, default_job",
    [
        ([], True),
        (["--epochs=3"], True),
        (["--dataset=ml-100k"], False),  # the default dataset, named: the full budget
        (["--model=BSARec"], False),
        (["--config_files", "a.yaml"], False),
    ],
)
def test_only_a_command_naming_no_model_dataset_or_config_runs_the_default_job(argv, default_job):
    args, _ = build_parser().parse_known_args(argv)
    files = _default_job_files(args) or []
    assert [Path(f).name for f in files if f.endswith("default_job.yaml")] == (
        ["default_job.yaml"] if default_job else []
    )


def test_run_hypers_output_file_outside_a_search_is_refused(capsys):
    assert main(["--model=SASRec", "--output_file", "result.txt"]) == 2
    assert "--hyper_file (or --params_file)" in capsys.readouterr().err
    assert not Path("result.txt").exists()


def test_built_in_property_files_are_named_without_a_path(tmp_path):
    from recbole_freq.config.configurator import find_config_file, properties_dir

    uni100 = properties_dir() / "protocol" / "uni100.yaml"
    for name in ("protocol/uni100", "protocol/uni100.yaml", "properties/protocol/uni100.yaml"):
        assert find_config_file(name) == uni100
    bsarec_space = properties_dir() / "hyper" / "BSARec.hyper"
    assert find_config_file("hyper/BSARec", suffix=".hyper") == bsarec_space
    with pytest.raises(FileNotFoundError, match=r"'protocol/uni1000' .*closest: protocol/uni100"):
        find_config_file("protocol/uni1000")
    # A file of the user's at that path wins (the working directory is tmp_path).
    (tmp_path / "protocol").mkdir()
    (tmp_path / "protocol" / "uni100.yaml").write_text("epochs: 1\n")
    assert find_config_file("protocol/uni100.yaml") == Path("protocol/uni100.yaml")


def test_a_run_takes_a_built_in_config_file_by_name(small_config):
    summary = run("SASRec", "wide", config_files=["protocol/uni100"], config_dict=small_config)
    assert summary["protocol"]["label"].startswith("uni100"), summary["protocol"]


def test_progress_bars_show_on_a_terminal_only_unless_asked(small_config, monkeypatch):
    """In a log or a pipe every bar redraw is a line; show_progress given wins."""
    from recbole_freq.config.configurator import FreqConfig

    settings = {k: v for k, v in small_config.items() if k != "show_progress"}
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert FreqConfig("SASRec", "tiny", cmd_overrides=settings)["show_progress"] is False
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert FreqConfig("SASRec", "tiny", cmd_overrides=settings)["show_progress"] is True
    given = dict(settings, show_progress=False)
    assert FreqConfig("SASRec", "tiny", cmd_overrides=given)["show_progress"] is False
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    given = dict(settings, show_progress=True)
    assert FreqConfig("SASRec", "tiny", cmd_overrides=given)["show_progress"] is True


def test_a_run_into_a_pipe_prints_no_progress_bars(tmp_path, tiny_data):
    """The README's job with its output piped (as in CI or a log file): no bar lines."""
    import subprocess

    script = Path(__file__).resolve().parent.parent / "run_recbole_freq.py"
    done = subprocess.run(
        [sys.executable, str(script), "--model=SASRec", "--dataset=tiny",
         f"--data_path={tiny_data}", "--epochs=1", "--hidden_size=8", "--n_layers=1",
         "--n_heads=1", "--inner_size=8", f"--checkpoint_dir={tmp_path / 'saved'}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Train     0:" not in done.stderr + done.stdout and "it/s]" not in done.stderr


def test_recboles_load_data_and_model_needs_the_plugin_imported_as_readme_says(tmp_path, tiny_data):
    """README: a plain RecBole script cannot read the plugin's checkpoints (KeyError:
    'seed'); the same script with ``import recbole_freq`` first reloads the model."""
    summary = run(
        "SASRec",
        "tiny",
        config_dict={"data_path": str(tiny_data), "epochs": 1, "hidden_size": 8, "n_layers": 1,
                     "n_heads": 1, "inner_size": 8, "checkpoint_dir": str(tmp_path / "saved")},
    )  # fmt: skip
    script = WITHOUT_SITE_HOOK + (
        "from recbole.quick_start import load_data_and_model\n"
        f"config, model, *_ = load_data_and_model({summary['checkpoint']!r})\n"
        "print(type(model).__name__)\n"
    )

    def in_a_fresh_process(code):
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path
        )

    plain = in_a_fresh_process(script)
    assert plain.returncode != 0 and "KeyError: 'seed'" in plain.stderr
    imported = in_a_fresh_process("import recbole_freq\n" + script)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip().splitlines()[-1] == "SASRec"


def test_one_dataset_yaml_serves_a_sweep_of_baselines(small_config, tmp_path, capsys):
    # RecBole ignores keys a model does not read; GRU4Rec stopped at inner_size, then
    # n_layers, and Caser at hidden_size.
    shared = tmp_path / "my.yaml"
    shared.write_text("hidden_size: 16\ninner_size: 32\nn_layers: 1\nn_heads: 2\nepochs: 1\n")
    config = {k: v for k, v in small_config.items() if k not in ("hidden_size", "inner_size", "n_layers", "n_heads")}  # fmt: skip
    summary = run("GRU4Rec", "tiny", config_files=[str(shared)], config_dict=config)
    log = Path(summary["log_file"]).read_text()
    assert "settings that GRU4Rec does not read (other models do; RecBole ignores them too)" in log
    assert "inner_size" in log.split("does not read")[1].splitlines()[0]
    assert run("Caser", "tiny", config_files=[str(shared)], config_dict=config)["test_result"]
    # A typo is still an error, and a flag typed for this run that it ignores too.
    shared.write_text("hiden_size: 16\n")
    with pytest.raises(ValueError, match="did you mean hidden_size"):
        run("GRU4Rec", "tiny", config_files=[str(shared)], config_dict=config)
    assert main(["--model=GRU4Rec", "--dataset=tiny", "--inner_size=32", *[f"--{k}={v}" for k, v in config.items()]]) == 2  # fmt: skip
    assert "--inner_size (command line) is not a setting of GRU4Rec" in capsys.readouterr().err


def test_a_checkpoint_of_a_relative_data_path_reloads_from_another_folder(
    tiny_data, small_config, tmp_path, monkeypatch
):
    from recbole.quick_start import load_data_and_model

    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    relative = os.path.relpath(tiny_data, project)
    summary = run("SASRec", "tiny", config_dict=dict(small_config, epochs=1, data_path=relative))
    monkeypatch.chdir(tmp_path)  # elsewhere: the relative path points nowhere
    config, model, *_ = load_data_and_model(summary["checkpoint"])
    assert config["data_path"] == str(tiny_data / "tiny") and model is not None


def test_recboles_custom_model_pipeline_names_freqconfig_and_freqconfig_works(tiny_data):
    # RecBole's Config never loads a plugin model's property file: every setting was
    # None and the model failed with a bare TypeError in layers.py.
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation

    from recbole_freq.config import FreqConfig, get_model_class

    bsarec = get_model_class("BSARec")
    settings = {"data_path": str(tiny_data), "epochs": 1}
    plain = Config(
        model=bsarec, dataset="tiny",
        config_dict=dict(settings, loss_type="CE", train_neg_sample_args=None,
                         load_col={"inter": ["user_id", "item_id", "timestamp"]}),
    )  # fmt: skip
    train, _, _ = data_preparation(plain, create_dataset(plain))
    with pytest.raises(TypeError, match=r"build it with recbole_freq.config.FreqConfig\("):
        bsarec(plain, train._dataset)
    # The same pipeline on FreqConfig, as README shows it.
    config = FreqConfig("BSARec", "tiny", config_dict=settings)
    train, _, _ = data_preparation(config, create_dataset(config))
    assert bsarec(config, train._dataset).hidden_size == config["hidden_size"]


def test_recboles_run_hyper_and_run_recbole_flags(small_config, tmp_path, capsys):
    from recbole_freq.cli import with_plugin_flags

    # Refused as unknown before: --tool, --display_file (run_hyper.py), --group_offset
    # (run_recbole.py).
    assert with_plugin_flags(["--group_offset", "0", "--params_file=x"]) == [
        "--offset=0", "--hyper_file=x",
    ]  # fmt: skip
    settings = [f"--{k}={v}" for k, v in dict(small_config, epochs=1).items()]
    assert main(["--model=SASRec", "--dataset=tiny", "--group_offset", "0", *settings]) == 0
    capsys.readouterr()
    hyper = tmp_path / "space.hyper"
    hyper.write_text("learning_rate choice [0.001]\n")
    search = ["--model=SASRec", "--dataset=missing", "--params_file", str(hyper)]
    assert main([*search, "--tool", "Hyperopt"]) == 2
    err = capsys.readouterr().err
    assert "--tool Hyperopt: the plugin searches with Ray Tune only; for hyperopt's TPE" in err
    assert main([*search, "--tool", "Ray", "--display_file", "plot.html"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("note: --display_file plot.html: no plotly figure is drawn")
    assert "dataset 'missing' is not prepared" in err[1] and len(err) == 2


PLAIN_RECBOLE = """
import site, sys
if sys.argv[1] != "-":
    site.addsitedir(sys.argv[1])  # as site-packages is read at start-up
import numpy as np
from recbole.quick_start import load_data_and_model, run_recbole
run_recbole(model="SASRec", dataset="tiny", config_dict={
    "data_path": sys.argv[2], "epochs": 1, "train_neg_sample_args": None, "hidden_size": 16,
    "n_layers": 1, "n_heads": 1, "inner_size": 16, "checkpoint_dir": "saved",
    "show_progress": False, "state": "WARNING",
    "load_col": {"inter": ["user_id", "item_id", "timestamp"]}})
config, model, *_ = load_data_and_model(sys.argv[3])
print("plain RecBole ran and reloaded", type(model).__name__)
"""


def test_plain_recbole_runs_in_the_plugins_environment(small_config, tiny_data, tmp_path):
    # Without `import recbole_freq`, run_recbole stopped at numpy 2's np.float_ and
    # load_data_and_model of a plugin checkpoint at KeyError: 'seed'.
    from recbole_freq.compat import site_hook

    checkpoint = run("BSARec", "tiny", config_dict=dict(small_config, epochs=1))["checkpoint"]
    hook = site_hook.install(tmp_path / "site")
    assert hook.name == site_hook.HOOK_FILE

    def plain(site_dir):
        return subprocess.run(
            [sys.executable, "-c", WITHOUT_SITE_HOOK + PLAIN_RECBOLE, site_dir, str(tiny_data),
             checkpoint],
            capture_output=True, text=True, timeout=600, cwd=tmp_path,
        )  # fmt: skip

    without = plain("-")
    assert without.returncode != 0 and "np.float_" in without.stderr
    hooked = plain(str(hook.parent))
    assert hooked.returncode == 0, hooked.stderr[-2000:]
    assert "plain RecBole ran and reloaded BSARec" in hooked.stdout
    site_hook.remove(tmp_path / "site")
    assert not hook.exists()


def test_the_site_hook_fails_open_where_the_plugin_cannot_be_imported(tmp_path, monkeypatch):
    """The .pth left behind by `pip uninstall`, or a broken plugin: RecBole still loads,
    after one warning that says how to take the hook out (every `import recbole` in the
    environment failed before)."""
    from recbole_freq.compat import site_hook

    hook = site_hook.install(tmp_path / "site")
    code = WITHOUT_SITE_HOOK + (
        "import site; site.addsitedir(sys.argv[1])\n"
        "sys.modules['recbole_freq'] = None  # as if uninstalled\n"
        "import recbole.config\n"
        "print('recbole loaded')\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(hook.parent)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "recbole loaded" in done.stdout
    warnings = [line for line in done.stderr.splitlines() if "fixes not applied" in line]
    assert len(warnings) == 1 and "--remove" in warnings[0]

    # A site-packages that cannot be written: one line and exit 1, no traceback.
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setattr(site_hook, "site_packages", lambda: blocked / "site")
    assert site_hook.main([]) == 1
