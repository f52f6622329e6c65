"""Training and evaluation protocols: which rows a model trains on, what a test item is
ranked against, and when training stops.

A protocol is a named bundle of settings, ``properties/protocol/<name>.yaml``, chosen
with ``--protocol=<name>`` (``FreqConfig`` layers its file right above
``overall.yaml``, so model, dataset, paper and user settings still override it).  Its
pieces are independent settings, so each one's effect can be studied alone; they act
through RecBole's own classes (the split datasets, the evaluation sampler, the
``Trainer``) for every sequential model, RecBole's built-ins included:

``history_mask`` (full-sort ranking)
    ``none``: RecBole's sequential ranking, only the padding item is excluded.
    ``zero``: the BSARec / FMLP-Rec / S3-Rec authors' ranking (yehjin-shin/BSARec,
    ``src/trainers.py``, ``iteration``): the score of every item in the user's history
    before the target (validation: ``seq[:-2]``, test: ``seq[:-1]``) is set to 0, and the
    padding item keeps its model score (it is not excluded).
    ``exclude``: the same items are removed from the ranking (score minus infinity), as
    RecBole does for general (non-sequential) recommenders; padding excluded.
``train_rows``
    ``all_prefixes``: RecBole's augmentation, every prefix of the training part (inputs
    truncated to ``MAX_ITEM_LIST_LENGTH`` = n); a user's first item is never a target.
    ``window``: the BSARec authors' rows (``src/dataset.py``, ``RecDataset``): the targets
    are the last n items of the training part, ``seq[-(n+2):-2]``, and each input is cut
    at the window's start, so the first row predicts the window's first item from an
    all-padding input.  RecBole models read the output at ``item_length - 1``, so that
    input is one padding item (``item_length`` 1).
    ``last_n_all_positions``: SASRec's training (kang and McAuley's and Rec-Denoiser's
    code): one row per user, the last n items of the training part but its last as
    input and the next item as the target at every position, binary cross-entropy with
    one negative per position drawn among the items outside the user's training part
    (``ProtocolTrainer``; the model's own ``loss_type`` is not used).  Only for causal
    models (position t sees no later item), which is checked on the first batch.
``train_loss``
    ``model``: the model's own ``calculate_loss`` (its ``loss_type``, contrastive terms,
    ...).
    ``bce``: binary cross-entropy with one sampled negative per target,
    ``-log s(r_pos) - log(1 - s(r_neg))``, computed by ``ProtocolTrainer`` from the
    model's output and item embeddings.  For one-target rows (``all_prefixes``,
    ``window``) it is FMLP-Rec's loss (Woeee/FMLP-Rec, ``trainers.py``,
    ``cross_entropy``; ``datasets.py``, ``neg_sample``): the output at the last position,
    the negative drawn among the items outside the row (its input and target).  For
    ``last_n_all_positions`` it is SASRec's per-position loss above, the only loss those
    rows train with.  The BSARec authors train SASRec, Caser and FMLP-Rec with this loss
    (yehjin-shin/BSARec, ``src/model/*.py``).
    ``bpr``: ``-log(1e-10 + s(r_pos - r_neg))`` at the last position against the same
    one negative: the BSARec authors' GRU4Rec (``src/model/gru4rec.py``).  Only for
    one-target rows.
    Either adds the model's own regularisation (Caser's L2 terms).  Unset (``~``), it
    is ``bce`` for ``last_n_all_positions`` and ``model`` otherwise.
``eval_negatives`` (sampled evaluation, e.g. ``uni100``)
    ``target_only``: RecBole's ``RepeatableSampler``, which excludes only the target, so
    an item of the user's history can be a negative.
    ``unseen``: negatives are items the user never interacted with (none of the user's
    interactions in the dataset), the SASRec / Rec-Denoiser protocol (Rec-Denoiser
    section 5.1.3).
``stopping_rule``
    ``recbole``: RecBole's ``early_stopping``: an epoch whose rounded validation score
    equals the best counts as an improvement (its checkpoint replaces the best), and
    training stops after ``stopping_step`` + 1 epochs without one.
    ``strict``: the BSARec authors' ``EarlyStopping`` (``src/utils.py``): only a higher
    unrounded score improves, and training stops after ``stopping_step`` epochs without
    one.
``sequence_layout`` (where a row's items sit among the model's ``n`` positions)
    ``right``: RecBole's, the items at positions ``0 .. length - 1`` and padding after
    them, so the newest item's position embedding depends on the row's length.
    ``left``: the BSARec / FMLP-Rec / S3-Rec authors' (``src/dataset.py``,
    ``RecDataset.__getitem__``: ``[0] * pad_len + input_ids``) and SASRec's and
    Rec-Denoiser's (``seq[idx] = i`` from ``idx = maxlen - 1`` down): padding first,
    positions counted over the padded row, the newest item at ``n - 1``.  The loaders
    keep RecBole's rows; the plugin's models re-lay them inside the encoder
    (``TransformerRecommender.encoder_layout``) and RecBole's built-ins whose only use
    of ``item_seq_len`` is reading the last position get the re-laid rows in
    ``forward`` (``recbole_freq.model.layout``); the others are refused in one line.

Validation and test inputs are the last n items before the target under every choice,
as in RecBole and in the authors' code.
"""

from recbole_freq.protocol.losses import (
    all_position_output,
    check_causal,
    pair_loss,
    position_loss,
    position_negatives,
    row_negatives,
)
from recbole_freq.protocol.pieces import (
    ALL_POSITIONS,
    DATA_PIECES,
    DEFAULT_PROTOCOL,
    MODEL_PIECES,
    PIECES,
    ProtocolError,
    comparable_label,
    protocol_defaults,
    protocol_dir,
    protocol_file,
    protocol_label,
    protocol_names,
    protocol_record,
    protocol_settings,
)
from recbole_freq.protocol.rows import (
    HISTORY_LENGTH,
    HISTORY_START,
    POSITION_TARGETS,
    UnseenSampler,
    UserHistories,
    apply_protocol,
    last_n_rows,
    use_protocol_negatives,
    window_rows,
)
from recbole_freq.protocol.trainer import ProtocolTrainer, history_index, protocol_trainer

__all__ = [
    "ALL_POSITIONS",
    "MODEL_PIECES",
    "protocol_dir",
    "comparable_label",
    "DATA_PIECES",
    "DEFAULT_PROTOCOL",
    "HISTORY_LENGTH",
    "HISTORY_START",
    "PIECES",
    "POSITION_TARGETS",
    "ProtocolError",
    "ProtocolTrainer",
    "UnseenSampler",
    "UserHistories",
    "all_position_output",
    "apply_protocol",
    "check_causal",
    "history_index",
    "last_n_rows",
    "pair_loss",
    "position_loss",
    "position_negatives",
    "protocol_defaults",
    "protocol_file",
    "protocol_label",
    "protocol_names",
    "protocol_record",
    "protocol_settings",
    "protocol_trainer",
    "row_negatives",
    "use_protocol_negatives",
    "window_rows",
]
