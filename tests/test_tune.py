"""Ray Tune search: hyper-file parsing, bad input, and a real 2-trial search on tiny data."""

import json
import math
import os
import socket
import sys

import numpy as np
import pytest
import torch
import yaml

from conftest import SMALL_MODEL, main_with_ctrl_c_once
from recbole_freq.cli import main
from recbole_freq.config.configurator import FreqConfig, properties_dir
from recbole_freq.jobs.tune import (
    HyperFileError,
    SearchOptions,
    TuneSetupError,
    distinct_combinations,
    grid_size,
    parse_hyper_file,
    parse_hyper_lines,
    trial_device_overrides,
    tune_model,
)
from recbole_freq.quick_start.quick_start import run

EVERY_KEYWORD = """\
# RecBole hyper file: every keyword
learning_rate loguniform -8,0

dropout uniform 0.1,0.5
hidden_size quniform 16,64,16
weight_decay quniform 0.0,0.3,0.1
alpha choice [0.1, 0.3,0.5]
loss_type choice ['CE','BPR']
trc_sublayers choice [['attention'],['attention','feed_forward']]
"""


def _sample(domain, n=300):
    return [domain.sample(random_state=np.random.RandomState(seed)) for seed in range(n)]


def test_parser_reads_every_recbole_keyword_with_recbole_semantics():
    space = parse_hyper_lines(EVERY_KEYWORD.splitlines())
    assert list(space) == [
        "learning_rate",
        "dropout",
        "hidden_size",
        "weight_decay",
        "alpha",
        "loss_type",
        "trc_sublayers",
    ]
    # loguniform: natural-log bounds, as hyperopt.hp.loguniform reads them.
    lr = space["learning_rate"].to_tune()
    assert lr.lower == pytest.approx(math.exp(-8)) and lr.upper == pytest.approx(1.0)
    values = _sample(lr)
    assert all(math.exp(-8) <= v <= 1.0 for v in values)
    assert min(values) < 0.01 < max(values)  # spread over orders of magnitude
    assert all(0.1 <= v <= 0.5 for v in _sample(space["dropout"].to_tune()))
    # quniform low,high,q: multiples of q; integer bounds give ints (layer sizes).
    assert space["hidden_size"].grid_values() == [16, 32, 48, 64]
    sizes = _sample(space["hidden_size"].to_tune())
    assert set(sizes) <= {16, 32, 48, 64} and all(isinstance(v, int) for v in sizes)
    assert space["weight_decay"].grid_values() == pytest.approx([0.0, 0.1, 0.2, 0.3])
    decays = _sample(space["weight_decay"].to_tune())
    assert all(any(abs(v - g) < 1e-9 for g in (0.0, 0.1, 0.2, 0.3)) for v in decays)
    assert space["alpha"].values == (0.1, 0.3, 0.5)
    assert space["loss_type"].values == ("CE", "BPR")
    assert space["trc_sublayers"].values[1] == ["attention", "feed_forward"]
    assert grid_size(space) is None  # continuous parameters present
    assert grid_size({k: space[k] for k in ("hidden_size", "alpha")}) == 12


@pytest.mark.parametrize(
    "line, message",
    [
        ("alpha choice", "expected '<name> <type> <values>'"),
        ("alpha normal 0,1", "unknown type 'normal'"),
        ("alpha choice [0.1,", "Python list literal"),
        ("alpha choice __import__('os')", "Python list literal"),
        ("alpha choice []", "non-empty list"),
        ("alpha choice 0.5", "non-empty list"),
        ("lr uniform 0.1", "'low,high'"),
        ("lr uniform 0.5,0.1", "must be below high"),
        ("lr loguniform a,b", "numbers"),
        ("lr loguniform -8,inf", "finite"),
        ("size quniform 16,64", "'low,high,q'"),
        ("size quniform 16,64,0", "q must be positive"),
        ("size quniform 5,6,10", "no multiple of q"),
        ("size quniform 1,1e12,1", "has 1,000,000,000,000 values, more than the 100,000"),
        ("learning_rate choice [0.1]", "already defined on line 1"),
        # Tracebacks before: exp(1000) overflowed, 1/1e-320 was inf.
        (
            "lr loguniform 1,1000",
            "exp(1000) overflows; for values from 1 to 1000 write loguniform 0,6.908",
        ),
        ("size quniform 0,1,1e-320", "the step q=1e-320 is too small"),
    ],
)
def test_malformed_line_names_line_and_number(tmp_path, line, message):
    path = tmp_path / "bad.hyper"
    path.write_text(f"learning_rate choice [0.001]\n{line}\n")
    with pytest.raises(HyperFileError) as error:
        parse_hyper_file(path)
    text = str(error.value)
    assert message in text
    assert "line 2" in text and repr(line) in text and str(path) in text


