"""RecBole's built-in sequential models as the plugin runs them: ``builtin_class``.

Each built-in gets a subclass that adds what the protocols ask of a model and RecBole's
classes do not say: ``every_position_output`` (the output at every position, for
SASRec's per-position training), and under ``sequence_layout: left`` the authors' layout.

The plugin's models re-lay rows inside their encoder
(``TransformerRecommender.layout``, ``layers.SequenceLayout``).  RecBole's built-ins cannot be changed
inside, so they get the authors' layout through their input: the subclass's ``forward``
moves each row's items to the end of the row (padding first, the newest item at
position ``n - 1``) and passes ``item_seq_len = n``, so that the model's own
``gather_indexes(output, item_seq_len - 1)`` reads the newest item.  That is only the
authors' computation for a model whose sole use of ``item_seq_len`` is that read, each
checked in RecBole 1.2.1's source (``LEFT_LAYOUT_BUILTINS``); every other built-in is
refused in one line.  ``calculate_loss``, ``predict`` and ``full_sort_predict`` all go
through ``forward``, so training, evaluation and every job see the same layout.
"""

from __future__ import annotations

import torch

from recbole_freq.model.abstract_recommender import TransformerRecommender
from recbole_freq.model.layers import (
    SequenceLayout,
    gather_positions,
    left_alignment,
    sequence_extent,
)

# How each built-in's forward reads a row (RecBole 1.2.1):
# - "lengths": forward(item_seq, item_seq_len), item_seq_len used only in
#   gather_indexes(output, item_seq_len - 1): SASRec, GRU4Rec, NARM (its attention masks
#   padding with item_seq > 0, wherever it sits) and FEARec (its contrastive views go
#   through forward too);
# - "sequence": forward(user, item_seq), the whole row and no length: Caser;
# - "masked": BERT4Rec, whose forward(item_seq) encodes whole rows: its predictions write
#   the [mask] slot at item_seq_len and its own loss reads RecBole's right-laid masked
#   rows, so left-laid it predicts as the BSARec authors' bert4rec.py does (the row's
#   last n - 1 items, then [mask] at n - 1) and trains only with their loss
#   (train_loss: masked_next, protocol.losses.MaskedNextLoss, which lays rows itself).
# Refused, for example: STAMP (the mean of the first item_seq_len embeddings), SRGNN /
# GCSAN (session graphs), NextItNet.
LEFT_LAYOUT_BUILTINS = {
    "SASRec": "lengths",
    "GRU4Rec": "lengths",
    "NARM": "lengths",
    "FEARec": "lengths",
    "Caser": "sequence",
    "BERT4Rec": "masked",
}


class SequenceLayoutError(ValueError):
    """``sequence_layout: left`` asked of a model that cannot take it."""


class BuiltinSequential:
    """What the plugin adds to a RecBole built-in sequential model (mixed in front of its
    class by ``builtin_class``)."""

    sequence_layout = "right"
    _every_position = False

    def gather_indexes(self, output, gather_index):
        # RecBole's models read their last position here, inside forward; while
        # every_position_output runs, every position is kept.
        if self._every_position:
            return output
        return super().gather_indexes(output, gather_index)

    def every_position_output(self, item_seq, item_seq_len) -> torch.Tensor:
        """``forward`` with every position's output kept: ``(batch, n, hidden)`` for a
        model that reads its last position with ``gather_indexes``; any other output
        (a model that does not) is returned as it is, for the caller to refuse."""
        self._every_position = True
        try:
            return self.forward(item_seq, item_seq_len)
        finally:
            self._every_position = False


_BUILTIN_CLASSES: dict[tuple[type, str], type] = {}


