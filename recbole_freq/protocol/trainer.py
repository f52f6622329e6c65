"""``FreqTrainer``: the one trainer every run, search trial and evaluation uses.

It is RecBole's ``Trainer`` with the plugin's hooks written as its own methods.  RecBole
asks for a model's trainer through ``get_trainer``; ``trainer_for(config, model)``
answers instead: ``FreqTrainer`` itself for every model RecBole trains with its
``Trainer`` (all sequential models, the plugin's and RecBole's).  A RecBole built-in
with a trainer of its own derived from ``Trainer`` (``S3RecTrainer``, ``KGTrainer``,
``TraditionalTrainer``, ...) gets the class ``(FreqTrainer, ThatTrainer)``, built once:
Python's method order puts these hooks first and each one's ``super()`` call reaches
that trainer's own method, so the same hooks run in front of it.  A trainer that is not
a ``Trainer`` (``DecisionTreeTrainer`` of XGBoost and LightGBM) is refused before any
data is loaded (``quick_start.preflight``).

The hooks, each a method (or a callable attribute the caller sets):

- **Sampled loss** (``_train_epoch``): under ``train_loss: bce`` / ``bpr`` an epoch
  trains with the protocol's ``SampledLoss`` instead of ``model.calculate_loss``, under
  ``masked_next`` with ``MaskedNextLoss`` (RecBole's BERT4Rec as the BSARec authors
  train it; ``protocol.losses``); with ``amp_dtype`` the epoch's autocast takes that type.
- **Optimizer groups** (``_build_optimizer``): a plugin model's own parameter groups
  (Rec-Denoiser's ``mask_learning_rate``), and Adam's ``adam_beta2`` (SASRec's code
  trains with 0.98, torch's default is 0.999).
- **Epoch record** (``_train_epoch``, ``_valid_epoch``): ``history`` gets each epoch's
  loss, seconds of training and of validation, validation metrics and the model's ``epoch_report``; ``best_epoch``
  and ``train_seconds`` read it.
- **Resume state** (``before_epoch(epoch)``, set by the caller): runs before every epoch
  after the first of this segment, once all earlier ones are complete; the run writes
  its resume state there (``quick_start.resume``).  ``after_valid(record)`` runs after
  each validation with the epoch's record.
- **Models without gradients** (``__init__``, ``_train_epoch``): a model whose class says
  ``learns_by_gradient = False`` (the count baseline ``TransitionCount``, fixed when it is
  built) runs one epoch that trains nothing and validates once.
- **Stopping rule** (``_valid_epoch``, ``fit``): ``stopping_rule: strict`` stops after
  ``stopping_step`` epochs without a strict improvement on unrounded metrics, as the
  BSARec authors' code does; RecBole's rule otherwise.
- **Best weights in memory** (``_save_checkpoint``, ``evaluate``): the weights of the
  checkpoint saved last are kept, and the test evaluation restores them instead of
  reading the file back (the file at that path may have been replaced since).
- **History mask** (``_full_sort_batch_eval``): ``history_mask: exclude`` / ``zero``
  removes each row's earlier items from its full-sort scores.
- **Sampled scoring** (``_neg_sample_batch_eval``): sampled evaluation (``uni100``)
  reads each candidate's score off one full-sort pass per distinct sequence
  (``protocol.sampled_scoring``), instead of re-encoding the sequence per candidate.
- **Per-user ranks** (``per_user_ranks``): each user's rank of the target in the last
  evaluation, from RecBole's own top-k structure (for significance tests).
- **Data-parallel evaluation** (``evaluate``, ``_map_reduce``): rank 0 evaluates every
  row and the others receive its result.
- **Fast step** (``_train_epoch``, ``evaluate``, ``_full_sort_batch_eval``):
  ``overlap_loader`` collates the next batches in a background thread (on CUDA: pinned
  and copied without blocking), ``compile_step`` compiles the loss and the full-sort
  scores for full batches (CUDA graphs on CUDA); ``protocol.fast_step``.
"""

from __future__ import annotations

import copy
import logging
import math
import time

import numpy as np
import torch
from recbole.model.abstract_recommender import SequentialRecommender
from recbole.trainer import Trainer
from recbole.utils import EvaluatorType

