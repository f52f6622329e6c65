"""The pieces of a protocol, their values and defaults, the protocol files and the
label a result carries: what the data side (``rows``), the trainer side (``trainer``)
and every layer above read of a protocol (see the package docstring)."""

from __future__ import annotations

from pathlib import Path

from recbole_freq.model.layers import SEQUENCE_LAYOUTS

PIECES = {
    "history_mask": ("none", "zero", "exclude"),
    "train_rows": ("all_prefixes", "window", "last_n_all_positions"),
    "train_loss": ("model", "bce", "bpr", "masked_next"),
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
    from recbole_freq.utils.property_files import read_config_file

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


def loss_base_label(train_loss: str, train_rows: str, loss_type) -> str:
    """The loss without the model's added terms, as tables name it: ``BCE, 1 negative,
    last position`` (or ``per position``), ``BPR, 1 negative, last position``, ``CE, next
    item at a masked slot`` (the BSARec authors' BERT4Rec), or the model's own
    ``loss_type`` (``CE (model's own)``)."""
    if train_loss == "bce":
        per = "per position" if train_rows == ALL_POSITIONS else "last position"
        return f"BCE, 1 negative, {per}"
    if train_loss == "bpr":
        return "BPR, 1 negative, last position"
    if train_loss == "masked_next":
        return "CE, next item at a masked slot"
    return f"{loss_type or 'own loss'} (model's own)"


def fearec_terms(contrast, fredom) -> list[str]:
    """The terms FEARec's settings add to its loss, as tables name them (a run's own
    ``contrast`` and ``fredom``)."""
    terms = []
    if contrast not in (None, "None"):
        terms.append(f"contrastive term (contrast={contrast})")
    if fredom:
        terms.append("frequency-domain term (fredom=True)")
    return terms


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
