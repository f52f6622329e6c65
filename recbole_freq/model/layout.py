"""``sequence_layout: left`` for RecBole's built-in sequential models.

The plugin's models re-lay rows inside their encoder
(``TransformerRecommender.encoder_layout``).  RecBole's built-ins cannot be changed
inside, so they get the authors' layout through their input: a subclass whose
``forward`` moves each row's items to the end of the row (padding first, the newest item
at position ``n - 1``) and passes ``item_seq_len = n``, so that the model's own
``gather_indexes(output, item_seq_len - 1)`` reads the newest item.  That is only the
authors' computation for a model whose sole use of ``item_seq_len`` is that read, each
checked in RecBole 1.2.1's source (``LEFT_LAYOUT_BUILTINS``); every other built-in is
refused in one line.  ``calculate_loss``, ``predict`` and ``full_sort_predict`` all go
through ``forward``, so training, evaluation and every job see the same layout.
"""

from __future__ import annotations

import torch

from recbole_freq.model.abstract_recommender import TransformerRecommender, sequence_layout
from recbole_freq.model.layers import gather_positions, left_alignment, sequence_extent

# How each built-in's forward reads a row (RecBole 1.2.1):
# - "lengths": forward(item_seq, item_seq_len), item_seq_len used only in
#   gather_indexes(output, item_seq_len - 1): SASRec, GRU4Rec, NARM (its attention masks
#   padding with item_seq > 0, wherever it sits) and FEARec (its contrastive views go
#   through forward too);
# - "sequence": forward(user, item_seq), the whole row and no length: Caser.
# Refused, for example: BERT4Rec (the [mask] slot is written at item_seq_len), STAMP (the
# mean of the first item_seq_len embeddings), SRGNN / GCSAN (session graphs), NextItNet.
LEFT_LAYOUT_BUILTINS = {
    "SASRec": "lengths",
    "GRU4Rec": "lengths",
    "NARM": "lengths",
    "FEARec": "lengths",
    "Caser": "sequence",
}


class SequenceLayoutError(ValueError):
    """``sequence_layout: left`` asked of a model that cannot take it."""


def with_sequence_layout(model_class, config):
    """The class to build for ``config``: ``model_class`` itself, or for a RecBole
    built-in under ``sequence_layout: left`` its left-laid subclass;
    ``SequenceLayoutError`` for a built-in that cannot be re-laid from outside."""
    if sequence_layout(config) == "right" or issubclass(model_class, TransformerRecommender):
        return model_class
    name = model_class.__name__
    reads = LEFT_LAYOUT_BUILTINS.get(name)
    if reads is None or not model_class.__module__.startswith("recbole.model."):
        supported = ", ".join(sorted(LEFT_LAYOUT_BUILTINS))
        raise SequenceLayoutError(
            f"sequence_layout=left is not available for {name}: it uses item_seq_len for more "
            f"than reading the last position (RecBole built-ins with left: {supported}, and "
            "every plugin model); set sequence_layout=right"
        )
    return type(
        name,
        (model_class,),
        {
            "forward": _left_laid_forward(model_class.forward, reads),
            "__module__": model_class.__module__,
            "__qualname__": model_class.__qualname__,
            "__doc__": model_class.__doc__,
            "sequence_layout": "left",
        },
    )


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
        # Every position's output (gather_indexes bypassed: protocol.all_position_output)
        # goes back to RecBole's layout, where the per-position targets are.
        return gather_positions(output, to_right) if output.dim() == 3 else output

    return by_lengths
