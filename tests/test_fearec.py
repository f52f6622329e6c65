"""FEARec as its authors ran it (``properties/model/FEARec.yaml``): the file replaces the
settings of RecBole's shipped FEARec.yaml, which switch the model's frequency and
contrastive parts off, and the model trains with those parts through the real pipeline."""

from pathlib import Path

import pytest
import recbole
import torch
import yaml

from conftest import first_batch, prepare
from recbole_freq.cli import main
from recbole_freq.config.configurator import FreqConfig
from recbole_freq.jobs.compare import compare
from recbole_freq.protocol import ProtocolError
from recbole_freq.quick_start.quick_start import new_model, run

AUTHORS = {
    "contrast": "us_x",
    "dual_domain": True,
    "fredom": True,
    "fredom_type": "us_x",
    "global_ratio": 0.6,
    "spatial_ratio": 0.1,
    "std": True,
    "topk_factor": 10,
    "tau": 1.0,
    "lmd": 0.1,
    "lmd_sem": 0.1,
    "sim": "dot",
}
# FEARec keeps int(10 * ln L) of 2 * (L // 2) time delays: the authors' 10 needs L >= 36.
LONG = {"MAX_ITEM_LIST_LENGTH": 50}


def test_recbole_ships_fearec_with_its_frequency_parts_off():
    """Why the plugin has its own file: RecBole 1.2.1's turns off what makes FEARec."""
    shipped = Path(recbole.__file__).parent / "properties" / "model" / "FEARec.yaml"
    settings = yaml.safe_load(shipped.read_text())
    assert settings["dual_domain"] is False and settings["fredom"] is False
    assert settings["global_ratio"] == 1 and "contrast" not in settings


def test_fearec_gets_the_authors_settings_and_recbole_s_are_one_line_away(tiny_data):
    config = FreqConfig("FEARec", "tiny", cmd_overrides={"data_path": str(tiny_data)})
    assert {key: config[key] for key in AUTHORS} == AUTHORS
    off = {"dual_domain": False, "fredom": False, "global_ratio": 1, "contrast": None}
    config = FreqConfig("FEARec", "tiny", cmd_overrides={"data_path": str(tiny_data), **off})
    assert {key: config[key] for key in off} == off


def test_the_authors_settings_add_the_contrastive_and_frequency_losses(small_config):
    """In eval mode (no dropout) the loss with the authors' settings is the CE loss plus
    the supervised InfoNCE and the frequency-domain L1 term, both positive."""
    config, train, _, _ = prepare("FEARec", dict(small_config, **LONG))
    model = new_model(config, train)
    model.eval()
    batch = first_batch(train)
    with torch.no_grad():
        full = model.calculate_loss(batch).item()
        model.ssl, model.fredom = None, False
        cross_entropy_only = model.calculate_loss(batch).item()
    assert full > cross_entropy_only > 0


def test_fearec_with_the_authors_settings_trains_and_evaluates(small_config):
    summary = run("FEARec", "tiny", cmd_overrides=dict(small_config, epochs=1, **LONG))
    assert summary["epochs_run"] == 1
    assert summary["config"]["dual_domain"] is True
    assert 0 <= summary["test_result"]["hit@10"] <= 1


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"MAX_ITEM_LIST_LENGTH": 12},
            "FEARec with topk_factor=10 keeps int(10 * ln 12) = 24 time delays, more than the "
            "12 that MAX_ITEM_LIST_LENGTH=12 has (2 * (L // 2)); use MAX_ITEM_LIST_LENGTH >= 36 "
            "or topk_factor <= 5",
        ),
        # odd L: the irfft of L // 2 + 1 bins has L - 1 delays, and int(10 * ln 35) = 35
        ({"MAX_ITEM_LIST_LENGTH": 35}, "= 35 time delays, more than the 34 that"),
        ({"topk_factor": 1, "MAX_ITEM_LIST_LENGTH": 2}, "keeps int(1 * ln 2) = 0 time delays"),
        ({"topk_factor": 0, **LONG}, "FEARec needs topk_factor > 0, got 0"),
    ],
)
def test_too_many_or_no_time_delays_is_one_line(small_config, capsys, overrides, message):
    args = [f"--{key}={value}" for key, value in dict(small_config, **overrides).items()]
    assert main(["--model=FEARec", "--dataset=tiny", *args]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: ") and message in errors[0], errors


def test_the_bound_in_the_message_is_the_largest_that_works(small_config):
    """``topk_factor`` 5 with L = 12 keeps 12 delays and trains; 36 positions suffice for
    the authors' 10."""
    for overrides in ({"topk_factor": 5}, {"MAX_ITEM_LIST_LENGTH": 36}):
        summary = run("FEARec", "tiny", cmd_overrides=dict(small_config, epochs=1, **overrides))
        assert summary["epochs_run"] == 1


def test_a_comparison_names_the_fearec_settings_it_used(small_config, tmp_path):
    overrides = {k: v for k, v in dict(small_config, epochs=1, **LONG).items() if k != "seed"}
    table = compare("SASRec,FEARec", "tiny", seeds="5", overrides=overrides, out=tmp_path / "a")
    assert (
        "FEARec ran with properties/model/FEARec.yaml (its authors' settings, not RecBole's "
        "shipped ones)."
    ) in table["markdown"]
    recbole_s = dict(overrides, dual_domain=False, fredom=False, global_ratio=1)
    table = compare("FEARec", "tiny", seeds="5", overrides=recbole_s, out=tmp_path / "b")
    assert (
        "FEARec ran with properties/model/FEARec.yaml except global_ratio=1, "
        "dual_domain=False, fredom=False."
    ) in table["markdown"]


def test_a_protocol_loss_that_would_drop_fearec_s_terms_is_refused(small_config):
    overrides = dict(small_config, epochs=1, train_loss="bce", **LONG)
    with pytest.raises(ProtocolError, match="leaves out FEARec's contrastive term .*frequency-"):
        run("FEARec", "tiny", cmd_overrides=overrides, saved=False)


@pytest.mark.parametrize("dual_domain", [False, True])
def test_fearecs_frequency_attention_computes_in_float32_under_autocast(dual_domain):
    """Compat fix 21: under mixed precision RecBole's ``HybridAttention`` runs in
    float32 (on CUDA its float16 FFT stopped FEARec in its first step), so its output is
    the full-precision one; bfloat16 would be off by about 1e-2 relative."""
    from recbole.model.sequential_recommender.fearec import HybridAttention

    import recbole_freq  # noqa: F401  (installs the fixes)

    torch.manual_seed(0)
    defaults = Path(recbole.__file__).parent / "properties" / "model" / "FEARec.yaml"
    config = yaml.safe_load(defaults.read_text()) | {
        "MAX_ITEM_LIST_LENGTH": 50, "global_ratio": 0.5, "dual_domain": dual_domain,
        "spatial_ratio": 0.5, "use_filter": False,
    }  # fmt: skip
    layer = HybridAttention(2, 16, 0.0, 0.0, 1e-12, 0, config).eval()
    hidden = torch.randn(3, 50, 16)
    mask = torch.zeros(3, 1, 50, 50)
    full = layer(hidden, mask)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        mixed = layer(hidden, mask)
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, full, rtol=1e-6, atol=1e-6)
