"""Nothing loaded on behalf of a checkpoint, a config or a shared folder runs code.

Each test plants a pickle whose unpickling would create a marker file (``os.system``,
as a real attack would) in one place that RecBole or the plugin could read, then runs
the real pipeline: the marker must never appear.
"""

import json
import os
import pickle
import shlex

import pytest
import recbole.trainer.trainer as trainer_module
import torch
from recbole.quick_start import load_data_and_model

from recbole_freq.checkpoint.loader import UntrustedCheckpointError, load_checkpoint
from recbole_freq.cli import main
from recbole_freq.quick_start.quick_start import run


class Payload:
    """Unpickling this runs a shell command that creates ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


def plant_pickle(path, marker):
    """A plain pickle (what RecBole's dataset and dataloader caches are)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        pickle.dump(Payload(marker), handle)
    return path


def plant_checkpoint(path, marker):
    """A ``torch.save`` archive shaped like a RecBole checkpoint, with the payload."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": Payload(marker), "state_dict": {}}, path, pickle_protocol=4)
    return path


def overrides(config: dict) -> list[str]:
    return [f"--{key}={value}" for key, value in config.items()]


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "PAYLOAD_RAN"
    yield path
    assert not path.exists(), "a planted pickle ran its code"


def test_the_payload_does_run_when_unpickled(tmp_path):
    # The test's own premise: these files really are attacks.
    ran = tmp_path / "ran"
    with open(plant_pickle(tmp_path / "p.pth", ran), "rb") as handle:
        pickle.load(handle)
    assert ran.exists()


def test_checkpoint_swapped_between_save_and_reload_runs_nothing(small_config, marker, monkeypatch):
    config = dict(small_config, epochs=1, extra_test_modes=["uni100"])
    reference = run("SASRec", "wide", config_dict=config)
    original_fit = trainer_module.Trainer.fit

    def fit_then_swap(self, *args, **kwargs):
        result = original_fit(self, *args, **kwargs)
        plant_checkpoint(type(marker)(self.saved_model_file), marker)
        return result

    monkeypatch.setattr(trainer_module.Trainer, "fit", fit_then_swap)
    swapped = run("SASRec", "wide", config_dict=config)
    # The best weights come from memory, never from the (swapped) file.
    assert swapped["test_result"] == reference["test_result"]
    assert swapped["extra_test_results"] == reference["extra_test_results"]


def test_recbole_loaders_refuse_a_pickle_whoever_wrote_it(small_config, tmp_path, marker):
    planted = plant_checkpoint(tmp_path / "saved" / "model.pth", marker)
    with pytest.raises(UntrustedCheckpointError, match=r"posix\.system"):
        trainer_module.torch.load(str(planted))
    # RecBole's own reload imports torch itself: torch's weights-only default refuses.
    with pytest.raises((UntrustedCheckpointError, pickle.UnpicklingError)):
        load_data_and_model(str(planted))
    # A path this very process wrote earns no trust either: content decides.
    summary = run("SASRec", "tiny", config_dict=dict(small_config, epochs=1))
    plant_checkpoint(type(planted)(summary["checkpoint"]), marker)
    with pytest.raises(UntrustedCheckpointError):
        trainer_module.torch.load(summary["checkpoint"])


def trained_trainer(small_config, epochs=2):
    from recbole.data import create_dataset, data_preparation
    from recbole.utils import get_trainer

    from recbole_freq.config.configurator import FreqConfig, get_model_class

    config = FreqConfig("SASRec", "tiny", config_dict=dict(small_config, epochs=epochs))
    train, valid, test = data_preparation(config, create_dataset(config))
    model = get_model_class("SASRec")(config, train._dataset)
    trainer = get_trainer(config["MODEL_TYPE"], "SASRec")(config, model)
    if epochs:
        trainer.fit(train, valid, saved=True, show_progress=False)
    return trainer, test


def test_resume_checkpoint_refuses_a_planted_pickle(small_config, tmp_path, marker):
    trainer, _ = trained_trainer(small_config, epochs=0)
    planted = plant_checkpoint(tmp_path / "resume.pth", marker)
    with pytest.raises(UntrustedCheckpointError):
        trainer.resume_checkpoint(str(planted))


def test_pickled_caches_in_the_checkpoint_folder_are_never_read(
    small_config, tmp_path, marker, capsys
):
    saved = tmp_path / "saved"
    plant_pickle(saved / "tiny-SequentialDataset.pth", marker)
    plant_pickle(saved / "tiny-for-SASRec-dataloader.pth", marker)
    config = dict(small_config, epochs=1)
    code = main(["--model=SASRec", "--dataset=tiny", *overrides(config)])
    assert code == 0, capsys.readouterr().err
    checkpoint = next(p for p in saved.glob("SASRec-tiny-*.pth"))
    # --recommend and --analyze on a genuine checkpoint of that folder.
    assert main(["--recommend", str(checkpoint), "--users", "1"]) == 0
    out = tmp_path / "analysis"
    assert main(["--analyze", str(checkpoint), "--out", str(out), "--max_sequences=8"]) == 0


@pytest.mark.parametrize("key", ["dataset_save_path", "dataloaders_save_path"])
def test_a_checkpoint_naming_a_pickled_cache_is_used_without_it(
    small_config, tmp_path, marker, capsys, key
):
    summary = run("SASRec", "tiny", config_dict=dict(small_config, epochs=1))
    genuine = load_checkpoint(summary["checkpoint"])
    genuine["config"][key] = str(plant_pickle(tmp_path / "cache.pth", marker))
    genuine["config"]["save_dataset"] = True
    edited = tmp_path / "edited.pth"
    torch.save(genuine, edited, pickle_protocol=4)
    capsys.readouterr()
    assert main(["--recommend", str(edited), "--users", "1,2"]) == 0
    captured = capsys.readouterr()
    assert f"names {key}=" in captured.err and "ignored" in captured.err
    assert captured.out.startswith("user,rank,item,score")
    assert not list((tmp_path / "saved").glob("tiny-*Dataset.pth"))  # no cache written


@pytest.mark.parametrize("key", ["dataset_save_path", "dataloaders_save_path"])
@pytest.mark.parametrize("where", ["command line", "yaml"])
def test_a_user_config_naming_a_pickled_cache_is_refused(
    small_config, tmp_path, marker, capsys, key, where
):
    planted = plant_pickle(tmp_path / "cache.pth", marker)
    args = ["--model=SASRec", "--dataset=tiny", *overrides(small_config)]
    if where == "yaml":
        yaml_file = tmp_path / "cache.yaml"
        yaml_file.write_text(f"{key}: {planted}\n")
        args += ["--config_files", str(yaml_file)]
    else:
        args.append(f"--{key}={planted}")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {key}=")
    assert "never reads pickled dataset or dataloader caches" in err
    assert not (tmp_path / "saved").exists() or not list((tmp_path / "saved").glob("*.pth"))


def test_save_dataset_writes_no_pickle(small_config, tmp_path):
    config = dict(small_config, epochs=1, save_dataset=True, save_dataloaders=True, state="INFO")
    run("SASRec", "tiny", config_dict=config)
    assert [p.name for p in (tmp_path / "saved").iterdir() if "Dataset" in p.name] == []
    assert not list((tmp_path / "saved").glob("*dataloader*"))
    log = next((tmp_path / "log" / "SASRec").glob("*.log")).read_text()
    assert "save_dataset=True is ignored" in log and "save_dataloaders=True is ignored" in log


def test_trainer_reload_restores_exactly_the_saved_best_weights(small_config):
    trainer, test = trained_trainer(small_config, epochs=3)
    on_disk = load_checkpoint(trainer.saved_model_file)
    for parameter in trainer.model.parameters():  # move away from the best weights
        parameter.data.add_(1.0)
    trainer.evaluate(test, load_best_model=True)
    state = trainer.model.state_dict()
    assert set(state) == set(on_disk["state_dict"])
    assert all(torch.equal(state[name], on_disk["state_dict"][name]) for name in state)


# --- verified loads ---------------------------------------------------------------


@pytest.fixture(scope="module")
def genuine(tiny_data, tmp_path_factory):
    """One SASRec checkpoint and its run summary (trained once for these tests)."""
    from conftest import SMALL_MODEL

    work = tmp_path_factory.mktemp("genuine")
    cwd = os.getcwd()
    os.chdir(work)
    try:
        config = dict(
            SMALL_MODEL, epochs=1, data_path=str(tiny_data), checkpoint_dir=str(work / "saved")
        )
        summary = run("SASRec", "tiny", config_dict=config)
    finally:
        os.chdir(cwd)
    return summary


def flip_a_bit_in_the_weights(source, target):
    """Copy ``source`` with one bit flipped inside the item embedding's data record."""
    import zipfile

    with zipfile.ZipFile(source) as archive:
        records = [i for i in archive.infolist() if "/data/" in i.filename]
        largest = max(records, key=lambda i: i.file_size)  # the item embedding table
    raw = bytearray(open(source, "rb").read())
    header = largest.header_offset
    name_length = int.from_bytes(raw[header + 26 : header + 28], "little")
    extra_length = int.from_bytes(raw[header + 28 : header + 30], "little")
    raw[header + 30 + name_length + extra_length + 5] ^= 0x10
    open(target, "wb").write(bytes(raw))
    return target


def test_a_damaged_checkpoint_is_refused(genuine, tmp_path, capsys):
    damaged = flip_a_bit_in_the_weights(genuine["checkpoint"], tmp_path / "damaged.pth")
    assert main(["--recommend", str(damaged), "--users", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is damaged: record" in err and "CRC-32" in err
    assert main(["--analyze", str(damaged), "--out", str(tmp_path / "a")]) == 2
    assert "is damaged" in capsys.readouterr().err


def test_non_finite_weights_are_refused(genuine, tmp_path, capsys):
    checkpoint = load_checkpoint(genuine["checkpoint"])
    checkpoint["state_dict"]["item_embedding.weight"][3, 0] = float("nan")
    edited = tmp_path / "nan.pth"
    torch.save(checkpoint, edited, pickle_protocol=4)
    for mode in (["--recommend", str(edited), "--users", "1"], ["--analyze", str(edited)]):
        assert main(mode) == 2
        err = capsys.readouterr().err
        assert "holds non-finite weights (NaN or infinity) in item_embedding.weight" in err


def test_config_sizes_that_do_not_fit_the_weights_build_nothing(
    genuine, tmp_path, capsys, monkeypatch
):
    import recbole_freq.compat.data as compat_data

    checkpoint = load_checkpoint(genuine["checkpoint"])
    checkpoint["config"]["MAX_ITEM_LIST_LENGTH"] = 1_000_000
    edited = tmp_path / "huge.pth"
    torch.save(checkpoint, edited, pickle_protocol=4)

    def no_dataset(config):
        raise AssertionError("the dataset was built before the sizes were checked")

    monkeypatch.setattr(compat_data, "_recbole_dataset_class", no_dataset)
    assert main(["--recommend", str(edited), "--users", "1"]) == 2
    err = capsys.readouterr().err
    assert "MAX_ITEM_LIST_LENGTH=1000000 but position_embedding.weight has 12 positions" in err


@pytest.mark.parametrize("recorded", ["BSARec", "GRU4Rec"])
def test_a_recorded_model_that_does_not_fit_the_weights_is_refused(
    genuine, tmp_path, capsys, recorded
):
    from recbole_freq.config.configurator import get_model_class

    checkpoint = load_checkpoint(genuine["checkpoint"])  # SASRec weights
    checkpoint["config"]["model"] = recorded
    checkpoint["config"]["model_class"] = get_model_class(recorded)
    edited = tmp_path / "relabelled.pth"
    torch.save(checkpoint, edited, pickle_protocol=4)
    for mode in (["--recommend", str(edited), "--users", "1"], ["--analyze", str(edited)]):
        assert main(mode) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert (
            f"its weights are not those of a {recorded}" in err
            or f"its config cannot build the {recorded} it records" in err
        )
        assert "trained on other data" not in err


def test_the_summary_names_the_weights_that_recommend_uses(genuine, tmp_path, capsys):
    from recbole_freq.checkpoint.loader import weights_fingerprint

    on_disk = load_checkpoint(genuine["checkpoint"])
    assert genuine["weights_sha256"] == weights_fingerprint(on_disk["state_dict"])
    assert genuine["log_file"].endswith(".log") and os.path.isfile(genuine["log_file"])
    assert main(["--recommend", genuine["checkpoint"], "--users", "1"]) == 0
    err = capsys.readouterr().err
    assert f"weights sha256 {genuine['weights_sha256'][:16]}" in err and "warning" not in err
    # The same file name holding other (valid) weights: said, not hidden.
    replaced = tmp_path / "replaced.pth"
    on_disk["state_dict"]["item_embedding.weight"] += 0.5
    torch.save(on_disk, replaced, pickle_protocol=4)
    summary = json.loads(open(genuine["summary_file"]).read())
    (tmp_path / "replaced.json").write_text(json.dumps(summary))
    assert main(["--recommend", str(replaced), "--users", "1"]) == 0
    assert "recorded " + genuine["weights_sha256"][:16] in capsys.readouterr().err


def test_two_identical_runs_started_together_write_separate_logs(small_config, tmp_path):
    first = run("SASRec", "tiny", config_dict=dict(small_config, epochs=1))
    second = run("SASRec", "tiny", config_dict=dict(small_config, epochs=1))
    assert first["log_file"] != second["log_file"]
    assert len(list((tmp_path / "log_tensorboard").iterdir())) == 2


# --- the data a checkpoint was trained on -----------------------------------------


def test_a_checkpoint_refuses_data_prepared_again_with_other_content(
    small_config, tmp_path, capsys
):
    from conftest import write_sequences
    from dataset_prep import convert_one_line
    from dataset_prep.errors import UsageError

    data = tmp_path / "data"
    convert_one_line(write_sequences(tmp_path / "a.txt", seed=1), data, "shop", show_progress=False)
    config = dict(small_config, epochs=1, data_path=str(data))
    summary = run("SASRec", "shop", config_dict=config)
    assert len(summary["dataset_sha256"]) == 64
    assert (
        load_checkpoint(summary["checkpoint"])["config"]["dataset_sha256"]
        == summary["dataset_sha256"]
    )
    other = write_sequences(tmp_path / "b.txt", seed=2)
    # dataset_prep refuses to replace it without --force ...
    with pytest.raises(UsageError, match="already holds a different 'shop'.*--force"):
        convert_one_line(other, data, "shop", show_progress=False)
    assert main(["--recommend", summary["checkpoint"], "--users", "1"]) == 0
    capsys.readouterr()
    # ... and with it, the old checkpoint no longer fits the data: refused, both named.
    convert_one_line(other, data, "shop", show_progress=False, force=True)
    assert main(["--recommend", summary["checkpoint"], "--users", "1"]) == 2
    err = capsys.readouterr().err
    assert f"sha256 {summary['dataset_sha256'][:16]}" in err and "now holds sha256" in err
    assert err.count("\n") == 1


def test_the_same_data_prepared_again_is_accepted(tmp_path):
    from conftest import write_sequences
    from dataset_prep import convert_one_line

    raw = write_sequences(tmp_path / "a.txt", seed=1)
    convert_one_line(raw, tmp_path / "data", "shop", show_progress=False)
    convert_one_line(raw, tmp_path / "data", "shop", show_progress=False)  # no --force needed


# --- setting values are literals, never code (compat fix 18) ----------------------


def code_setting(marker) -> str:
    """A setting value that RecBole's ``eval()`` would run: it creates ``marker``."""
    return f"__import__('os').system('touch {marker}') or 0.001"


def test_a_command_line_setting_runs_no_code(small_config, marker, capsys):
    args = ["--model=SASRec", "--dataset=tiny", *overrides(dict(small_config, epochs=1))]
    assert main([*args, f"--learning_rate={code_setting(marker)}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "learning_rate" in err


def test_a_config_dict_setting_runs_no_code(small_config, marker):
    config = dict(small_config, epochs=1, learning_rate=code_setting(marker))
    with pytest.raises(ValueError, match="learning_rate"):
        run("SASRec", "tiny", config_dict=config)


def test_a_hyper_file_choice_runs_no_code(small_config, marker, tmp_path):
    from recbole_freq.jobs.tune import TuneSetupError, tune_model

    hyper = tmp_path / "space.hyper"
    hyper.write_text(f'learning_rate choice ["{code_setting(marker)}", 0.001]\n')
    with pytest.raises(TuneSetupError, match="learning_rate"):
        tune_model(
            "SASRec", "tiny", str(hyper), config_dict=small_config, storage_path=tmp_path / "r"
        )


def test_recboles_own_config_and_hyper_tuning_run_no_code(marker):
    from recbole.config import Config

    given = {
        "learning_rate": code_setting(marker),
        "hidden_size": "64",
        "mlp_hidden_size": "[64, 32]",
        "loss_type": "BPR",
        "use_gpu": "false",
        "weight_decay": "1e-4",
        "neg_sampling": "None",
    }
    config = Config("SASRec", "ml-100k", config_dict=dict(given))
    assert config["learning_rate"] == code_setting(marker)  # kept as text, never run
    assert config["hidden_size"] == 64 and config["mlp_hidden_size"] == [64, 32]
    assert config["loss_type"] == "BPR" and config["use_gpu"] is False
    assert config["weight_decay"] == 1e-4 and config["neg_sampling"] is None
    # HyperTuning reads a hyper file's choice list with the eval of its module.
    import recbole.trainer.hyper_tuning as hyper_tuning

    choices = f'["{code_setting(marker)}",0.01]'
    assert hyper_tuning.eval(choices) == [code_setting(marker), 0.01]
    assert hyper_tuning.eval(f"{code_setting(marker)}") == code_setting(marker)


def test_kd_dagfm_teacher_names_only_a_network_class(marker):
    import recbole.model.context_aware_recommender.kd_dagfm as kd_dagfm

    assert kd_dagfm.eval("CrossNet") is kd_dagfm.CrossNet
    with pytest.raises(ValueError, match="does not name a network class"):
        kd_dagfm.eval(f"__import__('os').system('touch {marker}')")


# --- a checkpoint's pickle may call nothing that calls or builds what it is handed ----


class RebuildsAConfig:
    """The issue's crafted value: torch's ``_rebuild_from_type_v2`` (allowlisted: it
    rebuilds tensor subclasses) handed RecBole's ``Config`` class, which it would call
    with a setting string that RecBole's ``eval()`` runs."""

    def __init__(self, marker):
        self.setting = f"__import__('os').system('touch {marker}')"

    def __reduce__(self):
        from recbole.config import Config

        arguments = (None, None, None, {"x": self.setting})
        return (torch._tensor._rebuild_from_type_v2, (Config, torch.Tensor, arguments, {}))


def craft(genuine_file, target, marker, key="epoch"):
    checkpoint = load_checkpoint(genuine_file)
    checkpoint[key] = RebuildsAConfig(marker)
    torch.save(checkpoint, target, pickle_protocol=4)
    return target


def test_a_checkpoint_handing_a_class_to_an_allowed_callable_is_refused(genuine, tmp_path, marker):
    for key in ("epoch", "best_valid_score", "other_parameter"):
        with pytest.raises(UntrustedCheckpointError, match="passes <class 'recbole.config"):
            load_checkpoint(craft(genuine["checkpoint"], tmp_path / f"{key}.pth", marker, key))


def test_no_command_runs_a_crafted_checkpoint(genuine, tmp_path, marker, capsys):
    crafted = str(craft(genuine["checkpoint"], tmp_path / "evil.pth", marker))
    resume = str(craft(genuine["checkpoint"], tmp_path / "evil.resume.pth", marker))
    commands = [
        ["--recommend", crafted, "--all_users"],
        ["--analyze", crafted, "--out", str(tmp_path / "analysis")],
        ["--evaluate", crafted],
        ["--resume", resume],
    ]
    for command in commands:
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "refusing to load" in err, (command, err)
    with pytest.raises(UntrustedCheckpointError):
        load_data_and_model(crafted)


def test_the_plugins_checkpoints_are_plain_data_for_torchs_weights_only_loader(genuine):
    on_disk = torch.load(genuine["checkpoint"], weights_only=True)  # torch's loader alone
    assert on_disk["config"]["class"] == "FreqConfig"
    assert on_disk["config"]["attributes"]["model_class"]["name"] == "SASRec"
    loaded = load_checkpoint(genuine["checkpoint"])
    assert (
        loaded["config"]["model"] == "SASRec" and loaded["config"].model_class.__name__ == "SASRec"
    )
    assert loaded["config"]["MODEL_TYPE"].name == "SEQUENTIAL"


def test_analyze_removes_no_other_programs_temporary_files(genuine, tmp_path):
    out = tmp_path / "analysis"
    out.mkdir()
    theirs = [".notes.0123456789ab.tmp", ".draft.99999-0123456789abcdef.tmp"]
    for name in theirs:
        (out / name).write_text("theirs")
        os.utime(out / name, (0, 0))
    assert main(["--analyze", genuine["checkpoint"], "--out", str(out), "--max_sequences=8"]) == 0
    assert all((out / name).read_text() == "theirs" for name in theirs)


def test_an_output_that_is_a_device_or_a_link_is_refused_not_replaced(genuine, tmp_path, capsys):
    from recbole_freq.utils.files import OutputPathError, write_atomic

    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for target, kind in ((link, "a symbolic link"), ("/dev/null", "a device"), (fifo, "a pipe")):
        command = ["--recommend", genuine["checkpoint"], "--users", "1", "--output", str(target)]
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"it is {kind}" in err, err
        with pytest.raises(OutputPathError, match=f"it is {kind}"):
            write_atomic(target, "x")
    assert link.is_symlink() and os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


def test_a_gru4rec_checkpoint_reloads_in_every_command(small_config, tmp_path, capsys):
    from conftest import without_transformer_settings

    config = dict(without_transformer_settings(small_config), epochs=1)
    summary = run("GRU4Rec", "tiny", config_dict=config)
    checkpoint = summary["checkpoint"]
    assert load_checkpoint(checkpoint)["state_dict"]["item_embedding.weight"].shape[1] == 64
    assert main(["--recommend", checkpoint, "--users", "1"]) == 0
    capsys.readouterr()
    # --analyze reads Transformer encoders only: said as such, not as a damaged file.
    assert main(["--analyze", checkpoint, "--out", str(tmp_path / "a")]) == 2
    assert "cannot analyse GRU4Rec: the analysis reads Transformer" in capsys.readouterr().err
    assert main(["--evaluate", checkpoint]) == 0
    loaded_config, model, *_ = load_data_and_model(checkpoint)
    assert loaded_config["model"] == "GRU4Rec"
    # The case the size check missed: items embedded at embedding_size, not hidden_size.
    assert model.item_embedding.weight.shape[1] == loaded_config["embedding_size"] == 64
    assert loaded_config["hidden_size"] != 64
    assert "does not fit" not in capsys.readouterr().err


def test_a_checkpoint_holding_an_expanded_tensor_is_refused_before_it_is_touched(
    genuine, tmp_path, capsys
):
    checkpoint = load_checkpoint(genuine["checkpoint"])
    # 200,000 x 200,000 floats (160 GB) on one stored float: a few bytes on disk.
    checkpoint["state_dict"]["item_embedding.weight"] = torch.zeros(1).expand(200_000, 200_000)
    crafted = tmp_path / "expanded.pth"
    torch.save(checkpoint, crafted, pickle_protocol=4)
    assert main(["--recommend", str(crafted), "--users", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(an expanded or overlapping view)" in err


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("epoch", [1], "its 'epoch' is a list of the wrong shape"),
        ("surprise", 1, "unknown entries surprise"),
        ("state_dict", {"w": "not a tensor"}, "its 'state_dict' is a dict of the wrong shape"),
    ],
)
def test_a_checkpoint_value_of_the_wrong_shape_is_refused(genuine, tmp_path, key, value, message):
    from recbole_freq.checkpoint.loader import CheckpointError

    checkpoint = load_checkpoint(genuine["checkpoint"])
    checkpoint[key] = value
    edited = tmp_path / "edited.pth"
    torch.save(checkpoint, edited)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(edited)


def test_analyze_on_a_full_disk_names_what_it_did_write(genuine, tmp_path, capsys, monkeypatch):
    import errno

    import recbole_freq.utils.files as files

    original, calls = files._write_content, []

    def full_after_two(handle, content):
        calls.append(handle)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(handle, content)

    monkeypatch.setattr(files, "_write_content", full_after_two)
    out = tmp_path / "analysis"
    assert main(["--analyze", genuine["checkpoint"], "--out", str(out), "--max_sequences=8"]) == 1
    err = capsys.readouterr().err.splitlines()[-1]  # after the line naming the checkpoint
    assert err.startswith("error: ") and "No space left on device" in err
    written = [p.name for p in out.iterdir() if p.suffix == ".png"]
    assert len(written) == 2 and all(name in err for name in written)
    assert f"were written to {out}" in err and "nothing was written" not in err


def test_a_crafted_partial_run_of_a_comparison_runs_nothing(
    genuine, small_config, tmp_path, marker
):
    from recbole_freq.jobs.compare import compare

    out = tmp_path / "cmp"
    craft(genuine["checkpoint"], tmp_path / "evil.pth", marker)
    (out / "partial").mkdir(parents=True)
    (tmp_path / "evil.pth").rename(out / "partial" / "SASRec-seed5.resume.pth")
    overrides = {k: v for k, v in dict(small_config, epochs=1).items() if k != "seed"}
    with pytest.raises(UntrustedCheckpointError, match="passes <class 'recbole.config"):
        compare("SASRec", "tiny", seeds="5", overrides=overrides, out=out)


def test_a_trial_store_runs_no_code_and_refuses_damaged_records(small_config, tmp_path, marker):
    """A trial store is made to travel (committed, copied): its records are JSON and its
    resume states go through the restricted loader, whoever wrote them."""
    from recbole_freq.config.configurator import FreqConfig
    from recbole_freq.jobs.tune.store import TrialStore, TrialStoreError

    config = FreqConfig("BSARec", "tiny", config_dict=small_config)
    store, params = TrialStore(tmp_path / "store"), {"alpha": 0.3}
    plant_checkpoint(store.state_path(params), marker)
    with pytest.raises(UntrustedCheckpointError):
        store.load_state(params)
    store.record_path(params).write_text("{not json")
    with pytest.raises(TrialStoreError, match="cannot be read as a trial record"):
        store.read(params, config)
    other = {"format": "recbole-freq trial record 1", "params": {"alpha": 0.7}, "settings": {}}
    other.update(segments=[], reports=[], final=None)
    store.record_path(params).write_text(json.dumps(other))
    with pytest.raises(TrialStoreError, match="is not the record of the trial"):
        store.read(params, config)
