"""Training and evaluation protocols: which rows a model trains on, what a test item is
ranked against, and when training stops.

A protocol is a named bundle of settings, ``properties/protocol/<name>.yaml``, chosen
with ``--protocol=<name>``; each of its pieces (``history_mask``, ``train_rows``,
``train_loss``, ``eval_negatives``, ``stopping_rule``, ``sequence_layout``) is a setting
of its own, described with the authors' code it follows in ``docs/protocols.md``.  The
data side is ``rows``, the losses ``losses``, the trainer ``trainer``, the settings and
labels ``pieces``.
"""

from recbole_freq.protocol.losses import (
    all_position_output,
    check_causal,
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
from recbole_freq.protocol.trainer import FreqTrainer, history_index, trainer_for

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
    "FreqTrainer",
    "UnseenSampler",
    "UserHistories",
    "all_position_output",
    "apply_protocol",
    "check_causal",
    "history_index",
    "last_n_rows",
    "position_loss",
    "position_negatives",
    "protocol_defaults",
    "protocol_file",
    "protocol_label",
    "protocol_names",
    "protocol_record",
    "protocol_settings",
    "trainer_for",
    "row_negatives",
    "use_protocol_negatives",
    "window_rows",
]
