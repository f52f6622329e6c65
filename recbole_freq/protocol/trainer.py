"""The trainer side of a protocol: ``ProtocolTrainer`` mixed into RecBole's trainer of
the model (history masks in full-sort ranking, the stopping rule, per-user ranks) and
the binary cross-entropy of ``train_loss: bce``: SASRec's at every position of
``train_rows: last_n_all_positions``, FMLP-Rec's at the last position of other rows."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from recbole_freq.protocol.pieces import ALL_POSITIONS, ProtocolError, protocol_settings
from recbole_freq.protocol.rows import (
    HISTORY_LENGTH,
    HISTORY_START,
    POSITION_TARGETS,
    UserHistories,
    _interaction,
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
        if self.train_loss == "bce":
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
        if self.train_loss == "bce" and loss_func is None:
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
        return position_bce(output, targets, negatives, item_embedding_weight(model))

    def last_position_loss(self, interaction):
        """FMLP-Rec's loss (Woeee/FMLP-Rec, ``trainers.py``, ``cross_entropy``): the output
        at the row's last position, ``-log s(r_pos) - log(1 - s(r_neg))`` with one negative
        drawn among the items outside the row (``datasets.py``, ``neg_sample``), averaged
        over the rows."""
        model = self.model
        item_seq = interaction[model.ITEM_SEQ]
        targets = interaction[model.POS_ITEM_ID]
        negatives = row_negatives(item_seq, targets, model.n_items)
        if drives_objective(model):
            return objective_loss(
                model, interaction, targets[:, None], negatives[:, None], all_positions=False
            )
        output = model.forward(
            item_seq, interaction[model.ITEM_SEQ_LEN], **sequence_inputs(model, interaction)
        )
        return position_bce(
            output[:, None], targets[:, None], negatives[:, None], item_embedding_weight(model)
        )

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


# ------------------------------------------ binary cross-entropy training (train_loss: bce)


def _bce_source(config) -> str:
    if protocol_settings(config)["train_rows"] == ALL_POSITIONS:
        return f"train_rows={ALL_POSITIONS} trains with SASRec's per-position loss"
    return "train_loss=bce trains with FMLP-Rec's binary cross-entropy"


def _bce_way_out(config) -> str:
    if protocol_settings(config)["train_rows"] == ALL_POSITIONS:
        return "use train_rows=all_prefixes or window"
    return "use train_loss=model"


def drives_objective(model) -> bool:
    """Whether the protocol's binary cross-entropy goes through the model's own training
    objective: a core model whose objective is Rec-Denoiser's ``DenoisingObjective``
    (masks learned by ARM / AR, the Jacobian term), which the protocol runs on its loss
    (``objective_loss``)."""
    objective = getattr(model, "objective", None)
    return (
        objective is not None
        and type(objective).__name__ == "DenoisingObjective"
        and callable(getattr(model, "run_encoder", None))
        and callable(getattr(model, "readout", None))
        and not getattr(model, "bidirectional", False)
    )


def objective_loss(model, interaction, targets, negatives, all_positions: bool):
    """Rec-Denoiser eq. 13 with eq. 4 as ``L``: the protocol's binary cross-entropy
    (every target position, or the last one) run through the model's
    ``DenoisingObjective``, so the masks learn from this loss and the Jacobian term
    sees the same pass.  The negatives are drawn once, outside the passes, so both ARM
    passes score the same items."""
    from recbole_freq.model.objectives import DenoisingPass

    item_seq = interaction[model.ITEM_SEQ]
    inputs = sequence_inputs(model, interaction)
    weight = item_embedding_weight(model)
    lengths = interaction[model.ITEM_SEQ_LEN]
    scored = targets > 0
    count = scored.sum().clamp(min=1)

    def run_pass():
        block_inputs, block_outputs = model.run_encoder(item_seq, **inputs)
        hidden = block_outputs[-1]
        if not all_positions:
            hidden = model.gather_indexes(hidden, lengths - 1)[:, None]
        output = model.readout(hidden, **inputs)
        positive = (output * weight[targets]).sum(-1)
        negative = (output * weight[negatives]).sum(-1)
        losses = (F.softplus(-positive) + F.softplus(negative)) * scored
        return DenoisingPass(losses.sum(-1) / count, block_inputs, block_outputs, item_seq != 0)

    return model.objective(model.encoder, run_pass)


def check_plain_objective(model, config) -> None:
    """The binary cross-entropy is computed here, not by the model: a model whose
    training objective adds more (the contrastive terms of PolyRec, DuoRec, CL4SRec and
    FEARec) would silently lose it, so it is refused.  Rec-Denoiser's objective is run
    on this loss instead (``drives_objective``)."""
    objective = getattr(model, "objective", None)
    if drives_objective(model):
        objective = None
    if objective is not None and type(objective).__name__ != "PlainObjective":
        raise ProtocolError(
            f"{_bce_source(config)}, which does not apply {config['model']}'s "
            f"{type(objective).__name__}; {_bce_way_out(config)}"
        )
    terms = auxiliary_terms(model, config)
    if terms:
        raise ProtocolError(
            f"{_bce_source(config)}, which leaves out {config['model']}'s "
            f"{' and '.join(terms)}; turn them off or {_bce_way_out(config)}"
        )
    if not isinstance(getattr(model, "item_embedding", None), torch.nn.Embedding):
        raise ProtocolError(
            f"{_bce_source(config)}, which scores items with the model's item_embedding; "
            f"{type(model).__name__} has none; {_bce_way_out(config)}"
        )


def auxiliary_terms(model, config) -> list[str]:
    """Loss terms ``model`` adds to its recommendation loss: the plugin models say
    (``auxiliary_losses``); of RecBole's built-ins, FEARec adds its contrastive and
    frequency-domain terms when its settings turn them on."""
    hook = getattr(model, "auxiliary_losses", None)
    if callable(hook):
        return list(hook())
    if config["model"] == "FEARec":
        terms = []
        if config["contrast"] not in (None, "None"):
            terms.append(f"contrastive term (contrast={config['contrast']})")
        if config["fredom"]:
            terms.append("frequency-domain term (fredom=True)")
        return terms
    return []


def item_embedding_weight(model) -> torch.Tensor:
    weight = getattr(model, "item_scores_weight", None)  # without input-only tokens
    return weight if isinstance(weight, torch.Tensor) else model.item_embedding.weight


def row_negatives(item_seq, targets, n_items: int) -> torch.Tensor:
    """One negative per row, uniform over the items that are neither in the row's input
    nor its target (FMLP-Rec's ``neg_sample(set(items))``), drawn with torch's global
    generator."""
    item_seq, targets_cpu = item_seq.cpu(), targets.cpu()
    seen = torch.zeros(len(targets_cpu), n_items, dtype=torch.bool)
    seen.scatter_(1, item_seq, True)
    seen[torch.arange(len(targets_cpu)), targets_cpu] = True
    seen[:, 0] = True
    if seen.all(dim=1).any():
        raise ProtocolError(
            "train_loss=bce: a training row holds every item, leaving no negative to draw; "
            "use train_loss=model"
        )
    negatives = torch.randint(1, n_items, targets_cpu.shape)
    redraw = seen.gather(1, negatives[:, None])[:, 0]
    while redraw.any():
        negatives[redraw] = torch.randint(1, n_items, (int(redraw.sum()),))
        redraw = seen.gather(1, negatives[:, None])[:, 0]
    return negatives.to(targets.device)


def sequence_inputs(model, interaction) -> dict:
    """What a plugin model's encoder reads besides the items (TiSASRec's timestamps);
    nothing for RecBole's models."""
    hook = getattr(model, "sequence_inputs", None)
    return hook(interaction) if callable(hook) else {}