def builtin_class(model_class, config):
    """The class to build for ``config``: a plugin model's class itself; for a RecBole
    built-in sequential model its ``BuiltinSequential`` subclass, re-laid under
    ``sequence_layout: left``; ``SequenceLayoutError`` for a built-in that cannot be
    re-laid from outside.  Any other model (a general one) is RecBole's class."""
    from recbole.model.abstract_recommender import SequentialRecommender

    layout = SequenceLayout.from_config(config).name
    if (
        issubclass(model_class, TransformerRecommender)
        or getattr(model_class, "reads_stored_rows", False)
        or not issubclass(model_class, SequentialRecommender)
    ):
        return model_class
    name = model_class.__name__
    builtin = model_class.__module__.startswith("recbole.")
    # A researcher's own RecBole-style model says how its forward reads a row, as each
    # built-in's entry here was read from RecBole's source.
    reads = (
        LEFT_LAYOUT_BUILTINS.get(name)
        if builtin
        else getattr(model_class, "left_layout_reads", None)
    )
    if not builtin and reads not in (None, "lengths", "sequence"):
        raise SequenceLayoutError(
            f"{name}.left_layout_reads is {reads!r}: give 'lengths' (forward(item_seq, "
            "item_seq_len) reads item_seq_len only in gather_indexes(output, item_seq_len - 1)) "
            "or 'sequence' (forward reads the whole row, no length)"
        )
    if layout == "left" and reads is None and builtin:
        supported = ", ".join(sorted(LEFT_LAYOUT_BUILTINS))
        raise SequenceLayoutError(
            f"sequence_layout=left is not available for {name}: it uses item_seq_len for more "
            f"than reading the last position (RecBole built-ins with left: {supported}, and "
            "every plugin model); set sequence_layout=right"
        )
    if layout == "left" and reads is None:
        raise SequenceLayoutError(
            f"sequence_layout=left needs {name} to say how its forward reads a row: set the "
            "class attribute left_layout_reads = 'lengths' if it reads item_seq_len only in "
            "gather_indexes(output, item_seq_len - 1), 'sequence' if it reads the whole row "
            "and no length; else set sequence_layout=right"
        )
    if layout == "left" and reads == "masked" and config["train_loss"] != "masked_next":
        raise SequenceLayoutError(
            f"sequence_layout=left trains {name} only with the BSARec authors' loss "
            "(train_loss=masked_next): its own loss reads rows masked in RecBole's layout; "
            "set train_loss=masked_next or sequence_layout=right"
        )
    key = (model_class, layout)
    if key not in _BUILTIN_CLASSES:
        members = {
            "__module__": model_class.__module__,
            "__qualname__": model_class.__qualname__,
            "__doc__": model_class.__doc__,
            "sequence_layout": layout,
        }
        if layout == "left" and reads == "masked":
            members.update(full_sort_predict=_masked_full_sort, predict=_masked_predict)
        elif layout == "left":
            members["forward"] = _left_laid_forward(model_class.forward, reads)
        _BUILTIN_CLASSES[key] = type(name, (BuiltinSequential, model_class), members)
    return _BUILTIN_CLASSES[key]


def _left_laid_forward(forward, reads: str):
    """``forward`` of a built-in, fed left-laid rows."""
    if reads == "sequence":

        def by_sequence(self, user, item_seq, *args, **kwargs):
            to_left, _ = left_alignment(sequence_extent(item_seq), item_seq.size(1))
            return forward(self, user, item_seq.gather(1, to_left), *args, **kwargs)

        return by_sequence

    def by_lengths(self, item_seq, item_seq_len, *args, **kwargs):
        to_left, to_right = left_alignment(item_seq_len, item_seq.size(1))
        full = torch.full_like(item_seq_len, item_seq.size(1))
        output = forward(self, item_seq.gather(1, to_left), full, *args, **kwargs)
        # Every position's output (every_position_output)
        # goes back to RecBole's layout, where the per-position targets are.
        return gather_positions(output, to_right) if output.dim() == 3 else output

    return by_lengths


def _masked_query(model, interaction) -> torch.Tensor:
    """BERT4Rec's output for the next item as the BSARec authors read it
    (``reconstruct_test_data``): the row left-laid, its oldest slot dropped and ``[mask]``
    appended at position ``n - 1``, whose output is the query."""
    item_seq = interaction[model.ITEM_SEQ]
    to_left, _ = left_alignment(interaction[model.ITEM_SEQ_LEN], item_seq.size(1))
    laid = item_seq.gather(1, to_left)
    mask = torch.full_like(laid[:, :1], model.mask_token)
    return model.forward(torch.cat([laid[:, 1:], mask], dim=1))[:, -1]


def _masked_full_sort(self, interaction):
    query = _masked_query(self, interaction)
    return query @ self.item_embedding.weight[: self.n_items].T + self.output_bias


def _masked_predict(self, interaction):
    items = interaction[self.ITEM_ID]
    query = _masked_query(self, interaction)
    return (query * self.item_embedding(items)).sum(-1) + self.output_bias[items]
