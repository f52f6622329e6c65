"""The sampled losses of ``train_loss`` (``bce``, ``bpr``: one negative per target):
``SampledLoss``, the loss function the trainer trains with in place of the model's own,
computed from a model's output and item embeddings; the negatives (``row_negatives``,
``position_negatives``, both drawn by ``draw_excluding``), the pair losses, the model's
own regularisation kept beside them, and the checks that refuse a model whose own loss
would be silently lost.

What a model can give is read from its type, never from its attribute names: a plugin
model (``TransformerRecommender``) encodes every position (``encode``), names its extra
inputs and loss terms (``sequence_inputs``, ``auxiliary_losses``) and may train through
Rec-Denoiser's ``DenoisingObjective``; a RecBole built-in runs as its
``BuiltinSequential`` subclass (``model.layout``), whose ``every_position_output`` keeps
every position."""

from __future__ import annotations

import torch

from recbole_freq.model.abstract_recommender import TransformerRecommender
from recbole_freq.model.layers import left_alignment
from recbole_freq.model.layout import BuiltinSequential
from recbole_freq.model.objectives import (
    POSITION_TARGETS,
    DenoisingObjective,
    DenoisingPass,
    PlainObjective,
    pair_losses,
)
from recbole_freq.protocol.pieces import (
    ALL_POSITIONS,
    ProtocolError,
    fearec_terms,
    loss_base_label,
    protocol_settings,
)
from recbole_freq.protocol.rows import _interaction

SAMPLED_LOSSES = ("bce", "bpr")
MASKED_NEXT = "masked_next"


def _bce_source(config) -> str:
    settings = protocol_settings(config)
    if settings["train_rows"] == ALL_POSITIONS:
        return f"train_rows={ALL_POSITIONS} trains with SASRec's per-position loss"
    if settings["train_loss"] == "bpr":
        return "train_loss=bpr trains with the authors' BPR against one negative"
    return "train_loss=bce trains with the authors' binary cross-entropy"


def _bce_way_out(config) -> str:
    if protocol_settings(config)["train_rows"] == ALL_POSITIONS:
        return "use train_rows=all_prefixes or window"
    return "use train_loss=model"


def drives_objective(model) -> bool:
    """Whether the protocol's binary cross-entropy goes through the model's own training
    objective: a plugin model whose objective is Rec-Denoiser's ``DenoisingObjective``
    (masks learned by ARM / AR, the Jacobian term), which the protocol runs on its loss
    (``objective_loss``)."""
    return (
        isinstance(model, TransformerRecommender)
        and isinstance(model.objective, DenoisingObjective)
        and not model.bidirectional
    )


def objective_loss(model, interaction, targets, negatives, all_positions: bool):
    """Rec-Denoiser eq. 13 with eq. 4 as ``L``: the protocol's binary cross-entropy
    (every target position, or the last one) run through the model's
    ``DenoisingObjective``, so the masks learn from this loss and the Jacobian term
    sees the same pass.  The negatives are drawn once, outside the passes, so both ARM
    passes score the same items."""
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
        losses = pair_losses("bce", positive, negative) * scored
        return DenoisingPass(losses.sum(-1) / count, block_inputs, block_outputs, item_seq != 0)

    return model.objective(model.encoder, run_pass)


def check_plain_objective(model, config) -> None:
    """The binary cross-entropy is computed here, not by the model: a model whose
    training objective adds more (the contrastive terms of PolyRec, DuoRec, CL4SRec and
    FEARec) would silently lose it, so it is refused.  Rec-Denoiser's objective is run
    on this loss instead (``drives_objective``)."""
    if isinstance(model, TransformerRecommender) and not drives_objective(model):
        objective = model.objective
        if not isinstance(objective, PlainObjective):
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
    if not isinstance(model, TransformerRecommender) and not isinstance(
        getattr(model, "item_embedding", None), torch.nn.Embedding
    ):
        raise ProtocolError(
            f"{_bce_source(config)}, which scores items with the model's item_embedding; "
            f"{type(model).__name__} has none; {_bce_way_out(config)}"
        )


def auxiliary_terms(model, config) -> list[str]:
    """Loss terms ``model`` adds to its recommendation loss: the plugin models say
    (``auxiliary_losses``); of RecBole's built-ins, FEARec adds its contrastive and
    frequency-domain terms when its settings turn them on."""
    if isinstance(model, TransformerRecommender):
        return list(model.auxiliary_losses())
    if isinstance(model, _recbole_class("FEARec")):
        return fearec_terms(config["contrast"], config["fredom"])
    return []


def item_embedding_weight(model) -> torch.Tensor:
    if isinstance(model, TransformerRecommender):
        return model.item_scores_weight  # without input-only tokens ([mask])
    return model.item_embedding.weight


