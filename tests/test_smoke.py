"""Every registered model through the whole pipeline: train one epoch, evaluate, reload."""

import math

import pytest
import torch

from conftest import without_transformer_settings
from recbole_freq.checkpoint.loader import weights_fingerprint
from recbole_freq.model import MODELS
from recbole_freq.model.abstract_recommender import TransformerRecommender
from recbole_freq.quick_start.quick_start import REPORTED_METRICS, run
from recbole_freq.quick_start.restore import restore_model


@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_model_trains_evaluates_and_reloads(small_config, model):
    if not issubclass(MODELS[model], TransformerRecommender):  # the count baseline
        small_config = without_transformer_settings(small_config)
    if model == "FEARec":  # int(10 ln 12) delays would not fit these short rows
        small_config = dict(small_config, topk_factor=3)
    summary = run(model, "tiny", cmd_overrides=dict(small_config, epochs=1))
    assert summary["epochs_run"] == 1
    test = summary["test_result"]
    assert set(REPORTED_METRICS) <= set(test)
    assert all(0.0 <= value <= 1.0 and not math.isnan(value) for value in test.values())

    restored, config, _, (_, _, test_data), checkpoint = restore_model(summary["checkpoint"])
    assert type(restored).__name__ == model and not restored.training
    assert checkpoint["weights_sha256"] == summary["weights_sha256"]
    assert weights_fingerprint(restored.state_dict()) == summary["weights_sha256"]
    batch = next(iter(test_data))[0]
    with torch.no_grad():
        scores = restored.full_sort_predict(batch)
    assert scores.shape == (len(batch), restored.n_items) and torch.isfinite(scores).all()
