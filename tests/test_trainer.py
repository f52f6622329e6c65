"""The one trainer (``protocol.trainer.FreqTrainer``): its hooks are its own methods, so a
run patches no trainer or model instance; a RecBole built-in with a trainer of its own
gets the same hooks in front of that trainer; sampled evaluation goes through the
sampled scorer; the epoch record and best weights are the trainer's."""

import pytest
import torch
from recbole.trainer import Trainer

from conftest import prepare, without_transformer_settings
from recbole_freq.protocol import FreqTrainer, trainer_for
from recbole_freq.protocol.sampled_scoring import SampledScorer
from recbole_freq.protocol.trainer import trainer_class
from recbole_freq.quick_start.quick_start import new_model, run


def patched_members(instance, cls) -> list[str]:
    """Names the instance's own ``__dict__`` binds to a callable where its class defines
    a method of that name: methods replaced on the instance."""
    return sorted(
        name
        for name, value in vars(instance).items()
        if callable(value) and callable(getattr(cls, name, None))
    )


@pytest.mark.parametrize(
    "model, protocol", [("SASRec", "sasrec"), ("BSARec", "bsarec"), ("GRU4Rec", "bsarec")]
)
def test_a_run_patches_no_trainer_or_model_method(small_config, model, protocol):
    overrides = dict(small_config, epochs=2, protocol=protocol)
    if model == "GRU4Rec":  # the BSARec authors' GRU4Rec: BPR against one negative
        overrides = dict(without_transformer_settings(overrides), train_loss="bpr")
    config, train, valid, test = prepare(model, overrides)
    built = new_model(config, train)
    trainer = trainer_for(config, built)
    assert type(trainer) is FreqTrainer
    trainer.fit(train, valid, saved=True, show_progress=False)
    result = trainer.evaluate(test, load_best_model=True, show_progress=False)
    assert "ndcg@10" in result or "ndcg@20" in result
    assert patched_members(trainer, type(trainer)) == []
    assert patched_members(built, type(built)) == []
    # The epoch record is the trainer's own, and the test ran on the weights kept.
    assert [epoch["epoch"] for epoch in trainer.history] == [0, 1]
    assert all("valid_score" in epoch for epoch in trainer.history)
    assert trainer.best_in_memory["file"] == trainer.saved_model_file
    assert trainer.best_epoch in (0, 1)


def test_sampled_evaluation_reads_the_full_sort_scores(small_config):
    """Under uni100 the trainer scores candidates with the sampled scorer: one full-sort
    pass per distinct sequence, checked once against the model's own ``predict``."""
    config, train, _, test = prepare("SASRec", dict(small_config, protocol="sasrec"))
    model = new_model(config, train)
    trainer = trainer_for(config, model)
    assert isinstance(trainer.sampled_scorer, SampledScorer)
    calls = []
    full_sort = type(model).full_sort_predict

    class Counting(type(model)):
        def full_sort_predict(self, interaction):
            calls.append(len(interaction))
            return full_sort(self, interaction)

    model.__class__ = Counting
    trainer.evaluate(test, load_best_model=False, show_progress=False)
    assert calls and trainer.sampled_scorer.verified and trainer.sampled_scorer.consistent
    rows = sum(len(batch[0]) for batch in test)
    assert sum(calls) * 50 < rows  # one pass per user, not one per candidate row


def test_a_recbole_trainer_of_its_own_gets_the_same_hooks(small_config, monkeypatch):
    """A built-in whose RecBole trainer is another class (``KGTrainer``, ...) trains
    with ``(FreqTrainer, ThatTrainer)``: the hooks run first, then that trainer's own
    methods (here one that counts its epochs)."""
    import recbole.utils

    epochs = []

    class OwnTrainer(Trainer):
        def _train_epoch(self, *args, **kwargs):
            epochs.append(1)
            return super()._train_epoch(*args, **kwargs)

    monkeypatch.setattr(recbole.utils, "get_trainer", lambda model_type, name: OwnTrainer)
    overrides = dict(small_config, epochs=2)
    config, train, valid, _ = prepare("SASRec", overrides)
    cls = trainer_class(config)
    assert cls.__mro__[1:3] == (FreqTrainer, OwnTrainer) and trainer_class(config) is cls
    trainer = cls(config, new_model(config, train))
    trainer.fit(train, valid, saved=False, show_progress=False)
    assert epochs == [1, 1] and len(trainer.history) == 2


def test_a_recbole_trainer_that_is_no_trainer_is_refused_before_loading(small_config, monkeypatch):
    import recbole.utils
    from recbole.trainer import DecisionTreeTrainer

    from recbole_freq.cli import main

    monkeypatch.setattr(recbole.utils, "get_trainer", lambda *_: DecisionTreeTrainer)
    with pytest.raises(ValueError, match="DecisionTreeTrainer, which is not a Trainer"):
        run("SASRec", "tiny", cmd_overrides=dict(small_config, data_path="/nonexistent"))
    argv = ["--model=SASRec", "--dataset=tiny", *(f"--{k}={v}" for k, v in small_config.items())]
    assert main(argv) == 2


def test_history_and_seconds_reach_the_run_summary(small_config):
    summary = run("BSARec", "tiny", cmd_overrides=dict(small_config, epochs=2), saved=False)
    assert [epoch["epoch"] for epoch in summary["history"]] == [0, 1]
    seconds = [epoch["train_seconds"] for epoch in summary["history"]]
    assert summary["train_seconds_per_epoch"] == pytest.approx(sum(seconds) / 2)
    assert torch.isfinite(torch.tensor([e["train_loss"] for e in summary["history"]])).all()


def test_adam_beta2_reaches_every_parameter_group(small_config):
    """SASRec's code trains with Adam beta2 0.98: ``adam_beta2`` sets it for RecBole's
    models and the plugin's, mask groups included; the default is torch's 0.999."""
    for model_name, extra in (("SASRec", {}), ("RecDenoiser", {"mask_learning_rate": 0.01})):
        for beta2 in (None, 0.98):
            overrides = dict(small_config, **extra)
            if beta2 is not None:
                overrides["adam_beta2"] = beta2
            config, train, _, _ = prepare(model_name, overrides)
            model = new_model(config, train)
            groups = trainer_for(config, model).optimizer.param_groups
            assert len(groups) == (2 if extra else 1)
            assert all(group["betas"] == (0.9, beta2 or 0.999) for group in groups)


def test_adam_beta2_is_refused_where_it_would_do_nothing(small_config):
    config, train, _, _ = prepare("SASRec", dict(small_config, learner="sgd", adam_beta2=0.98))
    with pytest.raises(ValueError, match="adam_beta2=0.98 applies to learner adam or adamw"):
        trainer_for(config, new_model(config, train))
    config, train, _, _ = prepare("SASRec", dict(small_config, adam_beta2=1.0))
    with pytest.raises(ValueError, match=r"adam_beta2=1.0 must be a number in \[0, 1\)"):
        trainer_for(config, new_model(config, train))


def test_a_state_stored_before_adam_beta2_existed_resumes_at_its_default(small_config):
    from recbole_freq.quick_start.resume import settings_differences

    config, _, _, _ = prepare("SASRec", small_config)
    stored, _, _, _ = prepare("SASRec", small_config)
    del stored.final_config_dict["adam_beta2"]
    assert settings_differences(stored, config) == []
    changed, _, _, _ = prepare("SASRec", dict(small_config, adam_beta2=0.98))
    assert settings_differences(stored, changed) == ["adam_beta2: None then, 0.98 now"]
