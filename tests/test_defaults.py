"""Every setting a plugin model reads has its default in a property file, never in code:
the shared core's in ``properties/model/TransformerRecommender.yaml``, loaded before the
model's own file; a configuration without one of them is one line; configurations stored
before a core setting existed (checkpoints, resume states) run with its default."""

from pathlib import Path

import pytest
import torch

from recbole_freq.checkpoint.loader import load_checkpoint
from recbole_freq.checkpoint.schema import to_plain_checkpoint
from recbole_freq.config.configurator import FreqConfig, property_files
from recbole_freq.model.abstract_recommender import core_defaults
from recbole_freq.quick_start.quick_start import load_splits, new_model, run
from recbole_freq.utils.options import MissingSettingError

CORE = "TransformerRecommender.yaml"


def test_the_shared_cores_file_comes_before_each_plugin_models_own():
    names = [Path(path).name for path in property_files("BSARec", None)]
    assert names == ["overall.yaml", CORE, "BSARec.yaml"]
    names = [Path(path).name for path in property_files("RecDenoiser", "lastfm", paper=True)]
    assert names[:3] == ["overall.yaml", CORE, "RecDenoiser.yaml"]
    # RecBole's built-ins read their own defaults (RecBole's property files).
    assert CORE not in [Path(path).name for path in property_files("SASRec", None)]


def test_a_setting_without_a_default_is_one_line_not_a_code_value(small_config):
    config = FreqConfig("BSARec", "tiny", config_dict=small_config)
    assert config["residual"] == core_defaults()["residual"] == "standard"
    del config.final_config_dict["residual"]
    _, (train, _, _) = load_splits(config)
    with pytest.raises(MissingSettingError, match="setting 'residual' is not in this config"):
        new_model(config, train)


@pytest.mark.parametrize("backbone", ["SASRec", "SSE-PT", "TiSASRec"])
def test_a_denoisers_backbone_decides_the_settings_left_unset(small_config, backbone):
    """RecDenoiser.yaml leaves the backbone's settings unset (~): TiSASRec's and SSE-PT's
    values where unset, the shared core's (off) for the others."""
    config = FreqConfig("RecDenoiser", "tiny", config_dict=dict(small_config, backbone=backbone))
    assert config["user_embedding_size"] is None and config["time_intervals"] is None
    _, (train, _, _) = load_splits(config)
    model = new_model(config, train)
    expected = {
        "SASRec": (0, False, 0.0),
        "SSE-PT": (config["hidden_size"] // 2, False, 0.92),
        "TiSASRec": (0, True, 0.0),
    }[backbone]
    users = model.embedding.user_embedding
    seen = (users.embedding_dim if users else 0, model.relations is not None, model.sse.user_prob)
    assert seen == expected


def test_a_checkpoint_from_before_a_core_setting_restores_with_its_default(small_config):
    from recbole_freq.jobs.evaluate import evaluate_checkpoint

    summary = run("BSARec", "tiny", config_dict=dict(small_config, epochs=1))
    path = summary["checkpoint"]
    checkpoint = load_checkpoint(path)
    for key in ("residual", "time_span", "jacobian_gamma", "trc_c"):
        del checkpoint["config"].final_config_dict[key]
    torch.save(to_plain_checkpoint(checkpoint), path)
    (again,) = evaluate_checkpoint(path, [summary["protocol"]["protocol"]])
    assert again["test_result"] == summary["test_result"]


def test_a_run_interrupted_before_a_core_setting_existed_continues(
    small_config, tmp_path, monkeypatch, capsys
):
    """A resume state whose configuration predates a core setting is the same run when
    that setting is now at its default: it continues rather than being refused."""
    from test_resume import cli, interrupted_comparison

    from recbole_freq.cli import main

    shared = {k: v for k, v in small_config.items() if k != "seed"} | {"epochs": 2}
    out = tmp_path / "cmp"
    args, state_file = interrupted_comparison("BSARec", shared, out, monkeypatch)
    state = load_checkpoint(state_file)
    for key in ("residual", "time_span", "trc_sublayers", "mask_learning_rate"):
        del state["config"].final_config_dict[key]
    torch.save(to_plain_checkpoint(state), state_file)
    assert main([*args, *cli(shared)]) == 0
    assert (out / "runs" / "BSARec-seed5.json").is_file()
    # Another value of such a setting is another run.
    args, state_file = interrupted_comparison("BSARec", shared, tmp_path / "other", monkeypatch)
    state = load_checkpoint(state_file)
    del state["config"].final_config_dict["time_span"]
    torch.save(to_plain_checkpoint(state), state_file)
    capsys.readouterr()
    assert main([*args, *cli(shared), "--time_span=64"]) != 0
    assert "other settings (time_span: None then, 64 now)" in capsys.readouterr().err
