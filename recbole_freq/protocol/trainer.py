"""The trainer side of a protocol: ``ProtocolTrainer`` mixed into RecBole's trainer of
the model (history masks in full-sort ranking, the stopping rule, per-user ranks) and
the sampled losses of ``train_loss``: ``bce``, binary cross-entropy against one
negative, SASRec's at every position of ``train_rows: last_n_all_positions`` and the
BSARec / FMLP-Rec authors' at the last position of other rows; ``bpr``, their GRU4Rec's
Bayesian personalised ranking against one negative at the last position.  A model's own
regularisation (Caser's L2 terms) is added to either, as the model adds it to its own
loss."""

from __future__ import annotations

import math

import numpy as np
import torch

from recbole_freq.protocol.losses import (
    SAMPLED_LOSSES,
    all_position_output,
    check_causal,
    check_plain_objective,
    drives_objective,
    item_embedding_weight,
    last_position_output,
    objective_loss,
    position_loss,
    position_negatives,
    regularisation,
    row_negatives,
)
from recbole_freq.protocol.pieces import ALL_POSITIONS, ProtocolError, protocol_settings
from recbole_freq.protocol.rows import (
    HISTORY_LENGTH,
    HISTORY_START,
    POSITION_TARGETS,
    UserHistories,
)


class _RecordingEvaluator:
    """RecBole's ``Evaluator`` that keeps the last top-k structure it evaluated (the
    per-user hits ``ProtocolTrainer.per_user_ranks`` reads)."""

    def __init__(self, evaluator):
        self.evaluator = evaluator
        self.last_topk = None

    def evaluate(self, struct):
        self.last_topk = struct["rec.topk"] if "rec.topk" in struct else None
        return self.evaluator.evaluate(struct)

    def __getattr__(self, name):
        return getattr(self.evaluator, name)


# Mixed-precision types of `amp_dtype` (with RecBole's `enable_amp`).
AMP_DTYPES = ("bfloat16", "float16")