from recbole_freq.model.abstract_recommender import TransformerRecommender
from recbole_freq.protocol.fast_step import StaticShapeSteps, prefetching, train_pass
from recbole_freq.protocol.losses import (
    MASKED_NEXT,
    SAMPLED_LOSSES,
    MaskedNextLoss,
    SampledLoss,
)
from recbole_freq.protocol.pieces import ProtocolError, protocol_settings
from recbole_freq.protocol.rows import HISTORY_LENGTH, HISTORY_START, UserHistories
from recbole_freq.protocol.sampled_scoring import SampledScorer, batch_sampled_collate
from recbole_freq.utils.options import as_number
from recbole_freq.utils.process_group import broadcast_from_writer, writing_rank

# Mixed-precision types of `amp_dtype` (with RecBole's `enable_amp`).
AMP_DTYPES = ("bfloat16", "float16")


class _RecordingEvaluator:
    """RecBole's ``Evaluator`` that keeps the last top-k structure it evaluated (the
    per-user hits ``FreqTrainer.per_user_ranks`` reads)."""

    def __init__(self, evaluator):
        self.evaluator = evaluator
        self.last_topk = None

    def evaluate(self, struct):
        self.last_topk = struct["rec.topk"] if "rec.topk" in struct else None
        return self.evaluator.evaluate(struct)

    def __getattr__(self, name):
        return getattr(self.evaluator, name)


