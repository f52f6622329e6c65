"""Nothing silently different: every setting a user gives is read by something, has the
right type, and every config file is read safely or refused in one line."""

import re
from pathlib import Path

import pytest

from conftest import SMALL_MODEL
from recbole_freq.cli import main
from recbole_freq.config.configurator import (
    ConfigFileError,
    FreqConfig,
    properties_dir,
    read_config_file,
)
from recbole_freq.config.settings import (
    UnknownSettingError,
    common_keys,
    keys_by_model,
    model_keys,
    setting_types,
)


def cli(config: dict) -> list[str]:
    return [f"--{key}={value}" for key, value in config.items()]


def run_main(small_config, *args, model="BSARec", dataset="tiny"):
    return main([f"--model={model}", f"--dataset={dataset}", *cli(small_config), *args])


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


MISSPELLED = [
    ("--epoch=3", "unknown setting --epoch (command line)", "did you mean --epochs?"),
    ("--hiden_size=64", "unknown setting --hiden_size", "did you mean --hidden_size?"),
    ("--learning-rate=0.01", "unknown setting --learning-rate", "did you mean --learning_rate?"),
    ("--Epochs=3", "unknown setting --Epochs", "did you mean --epochs?"),
]


@pytest.mark.parametrize("arg,message,hint", MISSPELLED, ids=[m[0] for m in MISSPELLED])
def test_misspelled_settings_on_the_command_line_are_refused(
    small_config, capsys, arg, message, hint
):
    assert run_main(small_config, arg) == 2
    err = one_error_line(capsys)
    assert message in err and hint in err and "accept_unknown_keys" in err
    assert not Path(small_config["checkpoint_dir"]).exists()  # refused before training


def test_a_setting_of_another_model_is_refused(small_config, capsys):
    assert run_main(small_config, "--alpha=0.5", model="SASRec") == 2
    err = one_error_line(capsys)
    assert "--alpha (command line) is not a setting of SASRec" in err and "BSARec" in err


def test_misspelled_settings_in_yaml_name_the_file(small_config, tmp_path, capsys):
    config_file = tmp_path / "mine.yaml"
    config_file.write_text("learning_rate: 0.01\nhiden_size: 64\n")
    assert run_main(small_config, "--config_files", str(config_file)) == 2
    err = one_error_line(capsys)
    assert f"unknown setting hiden_size (config file {config_file})" in err
    assert "did you mean hidden_size?" in err


def test_misspelled_settings_of_a_comparison_fail_before_training(small_config, tmp_path, capsys):
    shared = {k: v for k, v in small_config.items() if k != "seed"}
    args = ["--compare", "SASRec,GRU4Rec", "--dataset=tiny", "--seeds", "1"]
    assert main([*args, "--out", str(tmp_path / "c"), *cli(shared), "--epoch=1"]) == 2
    assert "did you mean --epochs?" in one_error_line(capsys)
    assert not (tmp_path / "c" / "runs").exists()


def test_a_comparison_accepts_a_setting_that_one_of_its_models_reads(tiny_data):
    # inner_size is read by SASRec, not GRU4Rec: one set of overrides serves both.
    overrides = {"inner_size": "32", "data_path": str(tiny_data)}
    with pytest.raises(UnknownSettingError, match="not a setting of GRU4Rec"):
        FreqConfig("GRU4Rec", "tiny", cmd_overrides=overrides)
    config = FreqConfig("GRU4Rec", "tiny", cmd_overrides=overrides, shared_with=["SASRec"])
    assert config["inner_size"] == 32


def test_a_search_with_a_misspelled_fixed_setting_fails_before_ray(small_config, tmp_path, capsys):
    hyper = tmp_path / "space.hyper"
    hyper.write_text("alpha choice [0.1,0.9]\n")
    args = ["--hyper_file", str(hyper), "--model=BSARec", "--dataset=tiny"]
    assert (
        main([*args, "--storage_path", str(tmp_path / "ray"), *cli(small_config), "--epoch=1"]) == 2
    )
    assert "did you mean --epochs?" in one_error_line(capsys)