def all_position_output(model, interaction) -> torch.Tensor:
    """``(batch, n, hidden)``: the model's output at every position.  Plugin models
    expose ``encode``; RecBole's sequential models read the last position with
    ``gather_indexes`` inside ``forward``, which is bypassed for this call."""
    item_seq = interaction[model.ITEM_SEQ]
    if callable(getattr(model, "encode", None)):
        return model.encode(item_seq, **sequence_inputs(model, interaction))
    model.gather_indexes = lambda output, index: output
    try:
        output = model.forward(item_seq, interaction[model.ITEM_SEQ_LEN])
    finally:
        del model.gather_indexes
    if output.dim() != 3 or output.size(1) != item_seq.size(1):
        raise ProtocolError(
            f"train_rows=last_n_all_positions needs every position's output, and "
            f"{type(model).__name__}.forward does not give it (it does not read its last "
            "position with gather_indexes); use train_rows=all_prefixes or window"
        )
    return output


def check_causal(model, interaction) -> None:
    """Position t must not see later items, or training every position at once would
    show the model its targets: changing the last input item of a row must leave the
    outputs of the positions before it unchanged (checked once, without dropout)."""
    lengths = interaction[model.ITEM_SEQ_LEN]
    row = int(torch.argmax(lengths))
    last = int(lengths[row]) - 1
    if last < 1:
        return
    item_seq = interaction[model.ITEM_SEQ][row : row + 1].clone()
    changed = item_seq.clone()
    changed[0, last] = 1 + int(item_seq[0, last]) % (model.n_items - 1)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            single = interaction[row : row + 1]
            single.update(_interaction({model.ITEM_SEQ: item_seq}))
            before = all_position_output(model, single)[0, :last]
            single.update(_interaction({model.ITEM_SEQ: changed}))
            after = all_position_output(model, single)[0, :last]
    finally:
        model.train(was_training)
    if not torch.allclose(before, after, rtol=1e-4, atol=1e-5):
        raise ProtocolError(
            f"train_rows=last_n_all_positions needs a causal model (position t must not see "
            f"later items); {type(model).__name__}'s earlier outputs changed when a later "
            "item did (e.g. a frequency filter over the whole sequence); use "
            "train_rows=all_prefixes or window"
        )


