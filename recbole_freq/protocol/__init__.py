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
    rows train with.  Unset (``~``), it is ``bce`` for ``last_n_all_positions`` and
    ``model`` otherwise.
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

from __future__ import annotations

from pathlib import Path

from recbole_freq.model.layers import SEQUENCE_LAYOUTS

PIECES = {
    "history_mask": ("none", "zero", "exclude"),
    "train_rows": ("all_prefixes", "window", "last_n_all_positions"),
    "train_loss": ("model", "bce"),
    "eval_negatives": ("target_only", "unseen"),
    "stopping_rule": ("recbole", "strict"),
    "sequence_layout": SEQUENCE_LAYOUTS,
}
# The pieces that change the loaders (stopping_rule acts in the trainer, sequence_layout
# in the model).
DATA_PIECES = ("history_mask", "train_rows", "eval_negatives")
ALL_POSITIONS = "last_n_all_positions"
# Pieces that are part of a model's recipe as much as of a protocol: the papers' tables
# train each model with its own loss (BSARec with CE, FMLP-Rec with BCE) under one
# protocol.  Labels name them; comparisons accept runs that differ only in them.
MODEL_PIECES = ("train_loss",)
DEFAULT_PROTOCOL = "recbole"


class ProtocolError(ValueError):
    """An unknown protocol, or a protocol setting with an unknown value."""


def protocol_dir() -> Path:
    from recbole_freq.utils.property_files import properties_dir

    return properties_dir() / "protocol"


def protocol_names() -> list[str]:
    return sorted(path.stem for path in protocol_dir().glob("*.yaml"))


def protocol_file(name) -> str:
    """The property file of protocol ``name``; ``ProtocolError`` naming the protocols."""
    path = protocol_dir() / f"{name}.yaml"
    if not isinstance(name, str) or "/" in name or not path.is_file():
        raise ProtocolError(
            f"unknown protocol {name!r}; choose one of {', '.join(protocol_names())} "
            "(properties/protocol/)"
        )
    return str(path)


def protocol_defaults(name: str) -> dict:
    """The settings protocol ``name`` fixes (its property file)."""
    from recbole_freq.config.configurator import read_config_file

    return read_config_file(protocol_file(name))


def protocol_settings(config) -> dict:
    """The run's protocol name and pieces, validated: ``ProtocolError`` in one line."""
    name = config["protocol"] or DEFAULT_PROTOCOL
    protocol_file(name)
    return {"protocol": name, **_pieces(config)}


def _pieces(values) -> dict:
    """Every piece's value in ``values`` (a config or a protocol file's settings), unset
    ones at their default."""
    settings = {}
    for piece, choices in PIECES.items():
        value = values[piece] if piece in values else None
        if value is None:
            value = _default(piece, settings)
        if value not in choices:
            raise ProtocolError(f"{piece}={value!r} is unknown; choose one of {', '.join(choices)}")
        settings[piece] = value
    if settings["train_rows"] == ALL_POSITIONS and settings["train_loss"] != "bce":
        raise ProtocolError(
            f"train_rows={ALL_POSITIONS} trains every position with binary cross-entropy; "
            "leave train_loss unset or set it to bce"
        )
    return settings


def _default(piece: str, settings: dict) -> str:
    if piece == "train_loss":
        return "bce" if settings["train_rows"] == ALL_POSITIONS else "model"
    return PIECES[piece][0]


def _test_mode(config) -> str:
    mode = config["eval_args"]["mode"]
    return str(mode.get("test", mode) if isinstance(mode, dict) else mode)


def protocol_label(config) -> str:
    """The protocol a result was produced under: its name, plus every piece (and the
    test ranking mode) that differs from what the named protocol fixes, e.g.
    ``bsarec`` or ``bsarec+history_mask=none``."""
    settings = protocol_settings(config)
    name = settings["protocol"]
    fixed = protocol_defaults(name)
    fixed_pieces = _pieces(fixed)
    changed = [
        f"{piece}={settings[piece]}" for piece in PIECES if settings[piece] != fixed_pieces[piece]
    ]
    fixed_mode = (fixed.get("eval_args") or {}).get("mode", "full")
    fixed_mode = fixed_mode.get("test", "full") if isinstance(fixed_mode, dict) else fixed_mode
    if _test_mode(config) != fixed_mode:
        changed.append(f"mode={_test_mode(config)}")
    return "+".join([name, *changed])


def comparable_label(label: str) -> str:
    """``label`` without its model pieces: runs whose labels agree on this share a table
    (``bsarec+train_loss=bce`` -> ``bsarec``)."""
    parts = str(label).split("+")
    kept = [p for p in parts[1:] if p.partition("=")[0] not in MODEL_PIECES]
    return "+".join([parts[0], *kept])


def protocol_record(config) -> dict:
    """What every summary, checkpoint and search result keeps about its protocol."""
    return {"label": protocol_label(config), **protocol_settings(config)}


# The data side (rows, histories, samplers) and the trainer side use the settings above.
from recbole_freq.protocol.rows import (  # noqa: E402
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
from recbole_freq.protocol.trainer import (  # noqa: E402
    ProtocolTrainer,
    all_position_output,
    check_causal,
    history_index,
    position_bce,
    position_negatives,
    protocol_trainer,
    row_negatives,
)

__all__ = [
    "ALL_POSITIONS",
    "MODEL_PIECES",
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
    "position_bce",
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