def test_users_own_keys_pass_through_the_escape_hatch(tiny_data, tmp_path):
    overrides = {"data_path": str(tiny_data), "my_experiment_tag": "'run-7'"}
    with pytest.raises(UnknownSettingError, match="my_experiment_tag"):
        FreqConfig("BSARec", "tiny", cmd_overrides=overrides)
    config_file = tmp_path / "mine.yaml"
    config_file.write_text("accept_unknown_keys: [my_experiment_tag]\n")
    config = FreqConfig("BSARec", "tiny", [str(config_file)], cmd_overrides=overrides)
    assert config["my_experiment_tag"] == "run-7"


WRONG_TYPES = [
    ("--epochs=1.5", "--epochs (command line) must be an integer, got 1.5"),
    ("--epochs=abc", "--epochs (command line) must be an integer, got 'abc'"),
    ("--alpha=abc", "--alpha (command line) must be a number, got 'abc'"),
    ("--n_heads=2.0", "--n_heads (command line) must be an integer, got 2.0"),
    ("--learning_rate=nan", "--learning_rate (command line) must be a number, got 'nan'"),
    ("--hidden_dropout_prob=inf", "--hidden_dropout_prob (command line) must be a number"),
    ("--show_progress=3", "--show_progress (command line) must be True or False, got 3"),
]


@pytest.mark.parametrize("arg,message", WRONG_TYPES, ids=[m[0] for m in WRONG_TYPES])
def test_values_of_the_wrong_type_name_the_key_and_the_type(small_config, capsys, arg, message):
    key = arg[2:].split("=")[0]
    base = {k: v for k, v in small_config.items() if k != key}
    assert run_main(base, arg) == 2
    assert message in one_error_line(capsys)


def test_non_finite_numbers_in_yaml_are_refused(small_config, tmp_path, capsys):
    config_file = tmp_path / "nan.yaml"
    config_file.write_text("learning_rate: .nan\n")
    assert run_main(small_config, "--config_files", str(config_file)) == 2
    assert "learning_rate (config file" in (err := one_error_line(capsys))
    assert "must be a finite number, got nan" in err


def test_real_valued_settings_take_integers_and_floats(tiny_data):
    config = FreqConfig(
        "BSARec",
        "tiny",
        cmd_overrides={"data_path": str(tiny_data), "learning_rate": "1", "alpha": "1e-1"},
    )
    assert config["learning_rate"] == 1 and config["alpha"] == pytest.approx(0.1)


BAD_FILES = [
    ("broken.yaml", "epochs: [1, 2\n", "line 2"),
    ("list.yaml", "- epochs: 3\n- alpha: 0.5\n", "holds a list, not a mapping of settings"),
    ("scalar.yaml", "just words\n", "holds a str, not a mapping of settings"),
    ("tabs.yaml", "epochs:\t3\n\t- x\n", "config file"),
]