class FreqTrainer(Trainer):
    """RecBole's ``Trainer`` with the plugin's hooks (module docstring).  With RecBole's
    choices of every protocol piece, training and evaluation are RecBole's own."""

    def __init__(self, config, model):
        super().__init__(config, model)
        settings = protocol_settings(config)
        self.history_mask = settings["history_mask"]
        self.stopping_rule = settings["stopping_rule"]
        self.amp_dtype = config["amp_dtype"]
        if self.amp_dtype not in (None, *AMP_DTYPES):
            raise ValueError(
                f"amp_dtype={self.amp_dtype!r} is not a mixed-precision type: use one of "
                f"{', '.join(AMP_DTYPES)} (with enable_amp: True)"
            )
        self.sampled_loss = None
        self.learns = getattr(model, "learns_by_gradient", True)
        if not self.learns:
            self.epochs = 1  # nothing changes between epochs: one validation says it all
        elif settings["train_loss"] in SAMPLED_LOSSES:
            self.sampled_loss = SampledLoss(model, config)
        elif settings["train_loss"] == MASKED_NEXT:
            self.sampled_loss = MaskedNextLoss(model, config)
        self.evaluator = _RecordingEvaluator(self.evaluator)
        self.sampled_scorer = (
            SampledScorer(model) if isinstance(model, SequentialRecommender) else None
        )
        self._eval_histories = None
        self._eval_data = None
        self._strict_best = None
        if self.stopping_rule == "strict":
            from recbole.evaluator import Evaluator

            # The authors stop after `patience` epochs without improvement; RecBole's
            # `early_stopping` after stopping_step + 1.
            self.stopping_step = max(int(config["stopping_step"]) - 1, 0)
            # The few settings RecBole's Evaluator reads, with more decimal places.
            view = dict(
                metrics=config["metrics"],
                topk=config["topk"],
                metric_decimal_place=12,
                tail_ratio=config["tail_ratio"],
            )
            self._unrounded_evaluator = Evaluator(view)
        # Epoch record and resume state.
        self.history: list[dict] = []
        self.train_seconds = 0.0
        # Wall time of a resumed run's earlier segments (each up to its last resume state;
        # None when that state predates the count) and how many segments the run had.
        self.run_start = time.perf_counter()
        self.earlier_seconds: float | None = 0.0
        self.segments = 1
        # What decided the numbers of a resumed run's earlier segments (a run may
        # continue on another machine: a GPU's epochs, then a CPU's).
        self.earlier_environments: list[dict] = []
        self.current_epoch = 0
        self.before_epoch = None
        self.after_valid = None
        self.best_in_memory: dict | None = None
        self.overlap_loader = bool(config["overlap_loader"])
        self.fast_steps = None
        if config["compile_step"]:
            self.fast_steps = StaticShapeSteps(
                model,
                self.device,
                mode=config["compile_mode"],
                backend=config["compile_backend"] or "inductor",
            )

    # --- training -------------------------------------------------------------------

    def _build_optimizer(self, **kwargs):
        # Parameter groups with their own learning rates (Rec-Denoiser's
        # mask_learning_rate); RecBole's optimizers take them as `params`.
        if "params" not in kwargs and isinstance(self.model, TransformerRecommender):
            groups = self.model.optimizer_parameter_groups()
            if groups is not None:
                kwargs["params"] = groups
        optimizer = super()._build_optimizer(**kwargs)
        beta2 = adam_beta2(self.config, kwargs.get("learner", self.learner))
        if beta2 is not None:
            for group in optimizer.param_groups:
                group["betas"] = (group["betas"][0], beta2)
        return optimizer

    def _train_epoch(self, train_data, epoch_idx, loss_func=None, show_progress=False):
        self.current_epoch = epoch_idx
        if self.before_epoch is not None and epoch_idx > self.start_epoch:
            self.before_epoch(epoch_idx)
        if self.sampled_loss is not None and loss_func is None:
            self.sampled_loss.training_dataset = train_data._dataset
            loss_func = self.sampled_loss
        start = time.perf_counter()
        if self.learns:
            if self.overlap_loader:
                train_data = prefetching(train_data, self.device)
            if self.fast_steps is not None:
                self.fast_steps.new_pass("train")
                loss_func = self.fast_steps.loss(loss_func or self.model.calculate_loss)
            loss = self._train_epoch_in_amp_dtype(train_data, epoch_idx, loss_func, show_progress)
        else:
            loss = 0.0
        seconds = time.perf_counter() - start
        self.train_seconds += seconds
        total = sum(loss) if isinstance(loss, tuple) else loss
        self.history.append(
            {"epoch": len(self.history), "train_loss": float(total), "train_seconds": seconds}
        )
        self._record_model_report(epoch_idx)
        return loss

    def _train_epoch_in_amp_dtype(self, train_data, epoch_idx, loss_func, show_progress):
        if not (self.enable_amp and self.amp_dtype):
            return self._one_pass(train_data, epoch_idx, loss_func, show_progress)
        # RecBole's epoch opens `torch.autocast(device_type)` without a dtype, which takes
        # the device's default: amp_dtype sets that default for the epoch.
        device_type = self.device.type
        previous = torch.get_autocast_dtype(device_type)
        torch.set_autocast_dtype(device_type, getattr(torch, self.amp_dtype))
        try:
            return self._one_pass(train_data, epoch_idx, loss_func, show_progress)
        finally:
            torch.set_autocast_dtype(device_type, previous)

    def _one_pass(self, train_data, epoch_idx, loss_func, show_progress):
        # RecBole's own loop where a built-in's trainer (FreqX of trainer_class) has its
        # own epoch; the loop without per-step waits for the device otherwise.
        following = super()._train_epoch
        if getattr(following, "__func__", None) is not Trainer._train_epoch:
            return following(
                train_data, epoch_idx, loss_func=loss_func, show_progress=show_progress
            )
        return train_pass(self, train_data, epoch_idx, loss_func, show_progress)

    def _record_model_report(self, epoch_idx) -> None:
        # What a plugin model reports of each epoch (how many links the denoising masks
        # prune), kept with the epoch and logged.
        if not isinstance(self.model, TransformerRecommender):
            return
        report = self.model.epoch_report()
        if not report:
            return
        self.history[-1]["model_report"] = report
        described = ", ".join(
            f"{key} {' / '.join(f'{value:.3f}' for value in values)}"
            for key, values in report.items()
        )
        model_name = type(self.model).__name__
        logging.getLogger().info(f"epoch {epoch_idx} {model_name}: {described}")

    def _valid_epoch(self, valid_data, show_progress=False):
        start = time.perf_counter()
        if self.stopping_rule == "strict":
            score, result = self._strict_valid_epoch(valid_data, show_progress)
        else:
            score, result = super()._valid_epoch(valid_data, show_progress=show_progress)
        self.history[-1].update(
            valid_score=float(score),
            valid=dict(result),
            valid_seconds=time.perf_counter() - start,
        )
        if self.after_valid is not None:
            self.after_valid(self.history[-1])
        return score, result

    def _strict_valid_epoch(self, valid_data, show_progress):
        rounded, self.evaluator = self.evaluator, self._unrounded_evaluator
        try:
            score, result = super()._valid_epoch(valid_data, show_progress=show_progress)
        finally:
            self.evaluator = rounded
        previous = self.best_valid_score if self._strict_best is None else self._strict_best
        bigger = self.valid_metric_bigger
        if (score > previous) if bigger else (score < previous):
            self._strict_best = score
        else:
            self._strict_best = previous
        # RecBole's early_stopping, called next, counts `score >= best` as an improvement;
        # against the float just after the previous best that is exactly `score > best`.
        self.best_valid_score = math.nextafter(previous, math.inf if bigger else -math.inf)
        return score, result

    def fit(self, *args, **kwargs):
        best_score, best_result = super().fit(*args, **kwargs)
        if self.stopping_rule == "strict" and self._strict_best is not None:
            self.best_valid_score = best_score = self._strict_best
        return best_score, best_result

    @property
    def best_epoch(self) -> int | None:
        """The epoch whose checkpoint the trainer kept: RecBole's early stopping counts a
        tie as an improvement (the last epoch reaching the best), the strict rule does
        not (the first)."""
        scored = [e for e in self.history if "valid_score" in e]
        if not scored:
            return None
        pick = max if self.valid_metric_bigger else min
        best = pick(e["valid_score"] for e in scored)
        reached = [e["epoch"] for e in scored if e["valid_score"] == best]
        return reached[0] if self.stopping_rule == "strict" else reached[-1]

    def _save_checkpoint(self, epoch, verbose=True, **kwargs):
        if not writing_rank(self.config):
            return  # RecBole's test (local_rank) would let rank 0 of every machine write
        target = kwargs.get("saved_model_file", self.saved_model_file)
        super()._save_checkpoint(epoch, verbose=verbose, **kwargs)
        self.best_in_memory = {
            "file": str(target),
            "state_dict": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "other_parameter": copy.deepcopy(self.model.other_parameter()),
        }

    # --- evaluation -----------------------------------------------------------------

    def evaluate(self, eval_data, load_best_model=True, model_file=None, show_progress=False):
        """RecBole's evaluation on the best weights kept in memory; in a data-parallel
        run (``quick_start.distributed``) global rank 0 evaluates every row and the
        others receive its result, so the metrics are one process's on the same
        weights."""
        self._eval_histories = getattr(eval_data._dataset, "protocol_histories", None)
        self._eval_data = eval_data
        if eval_data:
            batch_sampled_collate(eval_data)
        if self.overlap_loader and eval_data:
            eval_data = prefetching(eval_data, self.device)
        if self.fast_steps is not None:
            self.fast_steps.new_pass("eval")
        saved = self.best_in_memory
        wanted = str(model_file or self.saved_model_file)
        if load_best_model and eval_data and saved is not None and saved["file"] == wanted:
            self.model.load_state_dict(saved["state_dict"])
            self.model.load_other_parameter(saved["other_parameter"])
            load_best_model = False
        if self.config["single_spec"] is not False:
            return super().evaluate(eval_data, load_best_model, model_file, show_progress)
        result = None
        if writing_rank(self.config):
            result = super().evaluate(eval_data, load_best_model, model_file, show_progress)
        return broadcast_from_writer(result)

    def _map_reduce(self, result, num_sample):
        # The evaluation loaders of a data-parallel run are whole (`evaluate`): the
        # writing rank's result is already every row's.
        return result

    def _full_sort_predict(self, interaction):
        interaction = interaction.to(self.device)
        if self.fast_steps is not None:
            return self.fast_steps.full_sort_predict(interaction)
        return self.model.full_sort_predict(interaction)

    def _full_sort_batch_eval(self, batched_data):
        interaction, seen, positive_u, positive_i = batched_data
        if self.history_mask != "none":
            histories = self._eval_histories
            if histories is None or HISTORY_LENGTH not in interaction:
                raise ProtocolError(
                    f"history_mask={self.history_mask} needs loaders built by "
                    "quick_start.load_splits (they carry each row's history)"
                )
            rows, items = history_index(interaction, histories)
            if self.history_mask == "zero":
                scores = self._full_sort_predict(interaction)
                scores = scores.view(-1, self.tot_item_num).clone()
                scores[rows.to(scores.device), items.to(scores.device)] = 0.0
                return interaction, scores, positive_u, positive_i
            seen = (rows, items)  # exclude
        if self.fast_steps is None:
            return super()._full_sort_batch_eval((interaction, seen, positive_u, positive_i))
        # RecBole's, with the compiled scores.
        scores = self._full_sort_predict(interaction).view(-1, self.tot_item_num)
        scores[:, 0] = -np.inf
        if seen is not None:
            scores[seen] = -np.inf
        return interaction, scores, positive_u, positive_i

    def _neg_sample_batch_eval(self, batched_data):
        # RecBole's, with each block of rows scored by the sampled scorer.
        if self.sampled_scorer is None:
            return super()._neg_sample_batch_eval(batched_data)
        interaction, row_idx, positive_u, positive_i = batched_data
        size = self.test_batch_size
        blocks = [interaction[start : start + size] for start in range(0, len(interaction), size)]
        scores = torch.cat(
            [self.sampled_scorer(block.to(self.device)).reshape(-1) for block in blocks]
        )
        if self.config["eval_type"] == EvaluatorType.VALUE:
            return interaction, scores, positive_u, positive_i
        col_idx = interaction[self.config["ITEM_ID_FIELD"]]
        ranked = torch.full(
            (positive_u[-1] + 1, self.tot_item_num), -np.inf, device=self.device, dtype=scores.dtype
        )  # a count model's exact float64 scores stay exact
        ranked[row_idx, col_idx] = scores
        return interaction, ranked, positive_u, positive_i

    def per_user_ranks(self) -> dict | None:
        """Each user's rank of the target in the last evaluation, from RecBole's own top-k
        structure (``rec.topk``): ``{"users": tokens, "rank": ranks, "topk": k}`` with
        rank 0 where the target is not in the top ``k`` (the largest cut-off); ``None``
        if no top-k metric was computed."""
        topk = self.evaluator.last_topk
        if topk is None:
            return None
        hits = topk[:, :-1].bool()
        first = hits.int().argmax(dim=1) + 1
        ranks = torch.where(hits.any(dim=1), first, torch.zeros_like(first))
        loader = self._eval_data
        dataset = loader._dataset
        if hasattr(loader, "uid_list") and getattr(loader, "neg_sample_num", 0):
            users = np.asarray(loader.uid_list)
        else:
            users = dataset.inter_feat[dataset.uid_field].numpy()
        if len(users) != len(ranks):
            return None
        tokens = dataset.id2token(dataset.uid_field, users)
        return {
            "users": [str(token) for token in tokens],
            "rank": ranks.tolist(),
            "topk": hits.size(1),
        }