def position_negatives(train_dataset, interaction, targets, model) -> torch.Tensor:
    """One negative per target position, uniform over the items outside the user's
    training part (SASRec's ``random_neq``), drawn with torch's global generator."""
    histories = train_dataset.protocol_histories
    train_length = train_dataset.protocol_train_length
    users = interaction[model.USER_ID].long().cpu().numpy()
    rows, seen_items = histories.items_of(histories.start[users], train_length[users])
    seen = torch.zeros(len(users), model.n_items, dtype=torch.bool)
    seen[rows, seen_items] = True
    seen[:, 0] = True
    if seen.all(dim=1).any():
        raise ProtocolError(
            "train_rows=last_n_all_positions: a user's training part holds every item, "
            "leaving no negative to draw; use train_rows=all_prefixes or window"
        )
    targets_cpu = targets.cpu()
    negatives = torch.randint(1, model.n_items, targets_cpu.shape)
    redraw = seen.gather(1, negatives) & (targets_cpu > 0)
    while redraw.any():
        negatives[redraw] = torch.randint(1, model.n_items, (int(redraw.sum()),))
        redraw = seen.gather(1, negatives) & (targets_cpu > 0)
    return torch.where(targets_cpu > 0, negatives, torch.zeros_like(negatives)).to(targets.device)


def position_bce(output, targets, negatives, item_weight) -> torch.Tensor:
    """Mean over target positions of ``softplus(-r_pos) + softplus(r_neg)``, i.e.
    ``-log s(r_pos) - log(1 - s(r_neg))``."""
    positions = targets > 0
    hidden = output[positions]
    positive = (hidden * item_weight[targets[positions]]).sum(-1)
    negative = (hidden * item_weight[negatives[positions]]).sum(-1)
    return (F.softplus(-positive) + F.softplus(negative)).mean()