@pytest.mark.parametrize("name,text,message", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_unreadable_config_files_are_one_line(small_config, tmp_path, capsys, name, text, message):
    config_file = tmp_path / name
    config_file.write_text(text)
    assert run_main(small_config, "--config_files", str(config_file)) == 2
    err = one_error_line(capsys)
    assert f"config file {config_file}" in err and message in err
    shared = {k: v for k, v in small_config.items() if k != "seed"}
    compare = ["--compare", "SASRec", "--dataset=tiny", "--seeds", "1"]
    assert (
        main(
            [
                *compare,
                "--out",
                str(tmp_path / "c"),
                "--config_files",
                str(config_file),
                *cli(shared),
            ]
        )
        == 2
    )
    assert f"config file {config_file}" in one_error_line(capsys)


def test_a_python_tag_in_a_config_file_runs_nothing(small_config, tmp_path, capsys):
    marker = tmp_path / "PAYLOAD_RAN"
    config_file = tmp_path / "evil.yaml"
    config_file.write_text(f'epochs: !!python/object/apply:os.system ["touch {marker}"]\n')
    named = tmp_path / "named.yaml"
    named.write_text("learner: !!python/name:os.system\n")
    for path in (config_file, named):
        assert run_main(small_config, "--config_files", str(path)) == 2
        assert "Python tags (!!python/...) are not allowed" in one_error_line(capsys)
    assert not marker.exists()


def test_model_and_dataset_keys_in_a_config_file_must_agree(small_config, tmp_path, capsys):
    config_file = tmp_path / "model.yaml"
    config_file.write_text("model: SASRec\n")
    assert run_main(small_config, "--config_files", str(config_file)) == 2
    err = one_error_line(capsys)
    assert "sets model: SASRec but this run's model is BSARec" in err
    config_file.write_text("model: BSARec\ndataset: tiny\n")
    config = FreqConfig("BSARec", "tiny", [str(config_file)], config_dict=small_config)
    assert config["model"] == "BSARec"


def test_config_file_errors_are_config_file_errors(tmp_path):
    config_file = tmp_path / "list.yaml"
    config_file.write_text("- a\n")
    with pytest.raises(ConfigFileError):
        FreqConfig("BSARec", "tiny", [str(config_file)])


# --- the derivation itself --------------------------------------------------------


def test_every_key_of_the_property_files_is_known():
    for path in sorted(properties_dir().rglob("*.yaml")):
        import yaml

        keys = set(yaml.safe_load(path.read_text()) or {})
        owner = path.stem if path.parent.name == "model" else None
        known = common_keys() | (keys_by_model().get(owner, frozenset()) if owner else set())
        if path.parent.parent.name == "paper":
            known |= keys_by_model()[path.parent.name]
        if path.parent.parent.name == "variant":
            # a variant may set only what its model reads (its model file or its code)
            from recbole_freq.config.configurator import get_model_class
            from recbole_freq.config.settings import _keys_in_source

            model_file = properties_dir() / "model" / f"{path.parent.name}.yaml"
            known |= set(yaml.safe_load(model_file.read_text()) or {})
            known |= _keys_in_source(get_model_class(path.parent.name))
        assert keys <= known, (path, keys - known)


def test_keys_a_recbole_model_reads_only_in_its_code_are_known():
    from recbole_freq.config.configurator import get_model_class

    # FEARec reads these in its source; its property file does not list them.
    assert {"contrast", "sim", "tau"} <= model_keys(get_model_class("FEARec"))
    assert "alpha" in model_keys(get_model_class("BSARec"))
    assert "cl_temperature" in model_keys(get_model_class("PolyRec"))
    assert "alpha" not in model_keys(get_model_class("SASRec"))


def test_types_come_from_the_defaults():
    types = setting_types()
    assert types["epochs"] == "integer" and types["learning_rate"] == "number"
    assert types["reproducibility"] == "boolean" and "gpu_id" not in types
    # Real-valued wherever any default is a float, even if another default is 0.
    assert types["hidden_dropout_prob"] == "number"
    assert set(SMALL_MODEL) <= common_keys() | model_keys(
        __import__("recbole_freq").MODELS["BSARec"]
    )


# --- runs that would not train or validate ----------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        (["--epochs=-1"], "epochs=-1: a run needs at least 1 training epoch"),
        (["--epochs=0"], "epochs=0: a run needs at least 1 training epoch"),
        (["--epochs=2", "--eval_step=3"], "eval_step=3 with epochs=2 never validates"),
    ],
)
def test_runs_that_would_not_train_or_validate_are_refused(small_config, capsys, args, message):
    base = {k: v for k, v in small_config.items() if k != "epochs"}
    assert run_main(base, *args) == 2
    assert message in one_error_line(capsys)
    assert not Path(small_config["checkpoint_dir"]).exists()


def prepared(tmp_path, name, lengths):
    from dataset_prep import convert_one_line

    lines = [
        " ".join(str(v) for v in [user, *[(user + i) % 20 + 1 for i in range(length)]])
        for user, length in enumerate(lengths, 1)
    ]
    raw = tmp_path / f"{name}.txt"
    raw.write_text("\n".join(lines) + "\n")
    convert_one_line(raw, tmp_path / "data", name, show_progress=False)
    return str(tmp_path / "data")


def test_a_dataset_without_validation_rows_is_refused(small_config, tmp_path, capsys):
    data_path = prepared(tmp_path, "short", [2] * 30)
    config = dict(small_config, data_path=data_path)
    assert main(["--model=SASRec", "--dataset=short", *cli(config)]) == 2
    assert "dataset 'short' has no validation rows" in one_error_line(capsys)
    assert not list(Path(small_config["checkpoint_dir"]).glob("*"))