def history_index(interaction, histories: UserHistories):
    """``(rows, items)``: every item of each row's history before its target."""
    return histories.items_of(interaction[HISTORY_START], interaction[HISTORY_LENGTH])


_TRAINER_CLASSES: dict[type, type] = {Trainer: FreqTrainer}


def adam_beta2(config, learner: str) -> float | None:
    """``adam_beta2`` for an Adam learner (``adam``, ``adamw``); None where it leaves
    the optimizer as RecBole builds it.  Another learner with a value other than torch's
    0.999 is refused: the setting would do nothing."""
    value = config["adam_beta2"] if "adam_beta2" in config else None
    if value is None:
        return None
    number = as_number(value)
    if isinstance(value, bool) or not 0.0 <= number < 1.0:
        raise ValueError(f"adam_beta2={value!r} must be a number in [0, 1), e.g. 0.98 or 0.999")
    if str(learner).lower() not in ("adam", "adamw"):
        if number != 0.999:
            raise ValueError(
                f"adam_beta2={value!r} applies to learner adam or adamw, not {learner!r}"
            )
        return None
    return number


def trainer_class(config) -> type:
    """``FreqTrainer``, or for a RecBole built-in with a trainer of its own the class
    ``(FreqTrainer, ThatTrainer)`` (module docstring)."""
    from recbole.utils import get_trainer

    base = get_trainer(config["MODEL_TYPE"], config["model"])
    if not issubclass(base, Trainer):
        # The hooks are methods of RecBole's Trainer; XGBoost's and LightGBM's
        # DecisionTreeTrainer has none of them.
        raise ValueError(
            f"{config['model']} trains with RecBole's {base.__name__}, which is not a "
            "Trainer and takes none of the plugin's hooks; train it with RecBole's run_recbole"
        )
    if base not in _TRAINER_CLASSES:
        _TRAINER_CLASSES[base] = type(
            f"Freq{base.__name__}", (FreqTrainer, base), {"__module__": __name__}
        )
    return _TRAINER_CLASSES[base]


def trainer_for(config, model) -> FreqTrainer:
    """The trainer of ``model`` under ``config`` (RecBole's ``get_trainer(...)(config,
    model)`` for the plugin)."""
    return trainer_class(config)(config, model)