def test_empty_or_missing_hyper_file(tmp_path):
    path = tmp_path / "empty.hyper"
    path.write_text("# nothing to search\n\n")
    with pytest.raises(HyperFileError, match="search space is empty"):
        parse_hyper_file(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        parse_hyper_file(tmp_path / "missing.hyper")


def test_shipped_hyper_files_are_the_papers_spaces_and_valid_keys(tiny_data):
    expected = {
        "BSARec": {
            "alpha": [0.1, 0.3, 0.5, 0.7, 0.9],
            "c": [1, 3, 5, 7, 9],
            "n_heads": [1, 2, 4],
            "learning_rate": [5e-4, 1e-3],
        },
        "RecDenoiser": {
            "sparsity_beta": [1e-1, 1e-2, 1e-3, 1e-4, 1e-5],
            "jacobian_gamma": [1e-1, 1e-2, 1e-3, 1e-4, 1e-5],
        },
        "PolyRec": {"trc_c": [1, 3, 5, 7, 9], "trc_alpha": [0.1, 0.3, 0.5, 0.7, 0.9]},
    }
    for model, values in expected.items():
        space = parse_hyper_file(properties_dir() / "hyper" / f"{model}.hyper")
        for name, grid in values.items():
            assert space[name].grid_values() == grid
        config = FreqConfig(model, "tiny", config_dict={"data_path": str(tiny_data)})
        assert set(space) <= set(config.final_config_dict)
    polyrec = parse_hyper_file(properties_dir() / "hyper" / "PolyRec.hyper")
    assert {"poly_order", "cl_weight"} <= set(polyrec)


def test_random_search_of_a_discrete_space_draws_distinct_combinations():
    space = parse_hyper_file(properties_dir() / "hyper" / "BSARec.hyper")
    assert grid_size(space) == 150
    picks = distinct_combinations(space, 20, seed=3)
    assert len({json.dumps(p, sort_keys=True) for p in picks}) == 20
    assert picks == distinct_combinations(space, 20, seed=3)
    assert all(p["n_heads"] in (1, 2, 4) and p["c"] in (1, 3, 5, 7, 9) for p in picks)
    everything = distinct_combinations(space, 150, seed=0)
    assert len({json.dumps(p, sort_keys=True) for p in everything}) == 150


def test_fixed_first_puts_the_fixed_settings_first_and_counts_them_in_the_samples():
    """``--fixed_first``: trial 1 is the fixed settings' point (e.g. ``--paper``'s), the
    others distinct draws, ``num_samples`` in all, for discrete and continuous spaces."""
    pytest.importorskip("ray")
    from recbole_freq.jobs.tune.search import _searcher, fixed_point

    space = parse_hyper_file(properties_dir() / "hyper" / "TVRec.hyper")
    paper = {"learning_rate": 0.001, "basis_size": 8, "orthogonality_weight": 0.001,
             "hidden_dropout_prob": 0.4}  # fmt: skip
    first = fixed_point(space, dict(paper, other_key=1))
    assert first == paper
    metric_mode = ("valid_score", "max")
    for draws in range(1, 9):
        generator, samples, _ = _searcher("random", space, metric_mode, draws, 1, 42, first)
        points = generator._points_to_evaluate
        assert samples == draws and len(points) == draws and points[0] == paper
        assert len({json.dumps(p, sort_keys=True) for p in points}) == draws
    # without it, the same draws as before (a search saved earlier resumes unchanged)
    generator, _, _ = _searcher("random", space, metric_mode, 8, 1, 42)
    assert generator._points_to_evaluate == distinct_combinations(space, 8, 42)
    # a continuous space: the first point, then Ray's own draws
    continuous = parse_hyper_lines(["learning_rate uniform 0.0001,0.01"])
    start = fixed_point(continuous, {"learning_rate": 0.001})
    generator, _, _ = _searcher("random", continuous, metric_mode, 5, 1, 42, start)
    assert generator._points_to_evaluate == [{"learning_rate": 0.001}]
    # a flag's True is not the count 1, and values outside the bounds are refused
    flags = parse_hyper_lines(["n_heads choice [1,2]"])
    with pytest.raises(TuneSetupError, match="n_heads's fixed value True"):
        fixed_point(flags, {"n_heads": True})
    with pytest.raises(TuneSetupError, match="between 0.0001 and 0.01"):
        fixed_point(continuous, {"learning_rate": 0.1})


def test_trial_stays_on_the_devices_ray_assigned(tiny_data, monkeypatch):
    cpu = trial_device_overrides([])
    assert cpu == {"gpu_id": "", "use_gpu": False}
    # A user's gpu_id must not win over the trial's assignment (cmd overrides win last).
    config = FreqConfig("BSARec", "tiny", None, {"data_path": str(tiny_data)}, cpu)
    assert str(config["device"]) == "cpu" and config["use_gpu"] is False
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert trial_device_overrides([3]) == {"gpu_id": "3", "use_gpu": True}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert trial_device_overrides([1, 2])["gpu_id"] == "1,2"


def _hyper(tmp_path, text, name="space.hyper"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "text, kwargs, message",
    [
        ("learnin_rate choice [0.1]", {}, "did you mean learning_rate"),
        ("alpha choice [0.1]", {"cmd_overrides": {"alpha": "0.5"}}, "both tuned"),
        ("gpu_id choice [0,1]", {}, "cannot be tuned"),
        ("lr_x uniform 0,1", {}, "not a config key of BSARec"),
        ("learning_rate uniform 0.0001,0.01", {"search": "grid"}, "grid search needs discrete"),
        ("alpha choice [0.1,0.3]", {"num_samples": 3}, "exceeds the 2 combinations"),
        ("alpha choice [0.1,0.3]", {"search": "grid", "num_samples": 2}, "--num_samples is for"),
        ("alpha choice [0.1,0.3]", {"search": "optuna"}, "pip install optuna"),
        ("alpha choice [0.1,0.3]", {"search": "hyperopt"}, "pip install hyperopt"),
        ("alpha choice [0.1,0.3]", {"grace_period": 5}, "--grace_period 5"),
        ("alpha choice [0.1,0.3]", {"search": "grid", "fixed_first": True}, "for a sampled"),
        # BSARec's default alpha (0.9) is not in the space: no first trial outside it
        (
            "alpha choice [0.1,0.3]",
            {"num_samples": 2, "fixed_first": True},
            r"--fixed_first: alpha's fixed value 0.9 is not in the space \(hyper file line 1",
        ),
        ("alpha choice [0.1,0.3]", {"cpus_per_trial": 0}, "positive --cpus_per_trial"),
        ("alpha choice [0.1]", {"cmd_overrides": {"nproc": "2"}}, "nproc and world_size"),
        # The command line's rules: a search with epochs 0 "completed" with valid -inf.
        ("epochs choice [0]", {}, r"line 1: epochs = 0: epochs=0: a run needs at least 1"),
        ("eval_step choice [1,500]", {}, r"eval_step = 500: eval_step=500 with epochs="),
        ("valid_metric choice ['NDCG@20','MRR@10']", {}, "valid_metric = 'MRR@10'"),
    ],
)
def test_bad_search_requests_fail_before_ray_starts(tmp_path, small_config, text, kwargs, message):
    if "optuna" in message or "hyperopt" in message:
        pytest.importorskip("ray")
        package = "optuna" if "optuna" in message else "hyperopt"
        if package in sys.modules or _importable(package):
            pytest.skip(f"{package} is installed")
    with pytest.raises(TuneSetupError, match=message):
        tune_model(
            "BSARec",
            "tiny",
            _hyper(tmp_path, text),
            config_dict={k: v for k, v in small_config.items() if k != text.split()[0]},
            storage_path=tmp_path / "results",
            cmd_overrides=kwargs.pop("cmd_overrides", None),
            options=SearchOptions(**kwargs),
        )


def _importable(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_missing_ray_is_a_clear_error(tmp_path, small_config, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(TuneSetupError, match=r"pip install 'ray\[tune\]'"):
        tune_model(
            "BSARec", "tiny", _hyper(tmp_path, "alpha choice [0.1]"), config_dict=small_config
        )


def test_rays_release_pinned_by_recbole_is_a_clear_error(tmp_path, small_config, monkeypatch):
    # `pip install recbole==1.2.1` without --no-deps installs Ray 2.6.3 (no numpy 2).
    import importlib.metadata

    real_version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "2.6.3" if name == "ray" else real_version(name)
    )
    with pytest.raises(TuneSetupError, match=r"found 2\.6\.3.*pip install 'ray\[tune\]>=2\.40'"):
        tune_model(
            "BSARec", "tiny", _hyper(tmp_path, "alpha choice [0.1]"), config_dict=small_config
        )


@pytest.mark.parametrize("via_env", [False, True])
def test_unreachable_cluster_is_a_clear_error(tmp_path, small_config, capsys, monkeypatch, via_env):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    argv = ["--hyper_file", _hyper(tmp_path, "alpha choice [0.1]"), "--dataset=tiny"]
    argv += [f"--{key}={value}" for key, value in small_config.items()]
    if via_env:
        monkeypatch.setenv("RAY_ADDRESS", address)
    else:
        argv.append(f"--ray_address={address}")
    assert main(argv) == 2
    assert f"cannot reach the Ray cluster at {address}" in capsys.readouterr().err


def test_a_cluster_with_token_authentication_says_what_to_set(tmp_path, small_config, capsys):
    # A real head node with RAY_AUTH_MODE=token (Ray >= 2.52); this process has no token.
    import shutil
    import subprocess
    import tempfile
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray_command = os.path.join(os.path.dirname(sys.executable), "ray")
    # Its own short temp dir (Ray's socket paths are limited to ~100 characters): the
    # head's address file must not become the default cluster of later local ray.init().
    temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    head = subprocess.Popen(
        [ray_command if os.path.exists(ray_command) else shutil.which("ray"), "start", "--head",
         f"--port={port}", "--num-cpus=1", "--include-dashboard=false", "--block",
         "--disable-usage-stats", f"--temp-dir={temp_dir}"],
        env=dict(os.environ, RAY_AUTH_MODE="token"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        argv = ["--hyper_file", _hyper(tmp_path, "alpha choice [0.1]"), "--dataset=tiny"]
        argv += [f"--{key}={value}" for key, value in small_config.items()]
        argv.append(f"--ray_address=127.0.0.1:{port}")
        # A fresh process: Ray keeps per-process state from earlier tests' local instances.
        done = subprocess.run(
            [sys.executable, "-m", "recbole_freq", *argv],
            capture_output=True, text=True, timeout=300, cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
        )  # fmt: skip
        assert done.returncode == 2, done.stdout[-500:] + done.stderr[-500:]
        err = done.stderr
        assert f"the Ray cluster at 127.0.0.1:{port} uses token authentication" in err
        # Ray's C++ client logs its own warning first; the plugin's one line ends the output.
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: the Ray cluster at") and "set RAY_AUTH_MODE=token" in last
    finally:
        os.killpg(head.pid, 15)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a loaded machine: Ray's head stops slowly
            os.killpg(head.pid, 9)
            head.wait(timeout=60)
        shutil.rmtree(temp_dir, ignore_errors=True)
    # A local Ray still starts afterwards (nothing of the head was left as the default).
    local = subprocess.run(
        [sys.executable, "-c", "import ray; ray.init(num_cpus=1, include_dashboard=False); "
         "print(ray.cluster_resources()['CPU']); ray.shutdown()"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert local.returncode == 0 and local.stdout.strip().endswith("1.0"), local.stderr[-500:]


def test_a_search_starts_its_own_ray_whatever_cluster_the_temp_folder_names(tmp_path):
    # Ray's temp folder is shared (/tmp/ray, writable by every user): an address file
    # planted there named a dead cluster, and plain ray.init() hung trying to join it
    # (or, with another user's head running there, ran the trials on it).
    import subprocess
    import tempfile

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths are short
    os.makedirs(os.path.join(temp_dir, "ray"))
    with open(os.path.join(temp_dir, "ray", "ray_current_cluster"), "w") as planted:
        planted.write(dead)
    script = (
        "import ray\n"
        "from recbole_freq.jobs.ray_cluster import start_or_join\n"
        "assert start_or_join(ray, num_cpus=1)\n"
        "print('joined', ray.get_runtime_context().gcs_address)\n"
        "ray.shutdown()\n"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=150,
            env=dict(environment, RAY_TMPDIR=temp_dir),
        )  # fmt: skip
    finally:
        import shutil

        shutil.rmtree(temp_dir, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-800:]
    joined = done.stdout.split("joined ")[-1].strip()
    assert joined and joined != dead


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for the searches of this module (starting Ray takes seconds)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def run_as_a_trial(model, dataset, config_dict) -> dict:
    """``run`` with one torch thread, as Ray runs a one-CPU trial: the same settings then
    give the same floats (two threads sum in another order and drift apart by 1e-4 in
    NDCG over 30 epochs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(model, dataset, config_dict=config_dict)  # tested on its best epoch
    finally:
        torch.set_num_threads(threads)


def test_two_trial_search_writes_ranked_trials_and_a_trainable_best_yaml(
    ray_session, tiny_data, tmp_path, capsys
):
    hyper = _hyper(tmp_path, "# two BSARec trials\nalpha choice [0.3,0.7]\n")
    # Relative paths: trials run in Ray's own working directories, so they must be
    # made absolute for the trials.
    settings = dict(SMALL_MODEL, epochs=2, data_path=os.path.relpath(tiny_data, tmp_path))
    settings.update(checkpoint_dir="saved", log_wandb=False)
    # RecBole's run_hyper.py flags: --params_file names the space, --output_file the report.
    argv = ["--model=BSARec", "--dataset=tiny", "--params_file", hyper, "--num_cpus=2"]
    argv += ["--output_file", str(tmp_path / "hyper_result.txt")]
    # ASHA after one validation round; trials one after the other, so that the second
    # (alpha 0.7, worse after epoch 0 with these seeds) meets the first's rung result.
    argv += ["--storage_path=results", "--name=search", "--verbose=0", "--grace_period=1"]
    argv += ["--max_concurrent=1"]
    argv += [f"--{key}={value}" for key, value in settings.items()]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| rank | trial | alpha | valid NDCG@20 (best) |" in printed
    report = (tmp_path / "hyper_result.txt").read_text()
    assert report.startswith("| rank | trial |") and printed.endswith(report)  # after Ray's

    experiment = tmp_path / "results" / "search"
    with open(experiment / "trials.csv") as handle:
        import csv

        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 and {float(r["alpha"]) for r in rows} == {0.3, 0.7}
    assert [r["rank"] for r in rows] == ["1", "2"]
    first, second = rows
    assert first["status"] == "completed" and first["device"] == "cpu"
    assert first["alpha"] == "0.3" and first["epochs_run"] == "2"
    assert 0 <= float(first["test_ndcg@20"]) <= 1
    assert float(first["best_valid"]) == float(first["valid_ndcg@20"])
    # ASHA stopped the second trial on its validation score after epoch 0; it is tested
    # afterwards from its checkpoint's best weights, as a one-epoch run of it would be.
    assert second["status"] == "stopped early (ASHA)" and second["epochs_run"] == "1"
    assert float(second["best_valid"]) < float(first["best_valid"])
    stopped = run_as_a_trial(
        "BSARec",
        "tiny",
        config_dict={**settings, "alpha": 0.7, "epochs": 1, "data_path": str(tiny_data)},
    )
    assert float(second["test_ndcg@20"]) == stopped["test_result"]["ndcg@20"]
    assert second["protocol"] == "recbole"
    # The relative checkpoint_dir was resolved against the launch directory.
    assert first["checkpoint"].startswith(str(tmp_path / "saved" / "BSARec-tiny-"))
    assert os.path.isfile(first["checkpoint"])
    checkpoints = sorted((tmp_path / "saved").glob("BSARec-tiny-*.pth"))

    # Validation was reported after each epoch, the test only once, at the end.
    trial_dir = rows[0]["trial_dir"]
    with open(os.path.join(trial_dir, "result.json")) as handle:
        reports = [json.loads(line) for line in handle]
    assert [r.get("epoch") for r in reports[:-1]] == [0, 1]
    assert not any("test_ndcg@20" in r for r in reports[:-1])
    final = reports[-1]
    assert final["final"] and final["shared_dataset"] and "test_ndcg@20" in final
    assert final["valid_score"] == max(r["valid_score"] for r in reports[:-1])

    best_yaml = experiment / "best.yaml"
    text = best_yaml.read_text()
    assert text.startswith("# Best of 2 trials: BSARec on tiny")
    assert f"trial {rows[0]['trial_id']}: best validation NDCG@20" in text
    best = yaml.safe_load(text)
    assert best["alpha"] == float(rows[0]["alpha"])
    assert best["epochs"] == 2 and os.path.isabs(best["data_path"])
    assert "| 2 | " in (experiment / "trials.md").read_text()
    # Every search result says its protocol.
    assert "# protocol: recbole (docs/protocols.md)" in text
    # From the API (no command ran) the hint names the command that always works.
    assert "# train it: python -m recbole_freq --model=BSARec " in text
    assert rows[0]["protocol"] == "recbole"
    assert "Protocol: recbole" in (experiment / "trials.md").read_text()

    # The best configuration trains as a plain config file.
    summary = run(
        "BSARec",
        "tiny",
        config_files=[str(best_yaml)],
        config_dict={"epochs": 1, "checkpoint_dir": str(tmp_path / "retrain")},
    )
    assert summary["config"]["alpha"] == best["alpha"]
    assert summary["epochs_run"] == 1 and summary["test_result"]["ndcg@20"] >= 0

    # The same name again is refused; --resume of the finished search reruns nothing.
    assert main(argv) == 2
    assert "--resume" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 0
    assert sorted((tmp_path / "saved").glob("BSARec-tiny-*.pth")) == checkpoints
    assert main([a.replace("--epochs=2", "--epochs=3") for a in argv] + ["--resume"]) == 2
    assert "changed: overrides" in capsys.readouterr().err


def _trials_csv(folder) -> dict[float, dict]:
    import csv

    with open(folder / "trials.csv") as handle:
        return {float(row["alpha"]): row for row in csv.DictReader(handle)}


def _result_reports(row) -> list[dict]:
    with open(os.path.join(row["trial_dir"], "result.json")) as handle:
        return [json.loads(line) for line in handle]


def test_a_trial_store_replays_finished_trials_and_continues_stopped_ones(
    ray_session, tiny_data, tmp_path, capsys
):
    """A new search (another machine or session: no Ray state) with the same settings
    and --trial_store replays what the store holds: finished trials without training,
    the trial ASHA stopped stopped again by the same reports, and, without ASHA, that
    trial trained on from its stored state to the numbers of a run trained straight."""
    hyper = _hyper(tmp_path, "alpha choice [0.3,0.7]\n")
    settings = dict(SMALL_MODEL, epochs=3, data_path=str(tiny_data), log_wandb=False)
    settings.update(checkpoint_dir=str(tmp_path / "saved"))
    store = tmp_path / "store"
    argv = ["--model=BSARec", "--dataset=tiny", "--hyper_file", hyper, "--num_cpus=2"]
    argv += ["--storage_path=results", "--verbose=0", "--grace_period=1", "--max_concurrent=1"]
    argv += [f"--trial_store={store}"]
    argv += [f"--{key}={value}" for key, value in settings.items()]

    def checkpoints():
        return sorted((tmp_path / "saved").glob("BSARec-tiny-*.pth"))

    assert main([*argv, "--name=first"]) == 0
    first = _trials_csv(tmp_path / "results" / "first")
    # As in the two-trial search: ASHA stopped alpha 0.7 after its first epoch.
    assert first[0.3]["status"] == "completed"
    assert first[0.7]["status"] == "stopped early (ASHA)" and first[0.7]["epochs_run"] == "1"
    records = sorted(store.glob("*.trial.json"))
    assert len(records) == 2 and len(list(store.glob("*.resume.pth"))) == 1
    trained = checkpoints()

    # The same search from the store alone: the same table, nothing trained.
    assert main([*argv, "--name=replayed"]) == 0
    replayed = _trials_csv(tmp_path / "results" / "replayed")
    measured = ("status", "best_valid", "best_epoch", "epochs_run", "test_ndcg@20", "test_hit@10")
    for alpha in (0.3, 0.7):
        assert [replayed[alpha][k] for k in measured] == [first[alpha][k] for k in measured]
    assert checkpoints() == trained
    assert all(r.get("replayed") for r in _result_reports(replayed[0.3]))

    # Without ASHA the stopped trial goes on from its stored state (epoch 1).
    assert main([*argv, "--name=continued", "--scheduler=none"]) == 0
    continued = _trials_csv(tmp_path / "results" / "continued")
    assert continued[0.7]["status"] == "completed" and continued[0.7]["epochs_run"] == "3"
    reports = _result_reports(continued[0.7])
    assert [(r["epoch"], bool(r.get("replayed"))) for r in reports[:-1]] == [
        (0, True), (1, False), (2, False),
    ]  # fmt: skip
    straight = run_as_a_trial("BSARec", "tiny", config_dict={**settings, "alpha": 0.7})
    assert float(continued[0.7]["test_ndcg@20"]) == straight["test_result"]["ndcg@20"]
    assert int(continued[0.7]["best_epoch"]) == straight["best_epoch"]
    assert len(list(store.glob("*.resume.pth"))) == 0  # both finished
    (record,) = [
        loaded
        for loaded in (json.loads(path.read_text()) for path in records)
        if loaded["params"] == {"alpha": 0.7}
    ]
    assert [r["epoch"] for r in record["reports"]] == [0, 1, 2] and record["final"]
    # Two segments: epoch 0 in the first search, 1-2 in the continued one.
    assert [g["first_epoch"] for g in record["segments"]] == [0, 1]
    assert {g["device"] for g in record["segments"]} == {"cpu"}

    # Other settings with the same store: each trial refuses its record, in one line.
    changed = [a.replace("--epochs=3", "--epochs=4") for a in argv]
    assert main([*changed, "--name=changed"]) == 1
    capsys.readouterr()
    errors = [row["error"] for row in _trials_csv(tmp_path / "results" / "changed").values()]
    assert all("written with other settings (epochs: '3' then, '4' now)" in e for e in errors)


def test_tuning_a_dataset_key_loads_the_data_in_each_trial(ray_session, small_config, tmp_path):
    hyper = _hyper(tmp_path, "MAX_ITEM_LIST_LENGTH choice [8]\n")
    summary = tune_model(
        "BSARec",
        "tiny",
        hyper,
        config_dict={k: v for k, v in small_config.items() if k != "MAX_ITEM_LIST_LENGTH"}
        | {"epochs": 1},
        storage_path=tmp_path / "results",
        options=SearchOptions(scheduler="none"),
        verbose=0,
    )
    assert not summary["shared_dataset"]
    (row,) = summary["trials"]
    assert row["status"] == "completed" and row["MAX_ITEM_LIST_LENGTH"] == 8
    assert yaml.safe_load(open(summary["best_yaml"]))["MAX_ITEM_LIST_LENGTH"] == 8


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_ctrl_c_in_a_search_keeps_finished_trials_and_names_the_resume_command(
    ray_session, tiny_data, tmp_path, capsys, sig, code
):
    """Ctrl-C, and SIGTERM handled as Ctrl-C (Ray's own handler aborted the driver)."""
    import signal

    hyper = _hyper(tmp_path, "alpha choice [0.1,0.5,0.9]\n")
    settings = dict(SMALL_MODEL, epochs=2, data_path=str(tiny_data), checkpoint_dir="saved")
    # RecBole's run_hyper.py flags: --params_file names the space, --output_file the report.
    argv = ["--model=BSARec", "--dataset=tiny", "--params_file", hyper, "--num_cpus=2"]
    argv += ["--output_file", str(tmp_path / "hyper_result.txt")]
    argv += ["--storage_path=results", "--name=stopped", "--verbose=0", "--max_concurrent=1"]
    argv += ["--scheduler=none", "--search=grid"]
    argv += [f"--{key}={value}" for key, value in settings.items()]
    experiment = tmp_path / "results" / "stopped"

    def first_trial_finished():
        return any('"final": true' in p.read_text() for p in experiment.glob("*/result.json"))

    returned = main_with_ctrl_c_once(argv, first_trial_finished, getattr(signal, sig))
    err = capsys.readouterr().err
    assert returned == code, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("interrupted: the search stopped")
    assert "Tuner.restore" not in err
    assert line.endswith("--resume --name stopped")
    assert main([*argv, "--resume"]) == 0
    with open(experiment / "trials.csv") as handle:
        import csv

        rows = list(csv.DictReader(handle))
    assert sorted(float(r["alpha"]) for r in rows) == [0.1, 0.5, 0.9]
    assert all(r["status"] == "completed" for r in rows)


def test_a_resumed_search_continues_an_interrupted_trial_from_its_checkpoint(
    ray_session, tiny_data, tmp_path, capsys
):
    """Ctrl-C in the middle of a trial, then --resume: the trial continues from its last
    Ray checkpoint (no epoch reported twice) and ends as an uninterrupted run would."""
    hyper = _hyper(tmp_path, "alpha choice [0.5]\n")
    settings = dict(SMALL_MODEL, epochs=30, stopping_step=30, data_path=str(tiny_data))
    settings.update(checkpoint_dir=str(tmp_path / "saved"))
    argv = ["--model=BSARec", "--dataset=tiny", "--hyper_file", hyper, "--num_cpus=2"]
    argv += ["--storage_path=results", "--name=paused", "--verbose=0", "--scheduler=none"]
    argv += [f"--{key}={value}" for key, value in settings.items()]
    experiment = tmp_path / "results" / "paused"

    def first_checkpoint_reported():
        # Ray writes the checkpoint folder first, then the report that registers it.
        return any(p.stat().st_size for p in experiment.glob("*/result.json"))

    code = main_with_ctrl_c_once(argv, first_checkpoint_reported)
    assert code == 130, capsys.readouterr().err
    (result_file,) = experiment.glob("*/result.json")
    before = [json.loads(line) for line in result_file.read_text().splitlines()]
    assert before and not any(r.get("final") for r in before)

    assert main([*argv, "--resume"]) == 0
    reports = [json.loads(line) for line in result_file.read_text().splitlines()]
    assert reports[: len(before)] == before
    # Continued at the epoch after its last saved checkpoint (an epoch reported after it
    # is trained again), not from epoch 0.
    after = [r["epoch"] for r in reports[len(before) :] if not r.get("final")]
    assert 1 <= after[0] <= before[-1]["epoch"] + 1
    assert after == list(range(after[0], after[0] + len(after)))
    final = reports[-1]
    assert final["final"] and final["epochs_run"] == after[-1] + 1
    uninterrupted = run_as_a_trial("BSARec", "tiny", config_dict={**settings, "alpha": 0.5})
    assert final["test_ndcg@20"] == uninterrupted["test_result"]["ndcg@20"]
    assert final["best_epoch"] == uninterrupted["best_epoch"]


def test_resume_refuses_a_search_folder_others_could_have_written(tmp_path, small_config):
    import pickle

    from recbole_freq.jobs.tune.search import SPEC_FILE

    folder = tmp_path / "results" / "planted"
    folder.mkdir(parents=True)
    (folder / SPEC_FILE).write_text("{}")
    planted = folder / "tuner.pkl"
    planted.write_bytes(pickle.dumps(0))

    def resume():
        tune_model(
            "BSARec",
            "tiny",
            _hyper(tmp_path, "alpha choice [0.1,0.3]"),
            config_dict=small_config,
            storage_path=tmp_path / "results",
            name="planted",
            resume=True,
        )

    with pytest.raises(TuneSetupError, match="settings of the interrupted search"):
        resume()  # a folder of one's own gets as far as comparing the settings
    planted.chmod(0o666)
    with pytest.raises(TuneSetupError, match=r"tuner.pkl is writable by others \(mode 666\)"):
        resume()
    planted.chmod(0o644)
    (tmp_path / "results").chmod(0o777)
    with pytest.raises(TuneSetupError, match="lets anyone replace the folder"):
        resume()
    (tmp_path / "results").chmod(0o755)
    if os.geteuid() == 0:  # only root can give a file away
        os.chown(planted, 12345, 12345)
        with pytest.raises(TuneSetupError, match=r"tuner.pkl belongs to uid 12345, not to you"):
            resume()


def test_an_output_file_that_is_a_folder_is_refused_before_the_search(
    tmp_path, small_config, capsys
):
    folder = tmp_path / "report"
    folder.mkdir()
    args = [f"--{key}={value}" for key, value in small_config.items()]
    argv = [
        "--model=BSARec",
        "--dataset=tiny",
        "--params_file",
        _hyper(tmp_path, "alpha choice [0.1]"),
    ]
    code = main([*argv, "--output_file", str(folder), "--storage_path", str(tmp_path / "r"), *args])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--output_file {folder} is a folder" in err
    assert not (tmp_path / "r").exists()  # no search started


def test_failed_trials_and_broken_search_folders_are_one_line(
    ray_session, tiny_data, tmp_path, capsys
):
    from recbole_freq.jobs.tune.search import SPEC_FILE

    # A trial that fails inside Ray (SASRec refuses 15 = hidden_size over 2 heads): Ray's
    # traceback was printed before the plugin's line; it is kept in the search's ray.log.
    hyper = _hyper(tmp_path, "hidden_size choice [15]\n")
    settings = dict(SMALL_MODEL, epochs=1, data_path=str(tiny_data), checkpoint_dir="saved")
    del settings["hidden_size"]
    argv = ["--model=SASRec", "--dataset=tiny", "--hyper_file", hyper, "--verbose=0"]
    argv += ["--storage_path=results", "--name=failing", "--scheduler=none"]
    argv += [f"--{key}={value}" for key, value in settings.items()]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    assert "all 1 trials failed" in err and "(Ray's log: ray.log)" in err
    experiment = tmp_path / "results" / "failing"
    assert "Traceback" in (experiment / "ray.log").read_text()
    # Ray's experiment state gone: --resume ran every trial again as a new search.
    for state in experiment.glob("experiment_state-*.json"):
        state.unlink()
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "holds no Ray experiment state" in err and err.count("\n") == 1
    # The search's own settings file edited into a list: an AttributeError before.
    (experiment / SPEC_FILE).write_text("[1, 2]")
    assert main([*argv, "--resume"]) == 2
    assert "is not the settings file a search writes" in capsys.readouterr().err


def test_status_lines_say_what_happened_to_each_trial():
    from types import SimpleNamespace

    import pandas as pd

    from recbole_freq.jobs.tune.report import finished_trials, rank_trials

    # After Ctrl-C Ray marks the trial it interrupted TERMINATED (and --resume continues
    # it): it was counted as finished.
    trials = [
        SimpleNamespace(status="TERMINATED", last_result={"final": True}),
        SimpleNamespace(status="TERMINATED", last_result={"epoch": 3}),
        SimpleNamespace(status="ERROR", last_result={}),
    ]
    assert finished_trials(SimpleNamespace(_experiment_analysis=SimpleNamespace(trials=trials))) == (2, 3)  # fmt: skip

    # ASHA may stop a trial at its last validation round: it ran every epoch of its budget
    # and was labelled "stopped early (ASHA)".
    def stopped_after(epochs, tuned=None):
        history = pd.DataFrame({"epoch": list(range(epochs)), "valid_score": [0.1] * epochs})
        return SimpleNamespace(
            metrics={"trial_id": f"t{epochs}"}, metrics_dataframe=history, error=None,
            config=tuned or {}, path=f"/t{epochs}", checkpoint=None,
        )  # fmt: skip

    rows = rank_trials([stopped_after(4), stopped_after(2)], [], "max", epochs=4)
    status = {row["trial_id"]: row["status"] for row in rows}
    assert status == {
        "t4": "ran its budget (ASHA stopped it before its test)",
        "t2": "stopped early (ASHA)",
    }
    (row,) = rank_trials([stopped_after(2, {"epochs": 2})], ["epochs"], "max", epochs=4)
    assert row["status"].startswith("ran its budget")


@pytest.mark.parametrize("paper", [False, True])
def test_best_yamls_train_it_line_keeps_the_searchs_paper_settings(tmp_path, paper):
    """Issue 69: a search run with --paper wrote a "train it" line without --paper, which
    trained under the recbole protocol and seed 2020 (NDCG@20 0.0187 against the
    trial's 0.0281)."""
    from recbole_freq.jobs.tune.report import write_outputs

    row = {"rank": 1, "trial_id": "t1", "status": "completed", "alpha": 0.5,
           "best_valid": 0.3, "best_epoch": 4, "test_ndcg@20": 0.28, "protocol": "bsarec"}  # fmt: skip
    summary = {"model": "BSARec", "dataset": "lastfm", "metric": "NDCG@20", "mode": "max",
               "trials": [row]}  # fmt: skip
    job = {"config_files": [], "overrides": {}, "paper": paper}
    write_outputs(summary, tmp_path, ["alpha"], job, {}, {})
    line = next(x for x in (tmp_path / "best.yaml").read_text().splitlines() if "train it" in x)
    assert ("--dataset=lastfm --paper --config_files" in line) == paper


@pytest.mark.parametrize(
    "hyper", sorted(p.name for p in (properties_dir() / "hyper").glob("*.hyper"))
)
def test_every_shipped_search_space_is_one_its_model_accepts(tiny_data, hyper):
    """Each ``properties/hyper/<Model>.hyper`` names only config keys of its model, with
    values a run of it accepts (the checks a search makes before starting Ray)."""
    from recbole_freq.jobs.tune.search import _validate_space

    space = parse_hyper_file(properties_dir() / "hyper" / hyper)
    model = hyper.removesuffix(".hyper")
    config = FreqConfig(model, "tiny", config_dict={"data_path": str(tiny_data)})
    _validate_space(space, config, {})