def test_users_too_short_for_validation_are_counted(small_config, tmp_path, caplog):
    from recbole_freq.quick_start.quick_start import run

    data_path = prepared(tmp_path, "mixed", [2] * 10 + [6] * 20)
    config = dict(small_config, data_path=data_path, epochs=1, MAX_ITEM_LIST_LENGTH=5)
    summary = run("SASRec", "mixed", config_dict=config)
    assert summary["best_epoch"] == 0
    assert "10 of 30 users have no validation row" in caplog.text


# --- bad settings that used to end in a traceback --------------------------------

BAD_SETTINGS = [
    ("BSARec", "--hidden_size=0", "--hidden_size (command line) must be >= 1, got 0"),
    ("BSARec", "--MAX_ITEM_LIST_LENGTH=0", "--MAX_ITEM_LIST_LENGTH (command line) must be >= 1"),
    ("BSARec", "--MAX_ITEM_LIST_LENGTH=-3", "must be >= 1, got -3"),
    ("BSARec", "--hidden_dropout_prob=1.0", "--hidden_dropout_prob (command line) must be < 1"),
    ("BSARec", "--learning_rate=0", "--learning_rate (command line) must be > 0"),
    ("PolyRec", "--inner_size=0", "--inner_size (command line) must be >= 1, got 0"),
    ("PolyRec", "--cl_temperature=1e999", "cl_temperature (command line) must be a finite"),
    ("FBSARec", "--fusion_branches=[]", "fusion_branches=[] is invalid for this model"),
    (
        "FBSARec",
        "--fusion_weights=[0,0]",
        "fusion_weights=[0, 0] must be finite numbers, not all 0",
    ),
    ("BSARec", "--valid_metric=MRR@10", "valid_metric=MRR@10 is not computed"),
    ("BSARec", "--valid_metric=NDCG@50", "valid_metric=NDCG@50 is not computed"),
    ("BSARec", "--device=bogus", "device (command line)='bogus' is not a device"),
    ("BSARec", "--topk=[5,50]", "has 40 items, fewer than topk 50"),
    # the plugin models' own ranges, checked when the model is built
    ("BSARec", "--alpha=-0.1", "alpha=-0.1 must lie in [0, 1]"),
    ("PolyRec", "--cl_temperature=0", "cl_temperature=0 must be a number > 0"),
    ("RecDenoiser", "--mask_init_prob=1", "mask_init_prob=1 must lie in (0, 1)"),
    ("RecDenoiser", "--jacobian_projections=0", "jacobian_projections=0 must be an integer >= 1"),
    ("RecDenoiser", "--jacobian_gamma=-1", "jacobian_gamma=-1"),
    ("RecDenoiser", "--sparsity_beta=-1", "sparsity_beta=-1 must be a finite number >= 0"),
    # RecBole's cloze ratios, before any data is read
    ("BERT4RecDenoiser", "--mask_ratio=1.5", "--mask_ratio (command line) must be < 1"),
    ("BERT4RecDenoiser", "--ft_ratio=2", "--ft_ratio (command line) must be <= 1"),
]


@pytest.mark.parametrize("model,arg,message", BAD_SETTINGS, ids=[b[1] for b in BAD_SETTINGS])
def test_bad_settings_are_one_line_before_training(small_config, capsys, model, arg, message):
    key = arg[2:].split("=")[0]
    base = {k: v for k, v in small_config.items() if k != key}
    if key == "topk":
        base["valid_metric"] = "NDCG@5"
    assert run_main(base, arg, model=model) == 2
    assert message in one_error_line(capsys)
    assert not list(Path(small_config["checkpoint_dir"]).glob("*.pth"))


def test_cloze_ratios_are_checked_before_the_data_is_looked_for(small_config, capsys):
    settings = dict(small_config, data_path="/nonexistent")
    assert run_main(settings, "--mask_ratio=0", model="BERT4RecDenoiser") == 2
    assert "--mask_ratio (command line) must be > 0, got 0" in one_error_line(capsys)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_a_cuda_device_without_cuda_is_one_line(small_config, capsys):
    assert run_main(small_config, "--device=cuda") == 2
    assert "torch sees no CUDA device on this machine" in one_error_line(capsys)


def test_wandb_logging_without_wandb_is_one_line(small_config, capsys):
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    base = {k: v for k, v in small_config.items() if k != "log_wandb"}
    assert run_main(base, "--log_wandb=True") == 2
    assert "log_wandb=True needs the wandb package" in one_error_line(capsys)