class ProtocolTrainer:
    """Mixin over RecBole's trainer class of the model (``protocol_trainer``): the history
    mask in full-sort ranking and the stopping rule.  With RecBole's choices every method
    is RecBole's own."""

    def _init_protocol(self, config):
        self.evaluator = _RecordingEvaluator(self.evaluator)
        settings = protocol_settings(config)
        self.history_mask = settings["history_mask"]
        self.stopping_rule = settings["stopping_rule"]
        self.train_rows = settings["train_rows"]
        self.train_loss = settings["train_loss"]
        self._causality_checked = False
        if self.train_loss in SAMPLED_LOSSES:
            check_plain_objective(self.model, config)
        self._eval_histories = None
        self._strict_best = None
        self.amp_dtype = config["amp_dtype"]
        if self.amp_dtype not in (None, *AMP_DTYPES):
            raise ValueError(
                f"amp_dtype={self.amp_dtype!r} is not a mixed-precision type: use one of "
                f"{', '.join(AMP_DTYPES)} (with enable_amp: True)"
            )
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

    def _build_optimizer(self, **kwargs):
        # A model may give parameter groups with their own learning rates (Rec-Denoiser's
        # mask_learning_rate); RecBole's optimizers take them as `params`.
        groups = getattr(self.model, "optimizer_parameter_groups", None)
        if "params" not in kwargs and groups is not None:
            chosen = groups()
            if chosen is not None:
                kwargs["params"] = chosen
        return super()._build_optimizer(**kwargs)

    def _train_epoch(self, train_data, epoch_idx, loss_func=None, show_progress=False):
        if self.train_loss in SAMPLED_LOSSES and loss_func is None:
            self._train_items = train_data._dataset
            if self.train_rows == ALL_POSITIONS:
                loss_func = self.all_positions_loss
            else:
                loss_func = self.last_position_loss
        if not (self.enable_amp and self.amp_dtype):
            return super()._train_epoch(
                train_data, epoch_idx, loss_func=loss_func, show_progress=show_progress
            )
        # RecBole's epoch opens `torch.autocast(device_type)` without a dtype, which takes
        # the device's default: amp_dtype sets that default for the epoch.
        device_type = self.device.type
        previous = torch.get_autocast_dtype(device_type)
        torch.set_autocast_dtype(device_type, getattr(torch, self.amp_dtype))
        try:
            return super()._train_epoch(
                train_data, epoch_idx, loss_func=loss_func, show_progress=show_progress
            )
        finally:
            torch.set_autocast_dtype(device_type, previous)

    def all_positions_loss(self, interaction):
        """SASRec's loss (its ``model.py``; Rec-Denoiser eq. 4): at every position with a
        target, ``-log s(r_pos) - log(1 - s(r_neg))`` with one negative drawn among the
        items outside the user's training part, averaged over those positions."""
        model = self.model
        if not self._causality_checked:
            check_causal(model, interaction)
            self._causality_checked = True
        targets = interaction[POSITION_TARGETS]
        negatives = position_negatives(self._train_items, interaction, targets, model)
        if drives_objective(model):
            return objective_loss(model, interaction, targets, negatives, all_positions=True)
        output = all_position_output(model, interaction)
        loss = position_loss(output, targets, negatives, item_embedding_weight(model), "bce")
        return loss + regularisation(model)

    def last_position_loss(self, interaction):
        """The BSARec and FMLP-Rec authors' loss for their baselines (yehjin-shin/BSARec,
        ``src/model/sasrec.py``, ``caser.py``, ``fmlprec.py``: ``-log s(r_pos) - log(1 -
        s(r_neg))``; ``gru4rec.py``: ``-log(1e-10 + s(r_pos - r_neg))``): the output at
        the row's last position against one negative drawn among the items outside the
        row (``dataset.py``, ``neg_sample(set(items))``), averaged over the rows, plus the
        model's own regularisation (``regularisation``)."""
        model = self.model
        item_seq = interaction[model.ITEM_SEQ]
        targets = interaction[model.POS_ITEM_ID]
        negatives = row_negatives(item_seq, targets, model.n_items)
        if drives_objective(model):
            return objective_loss(
                model, interaction, targets[:, None], negatives[:, None], all_positions=False
            )
        output = last_position_output(model, interaction)
        loss = position_loss(
            output[:, None],
            targets[:, None],
            negatives[:, None],
            item_embedding_weight(model),
            self.train_loss,
        )
        return loss + regularisation(model)

    def evaluate(self, eval_data, load_best_model=True, model_file=None, show_progress=False):
        """RecBole's evaluation; in a data-parallel run (``recbole_freq.quick_start.distributed``)
        global rank 0 evaluates every row and the others receive its result, so the
        metrics are one process's on the same weights."""
        self._eval_histories = getattr(eval_data._dataset, "protocol_histories", None)
        self._eval_data = eval_data
        if self.config["single_spec"] is not False:
            return super().evaluate(eval_data, load_best_model, model_file, show_progress)
        from recbole_freq.utils.process_group import broadcast_from_writer, writing_rank

        result = None
        if writing_rank(self.config):
            result = super().evaluate(eval_data, load_best_model, model_file, show_progress)
        return broadcast_from_writer(result)

    def _map_reduce(self, result, num_sample):
        # The evaluation loaders of a data-parallel run are whole (`evaluate`): the
        # writing rank's result is already every row's.
        return result

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

    def _full_sort_batch_eval(self, batched_data):
        if self.history_mask == "none":
            return super()._full_sort_batch_eval(batched_data)
        interaction, _, positive_u, positive_i = batched_data
        histories = self._eval_histories
        if histories is None or HISTORY_LENGTH not in interaction:
            raise ProtocolError(
                f"history_mask={self.history_mask} needs loaders built by "
                "quick_start.load_splits (they carry each row's history)"
            )
        rows, items = history_index(interaction, histories)
        if self.history_mask == "exclude":
            return super()._full_sort_batch_eval(
                (interaction, (rows, items), positive_u, positive_i)
            )
        scores = self.model.full_sort_predict(interaction.to(self.device))
        scores = scores.view(-1, self.tot_item_num).clone()
        scores[rows.to(scores.device), items.to(scores.device)] = 0.0
        return interaction, scores, positive_u, positive_i

    def _valid_epoch(self, valid_data, show_progress=False):
        if self.stopping_rule != "strict":
            return super()._valid_epoch(valid_data, show_progress=show_progress)
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


def history_index(interaction, histories: UserHistories):
    """``(rows, items)``: every item of each row's history before its target."""
    return histories.items_of(interaction[HISTORY_START], interaction[HISTORY_LENGTH])


_TRAINER_CLASSES: dict[type, type] = {}


def protocol_trainer(config, model):
    """RecBole's trainer for ``model`` (``get_trainer``) with ``ProtocolTrainer`` mixed in."""
    from recbole.utils import get_trainer

    base = get_trainer(config["MODEL_TYPE"], config["model"])
    cls = _TRAINER_CLASSES.get(base)
    if cls is None:
        cls = type(base.__name__, (ProtocolTrainer, base), {"__module__": __name__})
        _TRAINER_CLASSES[base] = cls
    trainer = cls(config, model)
    trainer._init_protocol(config)
    return trainer
