"""Frequency analysis of checkpoints (--analyze): known answers and real models."""

import json
import os

import numpy as np
import pytest
import torch

from conftest import SMALL_MODEL
from recbole_freq.cli import main
from recbole_freq.jobs.analyze.measures import (
    EncoderProbe,
    high_low_energy,
    mean_pairwise_cosine,
    singular_values,
    spectral_response,
    valid_positions,
)
from recbole_freq.model.frequency import low_pass_projector
from recbole_freq.model.layers import build_attention_mask
from recbole_freq.quick_start.quick_start import run
from recbole_freq.quick_start.restore import restore_model

N = 12

# --- known answers -----------------------------------------------------------------------


def test_uniform_causal_attention_concentrates_at_frequency_zero():
    uniform = torch.ones(N, N).tril()
    uniform = uniform / uniform.sum(-1, keepdim=True)
    response = spectral_response(uniform)
    assert response.shape == (N // 2 + 1,)
    assert response[0] == pytest.approx(1.0)  # row-stochastic: passes the constant
    assert (response[1:] < 0.7).all() and (response[N // 4 :] < 0.4).all()
    assert (response.diff() < 0).all()  # a low-pass filter: gain falls with frequency
    # Uniform attention over the whole sequence keeps only frequency 0.
    everywhere = spectral_response(torch.full((N, N), 1.0 / N))
    assert torch.allclose(everywhere, torch.tensor([1.0] + [0.0] * (N // 2)), atol=1e-6)


def test_identity_has_a_flat_response():
    assert torch.allclose(spectral_response(torch.eye(N)), torch.ones(N // 2 + 1))


def test_response_indexes_frequencies_as_the_dft():
    # BSARec's low-pass projector keeps the lowest 3 rfft bins exactly.
    response = spectral_response(low_pass_projector(N, 3))
    assert torch.allclose(response, torch.tensor([1.0] * 3 + [0.0] * (N // 2 - 2)), atol=1e-5)


def test_identical_tokens_are_fully_smoothed():
    row = torch.randn(8)
    hidden = row.expand(3, N, 8).clone()
    valid = torch.ones(3, N, dtype=torch.bool)
    valid[1, 5:] = False
    assert torch.allclose(mean_pairwise_cosine(hidden, valid), torch.ones(3, dtype=torch.float64))
    values = singular_values(hidden[0])
    assert values[0] > 1 and (values[1:] < 1e-5 * values[0]).all()  # one non-zero value
    high, low = high_low_energy(hidden.double(), valid)
    assert torch.allclose(high, torch.zeros(3, dtype=torch.float64), atol=1e-9)
    assert (low > 0).all()


def test_energy_ratio_matches_the_dft_of_the_valid_part():
    torch.manual_seed(0)
    hidden = torch.randn(2, N, 5, dtype=torch.float64)
    valid = torch.zeros(2, N, dtype=torch.bool)
    valid[0, :N] = True
    valid[1, :7] = True
    high, low = high_low_energy(hidden, valid)
    for row, length in enumerate((N, 7)):
        spectrum = torch.fft.fft(hidden[row, :length], dim=0, norm="ortho").abs().square()
        assert low[row] == pytest.approx(spectrum[0].sum().item())
        assert high[row] == pytest.approx(spectrum[1:].sum().item())
    # Cosine over pairs of real rows only, excluding each row with itself.
    unit = torch.nn.functional.normalize(hidden[1, :7], dim=-1)
    pairs = unit @ unit.t()
    expected = (pairs.sum() - 7) / 42
    assert mean_pairwise_cosine(hidden, valid)[1].item() == pytest.approx(expected.item())


def test_valid_positions_from_boolean_and_additive_masks():
    item_seq = torch.tensor([[3, 4, 5, 0, 0], [1, 0, 0, 0, 0]])
    expected = item_seq != 0
    causal = build_attention_mask(item_seq)
    assert torch.equal(valid_positions(causal), expected)
    assert torch.equal(valid_positions(build_attention_mask(item_seq, True)), expected)
    additive = torch.where(causal, 0.0, -10000.0)  # RecBole's encoding
    assert torch.equal(valid_positions(additive), expected)


# --- real checkpoints -------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tiny_data, tmp_path_factory):
    """SASRec and BSARec trained for 1 epoch on ``tiny`` (once for the module)."""
    work = tmp_path_factory.mktemp("analysis")
    cwd = os.getcwd()
    os.chdir(work)  # RecBole writes log/ into the working directory
    try:
        paths = {}
        for model in ("SASRec", "BSARec"):
            config = dict(
                SMALL_MODEL, epochs=1, data_path=str(tiny_data), checkpoint_dir=str(work / "saved")
            )
            paths[model] = run(model, "tiny", config_dict=config)["checkpoint"]
    finally:
        os.chdir(cwd)
    return paths


def test_analyze_two_checkpoints_side_by_side(checkpoints, tmp_path):
    out = tmp_path / "figures"
    code = main(["--analyze", checkpoints["SASRec"], checkpoints["BSARec"], "--out", str(out)])
    assert code == 0
    report = json.loads((out / "analysis.json").read_text())
    for name in ("spectral_response", "oversmoothing", "frequency_energy", "bsarec_beta"):
        png = (out / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5000
        assert f"{name}.png" in report["figures"]
    sasrec, bsarec = report["checkpoints"]
    assert (sasrec["model"], bsarec["model"]) == ("SASRec", "BSARec")
    for result in (sasrec, bsarec):
        assert result["n_sequences"] == 60  # every user's validation sequence
        assert len(result["frequency_grid"]) == N // 2 + 1
        assert len(result["attention_layers"]) == 2 and len(result["representations"]) == 3
        for layer in result["attention_layers"]:
            response = layer["attention_response"]
            # Softmax attention is row-stochastic: frequency 0 passes unchanged.
            assert response[0] == pytest.approx(1.0, abs=1e-4)
            assert max(response[1:]) < 1.0
        for rep in result["representations"]:
            assert len(rep["singular_values"]) == SMALL_MODEL["hidden_size"]
            assert -1 <= rep["mean_cosine_similarity"] <= 1
            assert rep["high_low_energy_ratio"] > 0
    assert all(layer["mixed_response"] is None for layer in sasrec["attention_layers"])
    assert all(len(layer["mixed_response"]) == N // 2 + 1 for layer in bsarec["attention_layers"])
    assert np.asarray(bsarec["bsarec_beta"]).shape == (2, SMALL_MODEL["hidden_size"])
    assert "bsarec_beta" not in sasrec


def test_probe_reads_the_models_own_attention(checkpoints):
    # The matrix the probe reports, applied to the values, is what each layer computed.
    for name in ("SASRec", "BSARec"):
        model, _, _, loaders, _ = restore_model(checkpoints[name])
        batch = next(iter(loaders[1]))[0]
        probe = EncoderProbe(model)
        try:
            with torch.no_grad():
                model.full_sort_predict(batch)
        finally:
            probe.close()
        valid = valid_positions(probe.mask)
        assert torch.equal(valid, batch[model.ITEM_SEQ] != 0)
        for layer in range(2):
            matrix = probe.attention[layer]
            rows = matrix.sum(-1)[:, 0][valid]
            assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5)
            assert (matrix.triu(1).abs() < 1e-6).all()  # causal
        if name == "BSARec":
            # Mixed filter: alpha (LFC + beta HFC) from the layer's own rescaler.
            alpha, rescale = probe.mixers()[0]
            assert alpha == model.encoder.blocks[0].mixer.alpha
            beta = model.learned_beta()[0]
            response = spectral_response(rescale.double())  # (hidden, N // 2 + 1)
            low_bins = model.encoder.blocks[0].mixer.rescaler.low_bins
            assert torch.allclose(response[:, :low_bins], torch.ones(1), atol=1e-5)
            high = beta[:, None].expand(-1, N // 2 + 1 - low_bins)
            assert torch.allclose(response[:, low_bins:], high, atol=1e-5)


def test_analyze_bad_inputs_are_clear_errors(checkpoints, tmp_path, capsys):
    assert main(["--analyze", str(tmp_path / "missing.pth")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--analyze", checkpoints["SASRec"], "--max_sequences=0"]) == 2
    assert "--max_sequences=0 must be >= 1" in capsys.readouterr().err
    not_prepared = tmp_path / "empty"
    not_prepared.mkdir()
    assert main(["--analyze", checkpoints["SASRec"], "--data_path", str(not_prepared)]) == 2
    assert "dataset 'tiny' is not prepared" in capsys.readouterr().err


def test_one_bad_checkpoint_does_not_fail_the_batch(checkpoints, tmp_path, capsys):
    out = tmp_path / "figures"
    missing = str(tmp_path / "missing.pth")
    assert main(["--analyze", checkpoints["SASRec"], missing, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: skipped 1 of 2 checkpoints: " + missing in err and "does not exist" in err
    report = json.loads((out / "analysis.json").read_text())
    assert [c["model"] for c in report["checkpoints"]] == ["SASRec"]
    assert main(["--analyze", missing, str(tmp_path / "other.pth"), "--out", str(out)]) == 2
    assert "none of the 2 checkpoints can be analysed" in capsys.readouterr().err


def test_figures_name_their_dataset_and_tick_whole_layers(checkpoints, tmp_path):
    # The suptitle ran into the subplot titles, layer axes ticked at 0.25, and no figure
    # named its dataset.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from recbole_freq.jobs.analyze import figures
    from recbole_freq.jobs.analyze.measures import analyse_checkpoint, label_results

    results = [analyse_checkpoint(checkpoints["BSARec"], max_sequences=20)]
    label_results(results)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for name, draw in figures.FIGURES:
        figure = draw(plt, results, colors)
        if figure is None:
            continue
        assert figure._suptitle.get_text().endswith(" on tiny"), name
        figure.canvas.draw()
        title_bottom = figure._suptitle.get_window_extent().y0
        for axis in figure.axes:
            if axis.get_title():
                assert axis.title.get_window_extent().y1 <= title_bottom, name
            if axis.get_xlabel().startswith("layer"):
                ticks = [t for t in axis.get_xticks() if axis.get_xlim()[0] <= t <= axis.get_xlim()[1]]  # fmt: skip
                assert all(float(t).is_integer() for t in ticks), (name, ticks)
        plt.close(figure)


def test_legends_name_checkpoints_by_labels_or_numbered_models(checkpoints, tmp_path, capsys):
    """Issue 69: legends used whole checkpoint names (``BSARec-tiny-Nov-28-...``) and
    there was no --labels."""
    from recbole_freq.jobs.analyze.measures import label_results

    results = [{"model": "BSARec", "checkpoint": "a.pth"}, {"model": "BSARec", "checkpoint": "b.pth"},
               {"model": "SASRec", "checkpoint": "c.pth"}]  # fmt: skip
    label_results(results)
    assert [r["label"] for r in results] == ["BSARec 1", "BSARec 2", "SASRec"]
    out = tmp_path / "figures"
    args = ["--analyze", checkpoints["SASRec"], checkpoints["BSARec"], "--out", str(out)]
    assert main([*args, "--labels", "baseline,ours"]) == 0
    report = json.loads((out / "analysis.json").read_text())
    assert [r["label"] for r in report["checkpoints"]] == ["baseline", "ours"]
    capsys.readouterr()
    assert main([*args, "--labels", "only-one"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--labels names 1 checkpoint(s) for the 2 given" in err[0]


def test_legends_and_labels_cover_no_panel_title_or_label(checkpoints):
    """Issue 69: spectral_response's legend covered the y label and part of a panel, and
    in bsarec_beta a panel's x label ran into the next panel's title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from recbole_freq.jobs.analyze import figures
    from recbole_freq.jobs.analyze.measures import analyse_checkpoint, label_results

    results = [analyse_checkpoint(checkpoints[m], max_sequences=20) for m in ("BSARec", "BSARec")]
    label_results(results)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def overlap(a, b):
        return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1

    drawn = dict(figures.FIGURES)
    spectral = drawn["spectral_response.png"](plt, results, colors)
    spectral.canvas.draw()
    renderer = spectral.canvas.get_renderer()
    (legend,) = spectral.legends or [a.get_legend() for a in spectral.axes if a.get_legend()]
    legend = legend.get_window_extent(renderer)
    for axis in spectral.axes:
        assert not overlap(legend, axis.get_window_extent(renderer))
        assert not overlap(legend, axis.yaxis.label.get_window_extent(renderer))
    plt.close(spectral)
    beta = drawn["bsarec_beta.png"](plt, results, colors)
    beta.canvas.draw()
    renderer = beta.canvas.get_renderer()
    panels = [axis for axis in beta.axes if axis.get_title()]
    for upper, lower in zip(panels, panels[1:]):
        below = upper.xaxis.label.get_window_extent(renderer)
        assert not overlap(below, lower.title.get_window_extent(renderer))
    plt.close(beta)