def test_an_inter_file_without_the_time_column_is_one_line(small_config, tmp_path, capsys):
    folder = tmp_path / "data" / "notime"
    folder.mkdir(parents=True)
    rows = ["user_id:token\titem_id:token"] + [
        f"{u}\t{i}" for u in range(1, 9) for i in range(1, 6)
    ]
    (folder / "notime.inter").write_text("\n".join(rows) + "\n")
    config = dict(small_config, data_path=str(tmp_path / "data"))
    assert main(["--model=SASRec", "--dataset=notime", *cli(config)]) == 2
    err = one_error_line(capsys)
    assert "missing: ['timestamp']" in err and "dataset_prep" in err


def test_names_never_write_outside_their_folder(small_config, tmp_path, capsys):
    assert main(["--model=SASRec", "--dataset=../../escape", *cli(small_config)]) == 2
    assert "dataset name '../../escape' must be a plain name" in one_error_line(capsys)
    hyper = tmp_path / "h.hyper"
    hyper.write_text("learning_rate choice [0.01]\n")
    args = ["--hyper_file", str(hyper), "--model=SASRec", "--dataset=tiny", "--name=../out"]
    assert main([*args, f"--storage_path={tmp_path / 'ray'}", *cli(small_config)]) == 2
    assert "--name '../out' must be a plain name" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_a_users_own_ml_100k_wins_over_recboles_bundled_copy(small_config, tmp_path, capsys):
    from conftest import write_sequences
    from dataset_prep import convert_one_line

    data = tmp_path / "mine"
    convert_one_line(
        write_sequences(tmp_path / "m.txt", n_users=20), data, "ml-100k", show_progress=False
    )
    config = dict(small_config, data_path=str(data), epochs=1)
    assert main(["--model=SASRec", "--dataset=ml-100k", *cli(config)]) == 0
    out = capsys.readouterr().out
    assert f"data: {data / 'ml-100k'}" in out
    summary_file = next(line for line in out.splitlines() if line.startswith("summary:"))
    import json

    summary = json.loads(Path(summary_file.split(None, 1)[1]).read_text())
    assert summary["config"]["data_path"] == str(data / "ml-100k")
    assert summary["parameters"] < 20_000  # 20 users' items, not RecBole's 1,682


@pytest.mark.parametrize("model", ["BPR", "FPMC", "TransRec"])
def test_pairwise_models_get_their_negatives(small_config, model):
    from recbole_freq.quick_start.quick_start import run

    config = {
        k: v
        for k, v in small_config.items()
        if k not in ("hidden_size", "inner_size", "n_heads", "n_layers", "MAX_ITEM_LIST_LENGTH")
    }
    summary = run(model, "tiny", config_dict=dict(config, epochs=1, embedding_size=16))
    assert summary["epochs_run"] == 1 and 0 <= summary["test_result"]["ndcg@10"] <= 1
    assert summary["config"]["train_neg_sample_args"]["sample_num"] == 1


def test_pairwise_loss_without_negatives_is_refused(small_config, tmp_path, capsys):
    config_file = tmp_path / "none.yaml"
    config_file.write_text("loss_type: BPR\ntrain_neg_sample_args: ~\n")
    assert run_main(small_config, "--config_files", str(config_file), model="SASRec") == 2
    assert "trains on (positive, negative) pairs" in one_error_line(capsys)


def test_a_recbole_model_that_cannot_be_built_is_one_line(small_config, capsys):
    transformer = ("n_heads", "n_layers", "inner_size", "hidden_size")
    settings = {k: v for k, v in small_config.items() if k not in transformer}
    assert run_main(dict(settings, short_item_length=99), model="SHAN") == 2
    err = one_error_line(capsys)
    assert err.startswith("error: SHAN cannot be built with these settings: AssertionError")