# The draws loop until no negative is a seen item, a data-dependent number of times:
# under `compile_step` they run eagerly, outside the compiled step.
@torch.compiler.disable
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
    negatives = draw_excluding(seen, torch.ones(len(targets_cpu), 1, dtype=torch.bool))[:, 0]
    return negatives.to(targets.device)


def draw_excluding(seen: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
    """``(rows, k)`` item ids, uniform over ``1 .. n_items - 1`` and redrawn while a row's
    draw is one of its ``seen`` items (``seen``: ``(rows, n_items)``), for the slots
    where ``wanted`` is true; drawn with torch's global generator."""
    n_items = seen.size(1)
    negatives = torch.randint(1, n_items, wanted.shape)
    redraw = seen.gather(1, negatives) & wanted
    while redraw.any():
        negatives[redraw] = torch.randint(1, n_items, (int(redraw.sum()),))
        redraw = seen.gather(1, negatives) & wanted
    return negatives


def sequence_inputs(model, interaction) -> dict:
    """What a plugin model's encoder reads besides the items (TiSASRec's timestamps);
    nothing for RecBole's models."""
    if isinstance(model, TransformerRecommender):
        return model.sequence_inputs(interaction)
    return {}


def all_position_output(model, interaction) -> torch.Tensor:
    """``(batch, n, hidden)``: the model's output at every position: a plugin model's
    ``encode``, a RecBole built-in's ``every_position_output`` (``model.layout``)."""
    item_seq = interaction[model.ITEM_SEQ]
    if isinstance(model, TransformerRecommender):
        return model.encode(item_seq, **sequence_inputs(model, interaction))
    output = None
    if isinstance(model, BuiltinSequential):
        output = model.every_position_output(item_seq, interaction[model.ITEM_SEQ_LEN])
    if output is None or output.dim() != 3 or output.size(1) != item_seq.size(1):
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


@torch.compiler.disable
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
    negatives = draw_excluding(seen, targets_cpu > 0)
    return torch.where(targets_cpu > 0, negatives, torch.zeros_like(negatives)).to(targets.device)


def position_loss(output, targets, negatives, item_weight, kind: str = "bce") -> torch.Tensor:
    """Mean of ``pair_losses`` over the positions that have a target."""
    positions = targets > 0
    hidden = output[positions]
    positive = (hidden * item_weight[targets[positions]]).sum(-1)
    negative = (hidden * item_weight[negatives[positions]]).sum(-1)
    return pair_losses(kind, positive, negative).mean()


_RECBOLE_CLASSES: dict[str, type] = {}


def _recbole_class(name: str) -> type:
    """RecBole's sequential model class ``name`` (``Caser``, ``FEARec``)."""
    # A plain dict, not functools.cache: torch.compile traces through a dict lookup but
    # warns at a cached function.
    if name not in _RECBOLE_CLASSES:
        import importlib

        module = importlib.import_module(f"recbole.model.sequential_recommender.{name.lower()}")
        _RECBOLE_CLASSES[name] = getattr(module, name)
    return _RECBOLE_CLASSES[name]


def last_position_output(model, interaction) -> torch.Tensor:
    """``(batch, hidden)``: the model's output for the row's next item.  Caser reads the
    user and the whole row (``forward(user, item_seq)``); every other model reads the
    items and their lengths (and a plugin model its ``sequence_inputs``)."""
    item_seq = interaction[model.ITEM_SEQ]
    if isinstance(model, _recbole_class("Caser")):
        return model.forward(interaction[model.USER_ID], item_seq)
    return model.forward(
        item_seq, interaction[model.ITEM_SEQ_LEN], **sequence_inputs(model, interaction)
    )


def has_regularisation(model) -> bool:
    """Whether the model adds a weight penalty to its loss (``regularisation``)."""
    return isinstance(model, _recbole_class("Caser"))


def regularisation(model):
    """What the model adds to its recommendation loss as a penalty on its weights, so that
    a sampled loss computed here keeps it: Caser's L2 terms (RecBole's
    ``Caser.calculate_loss``; the BSARec authors' ``caser.py``: ``reg_weight`` times the
    norms of the user and item embeddings, the vertical filter and both fully connected
    layers, plus ``reg_loss_conv_h``); 0 for models without one."""
    if has_regularisation(model):
        weights = [
            model.user_embedding.weight,
            model.item_embedding.weight,
            model.conv_v.weight,
            model.fc1.weight,
            model.fc2.weight,
        ]
        return model.reg_weight * model.reg_loss(weights) + model.reg_loss_conv_h()
    return 0.0


def training_loss_label(model, config) -> str:
    """The loss a run trains with, as every table names it: the protocol's sampled loss
    (``BCE, 1 negative`` at the last position or ``per position``; ``BPR, 1 negative``)
    or the model's own (its ``loss_type``, e.g. ``CE``), with each term the model adds
    (contrastive, frequency-domain, Caser's ``L2``); a count model trains with none."""
    if not getattr(model, "learns_by_gradient", True):
        return "none (counts of the training rows)"
    settings = protocol_settings(config)
    loss_type = config["loss_type"] if "loss_type" in config else None
    base = loss_base_label(settings["train_loss"], settings["train_rows"], loss_type)
    terms = auxiliary_terms(model, config)
    if has_regularisation(model):
        terms.append("L2 terms")
    return " + ".join([base, *terms])


class SampledLoss:
    """The loss function of ``train_loss: bce`` / ``bpr``, called by the trainer on each
    training batch in place of ``model.calculate_loss``: SASRec's at every position of
    ``train_rows: last_n_all_positions`` (``all_positions``), the BSARec / FMLP-Rec
    authors' at the last position of other rows (``last_position``).  Built once per
    trainer, after the checks that refuse a model whose own loss terms it would drop
    (``check_plain_objective``); ``training_dataset`` is the training split whose users'
    items the per-position negatives avoid (set by the trainer each epoch)."""

    def __init__(self, model, config):
        check_plain_objective(model, config)
        settings = protocol_settings(config)
        self.model = model
        self.kind = settings["train_loss"]
        self.every_position = settings["train_rows"] == ALL_POSITIONS
        self.training_dataset = None
        self._causality_checked = False

    def __call__(self, interaction):
        if self.every_position:
            return self.all_positions(interaction)
        return self.last_position(interaction)

    def all_positions(self, interaction):
        """SASRec's loss (its ``model.py``; Rec-Denoiser eq. 4): at every position with a
        target, ``-log s(r_pos) - log(1 - s(r_neg))`` with one negative drawn among the
        items outside the user's training part, averaged over those positions."""
        model = self.model
        if not self._causality_checked:
            check_causal(model, interaction)
            self._causality_checked = True
        targets = interaction[POSITION_TARGETS]
        negatives = position_negatives(self.training_dataset, interaction, targets, model)
        if drives_objective(model):
            return objective_loss(model, interaction, targets, negatives, all_positions=True)
        output = all_position_output(model, interaction)
        loss = position_loss(output, targets, negatives, item_embedding_weight(model), "bce")
        return loss + regularisation(model)

    def last_position(self, interaction):
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
            self.kind,
        )
        return loss + regularisation(model)