def test_fearec_with_one_layer_is_one_line(small_config, capsys):
    """RecBole's FEARec divided by n_layers - 1 (ZeroDivisionError); the plugin's says why."""
    assert run_main(dict(small_config, n_layers=1, topk_factor=1), model="FEARec") == 2
    assert one_error_line(capsys).strip() == (
        "error: FEARec's frequency ramp slides over n_layers - 1 steps: n_layers=1 must be "
        "at least 2"
    )


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--metrics=['Foo']", "metrics: 'Foo' is not a RecBole metric (known: "),
        ("--metrics=[]", "metrics=[]: give at least one metric"),
        ("--topk=[]", "topk=[]: give at least one cut-off >= 1"),
        ("--valid_metric=NDCG", "valid_metric=NDCG needs a cut-off: NDCG is computed at topk"),
        ("--eval_args={'mode': 'uni0'}", "every metric would be 1.0; use uni100"),
        ("--eval_args={'mode': 'labeled'}", "'labeled' scores labelled interactions"),
        ("--extra_test_modes=['pop0']", "extra_test_modes entry 'pop0' ranks each target"),
        # tiny has 40 items: uni5000 was accepted, uni99999999 tried to allocate 40 GB.
        ("--eval_args={'mode': 'uni5000'}", "mode 'uni5000' ranks each target against 5,000"),
        ("--extra_test_modes=['uni99999999']", "use uni39 at most, or full"),
        (
            "--learner=bogus",
            "learner='bogus' is not an optimizer RecBole knows (it would train with Adam",
        ),
    ],
)
def test_evaluation_settings_that_cannot_be_computed_are_one_line_before_training(
    small_config, capsys, flag, message
):
    assert run_main(small_config, flag, model="SASRec") == 2
    err = one_error_line(capsys)
    assert message in err, err
    assert not list(Path(small_config["checkpoint_dir"]).glob("*.pth"))  # nothing trained


def test_a_setting_given_twice_in_a_config_file_is_refused(small_config, tmp_path, capsys):
    config_file = tmp_path / "twice.yaml"
    config_file.write_text("epochs: 3\nlearning_rate: 0.01\nepochs: 5\n")
    assert run_main(small_config, "--config_files", str(config_file)) == 2
    err = one_error_line(capsys)
    assert f"config file {config_file}, line 3: 'epochs' is given twice (first on line 1)" in err
    merged = tmp_path / "merged.yaml"  # yaml's merge keys are not duplicates
    merged.write_text("base: &b {alpha: 0.5}\nshared:\n  <<: *b\n  c: 3\n")
    assert read_config_file(merged)["shared"] == {"alpha": 0.5, "c": 3}


def test_a_yaml_alias_bomb_is_one_line(small_config, tmp_path, capsys):
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for previous, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [{','.join([f'*{previous}'] * 9)}]")
    config_file = tmp_path / "bomb.yaml"
    config_file.write_text("\n".join(lines) + "\n")  # 9**9 values once expanded
    assert run_main(small_config, "--config_files", str(config_file)) == 2
    assert "its yaml aliases expand to more than 100,000 values" in one_error_line(capsys)


@pytest.mark.parametrize("timestamp", ["nan", "", "inf", "soon"])
def test_a_timestamp_that_is_not_a_finite_number_is_one_line(
    small_config, tmp_path, capsys, timestamp
):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(Path(small_config["data_path"]) / "tiny", data / "tiny")
    inter = data / "tiny" / "tiny.inter"
    lines = inter.read_text().splitlines()
    user, item, _ = lines[5].split("\t")
    lines[5] = f"{user}\t{item}\t{timestamp}"
    inter.write_text("\n".join(lines) + "\n")
    config = dict(small_config, data_path=str(data))
    assert run_main(config, model="SASRec") == 2
    assert "tiny.inter is not the file tiny.stats.json records" in one_error_line(capsys)
    (data / "tiny" / "tiny.stats.json").unlink()  # edited on purpose: no manifest
    assert run_main(config, model="SASRec") == 2
    err = one_error_line(capsys)
    assert f"tiny.inter, line 6: timestamp {timestamp!r} is not a finite number" in err


def test_a_time_column_typed_as_text_is_refused_not_sorted_as_text(small_config, tmp_path, capsys):
    # Rows shuffled and the header typed timestamp:token: RecBole sorted the times as
    # text ("10" before "9") and most users got another test target, exit 0.
    import random

    folder = tmp_path / "data" / "texttime"
    folder.mkdir(parents=True)
    rows = [
        f"{user}\t{(user + step) % 30 + 1}\t{step}" for user in range(1, 41) for step in range(12)
    ]
    random.Random(0).shuffle(rows)
    header = "user_id:token\titem_id:token\ttimestamp:token"
    (folder / "texttime.inter").write_text("\n".join([header, *rows]) + "\n")
    config = dict(small_config, data_path=str(tmp_path / "data"))
    assert run_main(config, model="SASRec", dataset="texttime") == 2
    err = one_error_line(capsys)
    assert "the time column is declared 'timestamp:token'" in err
    assert "declare it timestamp:float" in err
    assert not list(Path(config["checkpoint_dir"]).glob("*.pth"))


def test_load_col_without_the_item_column_is_one_line(small_config, capsys):
    code = run_main(small_config, "--load_col={'inter': ['user_id', 'timestamp']}", model="SASRec")
    assert code == 2
    assert "leaves out ['item_id']: a sequential model reads" in one_error_line(capsys)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"model": None},
            "model must be a model name such as 'BSARec' or 'SASRec', package.module:Class, or a model class, got None",
        ),
        ({"model": 123}, "got 123"),
        ({"config_files": "small.yaml"}, "config_files must be a list of yaml file paths"),
        ({"config_dict": [("epochs", 1)]}, "config_dict must be a dict of settings"),
        ({"dataset": 5}, "dataset must be a dataset name"),
    ],
)
def test_the_python_api_checks_its_arguments_in_one_line(small_config, kwargs, message):
    from recbole_freq.quick_start.quick_start import run

    arguments = {"model": "SASRec", "dataset": "tiny", "config_dict": small_config, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        run(**arguments)


def test_a_config_file_name_with_a_space_is_one_file(small_config, tmp_path):
    from recbole_freq.cli.common import split_config_files

    spaced = tmp_path / "my config.yaml"
    spaced.write_text("epochs: 1\n")
    assert split_config_files([str(spaced)]) == [str(spaced)]
    assert split_config_files(["a.yaml b.yaml"]) == ["a.yaml", "b.yaml"]
    assert run_main(dict(small_config, epochs=1), "--config_files", str(spaced)) == 0


def test_inputs_that_ended_in_tracebacks_are_one_line(small_config, tmp_path, capsys):
    # Each was a traceback before (#52): a NUL byte in a yaml file, a length RecBole
    # cannot allocate, names over the file system's 255 bytes, a 100,000-character model.
    nul = tmp_path / "nul.yaml"
    nul.write_bytes(b"epochs: 1\nalpha: 0.\x005\n")
    assert run_main(small_config, "--config_files", str(nul), model="SASRec") == 2
    assert f"config file {nul}: special characters are not allowed" in one_error_line(capsys)
    huge = dict(small_config, MAX_ITEM_LIST_LENGTH=99999999999999)
    assert run_main(huge, model="SASRec") == 2
    assert "GiB per training step" in one_error_line(capsys)
    long_name = "d" * 300
    assert run_main(small_config, model="SASRec", dataset=long_name) == 2
    assert "has 300 bytes: it names files and folders" in one_error_line(capsys)
    assert main(["--recommend", str(tmp_path / f"{long_name}.pth"), "--users", "1"]) == 2
    err = one_error_line(capsys)
    assert "a path is too long for the file system" in err and len(err) < 400
    assert main([f"--model={'M' * 100_000}", "--dataset=tiny", *cli(small_config)]) == 2
    err = one_error_line(capsys)
    assert "unknown model" in err and len(err) < 2000
    assert not list(Path(small_config["checkpoint_dir"]).glob("*.pth"))


def test_an_id_column_typed_as_a_list_is_one_line(small_config, tmp_path, capsys):
    folder = tmp_path / "data" / "listed"
    folder.mkdir(parents=True)
    rows = [f"{user}\t{(user + step) % 30 + 1}\t{step}" for user in range(1, 41) for step in range(8)]  # fmt: skip
    header = "user_id:token_seq\titem_id:token\ttimestamp:float"
    (folder / "listed.inter").write_text("\n".join([header, *rows]) + "\n")
    config = dict(small_config, data_path=str(tmp_path / "data"))
    assert run_main(config, model="SASRec", dataset="listed") == 2
    assert "the id column is declared 'user_id:token_seq'" in one_error_line(capsys)