class MaskedNextLoss:
    """The loss of ``train_loss: masked_next``: BERT4Rec as the BSARec authors train it
    (yehjin-shin/BSARec, ``src/model/bert4rec.py``, the loss it returns): in each row
    ``int(n * mask_ratio)`` of its ``n`` slots, padding included, drawn without
    replacement, become ``[mask]``; the output at the slot drawn last scores every item
    id (``[mask]``'s too, as their logits do) and cross-entropy names the row's next
    item.  Their cloze loss at the masked slots is computed and then discarded, so it is
    not here.  The row is laid as the model reads it (``sequence_layout``).  Only RecBole's
    BERT4Rec trains with it; the rest of that model (its output head and bias) is
    RecBole's."""

    def __init__(self, model, config):
        if not isinstance(model, _recbole_class("BERT4Rec")):
            raise ProtocolError(
                f"train_loss={MASKED_NEXT} is the BSARec authors' BERT4Rec loss (a [mask] "
                f"slot's output scoring the next item); {config['model']} has no [mask] "
                "token: use train_loss=model, bce or bpr"
            )
        self.model = model
        self.training_dataset = None  # set by the trainer; this loss draws no items

    def __call__(self, interaction):
        model = self.model
        item_seq = interaction[model.ITEM_SEQ]
        if model.sequence_layout == "left":
            to_left, _ = left_alignment(interaction[model.ITEM_SEQ_LEN], item_seq.size(1))
            item_seq = item_seq.gather(1, to_left)
        slots = masked_slots(item_seq, model.mask_ratio)
        output = model.forward(item_seq.scatter(1, slots, model.mask_token))
        hidden = output.gather(1, slots[:, -1:, None].expand(-1, 1, output.size(-1)))[:, 0]
        logits = hidden @ model.item_embedding.weight.T
        return torch.nn.functional.cross_entropy(logits, interaction[model.POS_ITEM_ID])


def masked_slots(item_seq: torch.Tensor, mask_ratio: float) -> torch.Tensor:
    """Per row, ``int(n * mask_ratio)`` distinct slots of its ``n`` in the order drawn
    (the authors' ``torch.multinomial(torch.ones(n), mask_num, replacement=False)``),
    from torch's global generator."""
    rows, n = item_seq.shape
    count = int(n * mask_ratio)
    if count < 1:
        raise ProtocolError(
            f"mask_ratio={mask_ratio} masks int({n} * {mask_ratio}) = 0 of a row's {n} slots; "
            f"train_loss={MASKED_NEXT} needs at least one (mask_ratio >= {1 / n:.3g})"
        )
    return torch.rand(rows, n, device=item_seq.device).argsort(dim=1)[:, :count]
