"""The sequential-recommender skeleton shared by every recbole-freq model."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from recbole.model.abstract_recommender import SequentialRecommender
from torch import nn

from recbole_freq.model.encoder import ATTENTION_OPERATORS, RESIDUAL_PATHS, build_encoder
from recbole_freq.model.layers import (
    SEQUENCE_LAYOUTS,
    SequenceEmbedding,
    build_attention_mask,
    gather_positions,
    init_weights,
    left_alignment,
    sequence_extent,
)
from recbole_freq.model.mask_training import LearnedMaskTraining
from recbole_freq.model.objectives import (
    DenoisingPass,
    build_objective,
    component_regularisation,
    pair_losses,
)
from recbole_freq.model.temporal import (
    TimeIntervalRelations,
    interval_time_field,
    report_interval_times,
)
from recbole_freq.utils.options import as_number, setting

LOSS_TYPES = ("CE", "BPR")


def probability(value, name: str) -> float:
    """A probability in [0, 1), or a one-line error naming the setting."""
    number = as_number(value)
    if isinstance(value, bool) or not 0.0 <= number < 1.0:
        raise ValueError(f"{name}={value!r} must be a probability in [0, 1) (0: off)")
    return number


def stochastic_shared(ids: torch.Tensor, prob: float, n_ids: int) -> torch.Tensor:
    """SSE-SE (Wu et al., NeurIPS 2019), as SSE-PT's sampler applies it: each id replaced
    with probability ``prob`` by one drawn uniformly from ``1 .. n_ids - 1`` (torch's
    global generator)."""
    replace = torch.rand(ids.shape, device=ids.device) < prob
    random_ids = torch.randint(1, n_ids, ids.shape, device=ids.device)
    return torch.where(replace, random_ids, ids)


def sequence_layout(config) -> str:
    """The run's ``sequence_layout`` (a protocol piece, ``recbole_freq.protocol``):
    ``right`` (RecBole's padding) when unset, as in configurations stored before the
    piece existed."""
    layout = config["sequence_layout"] or SEQUENCE_LAYOUTS[0]  # the piece's default
    if layout not in SEQUENCE_LAYOUTS:
        raise ValueError(
            f"sequence_layout={layout!r} is unknown; choose one of {', '.join(SEQUENCE_LAYOUTS)}"
        )
    return layout


@functools.cache
def core_defaults() -> dict:
    """The shared core's settings as ``properties/model/TransformerRecommender.yaml``
    gives them (what a configuration stored before one of them existed ran with)."""
    from recbole_freq.utils.property_files import properties_dir, read_config_file

    return read_config_file(properties_dir() / "model" / "TransformerRecommender.yaml")


def component_options(config, registry, name) -> dict:
    """The config values a registered encoder component asks for (unknown names pass
    through; ``build_encoder`` reports them)."""
    component = registry.get(name)
    keys = component.config_keys if component else ()
    return {key: setting(config, key) for key in keys}


class TransformerRecommender(LearnedMaskTraining, SequentialRecommender):
    """Embedding (BSARec eq. 4) -> configurable Transformer encoder -> dot-product scores.

    Scores follow BSARec eq. 10 (``e_v^T X^L`` at the position of the newest item); the
    loss is cross-entropy over all items (eq. 11) or BPR with sampled negatives, as in RecBole's SASRec.  Subclasses choose the token mixer
    and add their own encoder settings in ``encoder_settings``.

    ``time_intervals: True`` gives every attention layer TiSASRec's position and
    time-interval embeddings in its keys and values (``temporal``; ``time_span`` k),
    read from the rows' timestamps (``sequence_inputs``); ``input_position_embedding:
    False`` leaves positions out of the input embedding, as TiSASRec does.

    ``sequence_layout`` says where a sequence's items sit among the ``n`` positions the
    encoder sees (position embeddings, the attention mask, the frequency filters that mix
    every position): ``right``, RecBole's, items at ``0 .. length - 1`` and padding
    after them; ``left``, the BSARec / FMLP-Rec / SASRec authors' (``[0] * pad_len +
    input_ids``), padding first and the newest item at ``n - 1``.  RecBole's loaders
    always give right-padded rows; with ``left`` the encoder re-lays each row on the
    way in and its outputs back on the way out (``encoder_layout``), so every reader of
    the outputs (the last position at ``item_seq_len - 1``, per-position targets,
    augmentations) keeps RecBole's layout.
    """

    token_mixer = "self_attention"
    bidirectional = False
    loss_types: tuple[str, ...] = LOSS_TYPES
    extra_item_tokens = 0  # ids after the catalogue, e.g. BERT4Rec's [mask]
    needs_sampled_negatives = True  # non-CE losses read train_neg_sample_args' negatives
    # Why time_intervals / user_embedding_size cannot work for a model: it encodes
    # sequences (augmented views ...) whose timestamps and users it does not have.
    extra_inputs_unavailable = ""

    def __init__(self, config, dataset):
        if not hasattr(config, "protocol_piece"):
            # RecBole's Config never loads the plugin's property files, so every
            # setting of the model was None (a bare TypeError deep in layers.py).
            raise TypeError(
                f"{type(self).__name__} needs the plugin's config, which loads its property "
                f"file: build it with recbole_freq.config.FreqConfig("
                f"'{type(self).__name__}', dataset, config_dict=...) instead of "
                "recbole.config.Config (README, 'RecBole's own pipeline')"
            )
        super().__init__(config, dataset)
        self.hidden_size = config["hidden_size"]
        self.sequence_layout = sequence_layout(config)
        self.initializer_range = setting(config, "initializer_range")
        self.loss_type = setting(config, "loss_type")
        if self.loss_type not in self.loss_types:
            raise ValueError(
                f"loss_type={self.loss_type!r} is unknown; choose from {list(self.loss_types)}"
            )
        if (
            self.loss_type != "CE"
            and self.needs_sampled_negatives
            and config["train_neg_sample_args"]["distribution"] == "none"
        ):
            raise ValueError(
                f"loss_type={self.loss_type!r} needs sampled negatives: set "
                "train_neg_sample_args: {distribution: uniform, sample_num: 1}"
            )
        user_size = self.user_embedding_size(config)
        self.sse_user_prob = probability(setting(config, "sse_user_prob"), "sse_user_prob")
        self.sse_item_prob = probability(setting(config, "sse_item_prob"), "sse_item_prob")
        if self.sse_user_prob and not user_size:
            raise ValueError(
                f"sse_user_prob={self.sse_user_prob} replaces user embeddings, and the model "
                "has none: set user_embedding_size > 0 (SSE-PT) or sse_user_prob: 0"
            )
        self.embedding = SequenceEmbedding(
            self.n_items + self.extra_item_tokens,
            self.max_seq_length,
            self.hidden_size,
            config["hidden_dropout_prob"],
            config["layer_norm_eps"],
            positions=bool(setting(config, "input_position_embedding")),
            n_users=dataset.user_num if user_size else 0,
            user_size=user_size,
        )
        self.relations = self.build_relations(config, dataset)
        self.encoder = build_encoder(
            **self.encoder_settings(config), key_value_relations=self.relations is not None
        )
        self.scale_sparsity_penalties(config, dataset)
        self.read_mask_learning_rate(config)
        self.objective = build_objective(
            self.encoder,
            setting(config, "jacobian_gamma"),
            setting(config, "jacobian_projections"),
            setting(config, "jacobian_normalization"),
        )
        self.build_head(config)
        self.apply(lambda module: init_weights(module, self.initializer_range))

    def build_head(self, config) -> None:
        """Output layers beyond the item embedding (none by default)."""

    def user_embedding_size(self, config) -> int:
        """``user_embedding_size`` (SSE-PT's user part of the input; 0: none, ``half``:
        half of ``hidden_size``), checked."""
        size = setting(config, "user_embedding_size")
        if size == "half":  # SSE-PT's split: as many user as item dimensions
            size = config["hidden_size"] // 2
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(
                f"user_embedding_size={size!r} must be an integer >= 0 (0: no user embedding) "
                "or half"
            )
        if size and self.extra_inputs_unavailable:
            raise ValueError(
                f"user_embedding_size={size} is not available for {type(self).__name__}: "
                f"{self.extra_inputs_unavailable}"
            )
        return size

    @property
    def personalised(self) -> bool:
        """Whether inputs and scores carry a user embedding (SSE-PT)."""
        return self.embedding.user_embedding is not None

    def build_relations(self, config, dataset) -> TimeIntervalRelations | None:
        """TiSASRec's key and value embeddings when ``time_intervals`` is on; checks that
        the rows carry timestamps and says when they only order the interactions."""
        enabled = setting(config, "time_intervals")
        if enabled not in (True, False):
            raise ValueError(f"time_intervals={enabled!r} must be True or False")
        self.TIME_SEQ = self.INTERVAL_TIME_FIELD = None
        if not enabled:
            return None
        name = type(self).__name__
        if self.extra_inputs_unavailable:
            raise ValueError(
                f"time_intervals=True is not available for {name}: {self.extra_inputs_unavailable}"
            )
        self.INTERVAL_TIME_FIELD = interval_time_field(config, dataset)
        self.TIME_SEQ = f"{self.INTERVAL_TIME_FIELD}{config['LIST_SUFFIX']}"
        report_interval_times(name, config, dataset, self.INTERVAL_TIME_FIELD)
        return TimeIntervalRelations(
            self.max_seq_length,
            setting(config, "time_span"),
            self.hidden_size,
            config["n_heads"],
            config["hidden_dropout_prob"],
        )

    def sequence_inputs(self, interaction) -> dict:
        """What the encoder reads from a batch besides the item sequence: the rows'
        timestamps with ``time_intervals`` (``time_seq``) and their users when
        personalised (``users``; in training each replaced by a random user with
        probability ``sse_user_prob``, SSE-PT's stochastic shared embeddings)."""
        inputs = {}
        for wanted, field, needed in (
            (self.relations is not None, self.TIME_SEQ, "time_intervals=True"),
            (self.personalised, self.USER_ID, "user_embedding_size > 0"),
        ):
            if wanted and field not in interaction:
                raise ValueError(
                    f"{type(self).__name__} with {needed} needs the rows' {field}, which "
                    "this batch lacks"
                )
        if self.relations is not None:
            inputs["time_seq"] = interaction[self.TIME_SEQ]
        if self.personalised:
            users = interaction[self.USER_ID]
            if self.training and self.sse_user_prob > 0:
                users = stochastic_shared(
                    users, self.sse_user_prob, self.embedding.user_embedding.num_embeddings
                )
            inputs["users"] = users
        return inputs

    def encoder_settings(self, config) -> dict:
        operator = setting(config, "attention_operator")
        residual = setting(config, "residual")
        return dict(
            n_layers=config["n_layers"],
            hidden_size=config["hidden_size"],
            n_heads=config["n_heads"],
            inner_size=config["inner_size"],
            hidden_dropout_prob=config["hidden_dropout_prob"],
            attn_dropout_prob=config["attn_dropout_prob"],
            hidden_act=setting(config, "hidden_act"),
            layer_norm_eps=config["layer_norm_eps"],
            max_seq_length=self.max_seq_length,
            token_mixer=self.token_mixer,
            attention_operator=operator,
            operator_options=component_options(config, ATTENTION_OPERATORS, operator),
            residual=residual,
            residual_options=component_options(config, RESIDUAL_PATHS, residual),
        )

    @property
    def item_embedding(self) -> nn.Embedding:
        return self.embedding.item_embedding

    @property
    def item_scores_weight(self) -> torch.Tensor:
        """The embeddings items are scored with: the catalogue's, without the extra
        tokens (a ``[mask]``) that only inputs use.  Personalised, each gets a last entry
        1 that ``readout``'s user term meets: ``<h, [e_i; u]> = <[h_I, <h_U, u>], [e_i;
        1]>``."""
        weight = self.item_embedding.weight[: self.n_items]
        if self.personalised:
            weight = torch.cat([weight, weight.new_ones(self.n_items, 1)], dim=1)
        return weight

    def readout(self, hidden: torch.Tensor, users=None, **_) -> torch.Tensor:
        """What each position scores items with, by the dot product with
        ``item_scores_weight``: the hidden state, or, personalised, ``[h_I, <h_U, u>]``
        (SSE-PT scores ``<h, [e_i; u]>``, the user's embedding in the item's)."""
        if not self.personalised:
            return hidden
        item_size = self.item_embedding.embedding_dim
        user = self.embedding.user_embedding(users)
        if hidden.dim() == 3:
            user = user[:, None, :]
        user_term = (hidden[..., item_size:] * user).sum(-1, keepdim=True)
        return torch.cat([hidden[..., :item_size], user_term], dim=-1)

    def encoder_inputs(self, item_seq: torch.Tensor, time_seq=None, users=None):
        """``(embedded sequence, attention mask, key-value relations or None)``; in
        training, each input item is replaced by a random one with probability
        ``sse_item_prob`` (stochastic shared embeddings, SSE-PT)."""
        mask = build_attention_mask(item_seq, self.bidirectional)
        relations = None
        if self.relations is not None:
            if time_seq is None:
                raise ValueError(
                    f"{type(self).__name__} with time_intervals=True needs time_seq, the "
                    f"rows' timestamps ({self.TIME_SEQ}): see sequence_inputs"
                )
            relations = self.relations(time_seq, item_seq)
        if self.personalised and users is None:
            raise ValueError(
                f"{type(self).__name__} with user_embedding_size > 0 needs users, the rows' "
                f"{self.USER_ID}: see sequence_inputs"
            )
        inputs = item_seq
        if self.training and self.sse_item_prob > 0:
            replaced = stochastic_shared(item_seq, self.sse_item_prob, self.n_items)
            inputs = torch.where(item_seq > 0, replaced, item_seq)
        return self.embedding(inputs, users), mask, relations

    def encoder_layout(self, item_seq: torch.Tensor, inputs: dict):
        """``(item_seq, inputs, to_right)``: the batch in the encoder's
        ``sequence_layout``, and the gather index that puts the encoder's outputs back in
        RecBole's right-padded layout (None when the two layouts are the same)."""
        if self.sequence_layout == "right":
            return item_seq, inputs, None
        to_left, to_right = left_alignment(sequence_extent(item_seq), item_seq.size(1))
        inputs = dict(inputs)
        if inputs.get("time_seq") is not None:
            inputs["time_seq"] = inputs["time_seq"].gather(1, to_left)
        return item_seq.gather(1, to_left), inputs, to_right

    @staticmethod
    def in_data_layout(hidden: torch.Tensor, to_right) -> torch.Tensor:
        return hidden if to_right is None else gather_positions(hidden, to_right)

    def encode(self, item_seq: torch.Tensor, output_all_layers: bool = False, **inputs):
        """Every position's ``readout`` of the last layer (or all layers' hidden
        states), in RecBole's layout; ``inputs`` are ``sequence_inputs`` of the batch."""
        laid, laid_inputs, to_right = self.encoder_layout(item_seq, inputs)
        embedded, mask, relations = self.encoder_inputs(laid, **laid_inputs)
        outputs = self.encoder(embedded, mask, output_all_layers, relations)
        if output_all_layers:
            return [self.in_data_layout(hidden, to_right) for hidden in outputs]
        return self.readout(self.in_data_layout(outputs, to_right), **inputs)

    def forward(self, item_seq: torch.Tensor, item_seq_len: torch.Tensor, **inputs):
        return self.gather_indexes(self.encode(item_seq, **inputs), item_seq_len - 1)

    def sequence_output(self, interaction) -> torch.Tensor:
        """``forward`` of a batch: each row's output at its last position."""
        return self.forward(
            interaction[self.ITEM_SEQ],
            interaction[self.ITEM_SEQ_LEN],
            **self.sequence_inputs(interaction),
        )

    # --- training -------------------------------------------------------------------

    def calculate_loss(self, interaction):
        """Eq. 11 (CE) or BPR, plus every component's ``regularization_loss()``.

        The loss goes through ``self.objective`` (``objectives.build_objective``): one
        ordinary forward pass (``PlainObjective``), or, when the configuration asks for
        Rec-Denoiser's pieces on any backbone, ``DenoisingObjective`` (eq. 13):
        ``attention_operator: denoise`` masks are learned with the ARM / AR estimator, and
        ``jacobian_gamma > 0`` adds the Jacobian regulariser (eq. 12).
        """
        return self.objective(self.encoder, lambda: self.training_pass(interaction))

    def last_position_loss(self, interaction):
        """``(seq_output, loss)``: the training rows' last-position outputs and their mean
        softmax CE over the catalogue (eq. 11) plus the components' regularisers; the
        recommendation part of the models that add contrastive terms."""
        seq_output = self.sequence_output(interaction)
        logits = seq_output @ self.item_scores_weight.t()
        targets = interaction[self.POS_ITEM_ID]
        losses = self.pointwise_losses("CE", None, logits=logits, targets=targets)
        return seq_output, losses.mean() + self.regularization_loss()

    def training_pass(self, interaction) -> DenoisingPass:
        """One forward pass: the loss of each training sequence (summing to the batch
        mean) and, for the Jacobian regulariser, every block's input and output."""
        item_seq = interaction[self.ITEM_SEQ]
        extra = self.sequence_inputs(interaction)
        if self.objective.needs_block_states:
            inputs, outputs = self.run_encoder(item_seq, **extra)
        else:
            inputs, outputs = (), [self.encode(item_seq, **extra)]
        seq_output = self.gather_indexes(outputs[-1], interaction[self.ITEM_SEQ_LEN] - 1)
        seq_output = self.readout(seq_output, **extra)
        pos_items = interaction[self.POS_ITEM_ID]
        if self.loss_type == "CE":
            logits = seq_output @ self.item_scores_weight.t()
            losses = self.pointwise_losses("CE", None, logits=logits, targets=pos_items)
        else:
            weight = self.item_scores_weight
            pos_score = (seq_output * weight[pos_items]).sum(-1)
            neg_score = (seq_output * weight[interaction[self.NEG_ITEM_ID]]).sum(-1)
            losses = self.pointwise_losses(self.loss_type, pos_score, neg_score)
        return DenoisingPass(losses / losses.numel(), inputs, outputs, item_seq != 0)

    def run_encoder(self, item_seq: torch.Tensor, **inputs):
        """Embedding and every block's output; returns (block inputs, block outputs):
        the inputs as the blocks received them (the Jacobian regulariser differentiates
        with respect to them), the outputs in RecBole's layout (where the rows' real
        positions and the last position ``item_seq_len - 1`` are)."""
        laid, laid_inputs, to_right = self.encoder_layout(item_seq, inputs)
        embedded, mask, relations = self.encoder_inputs(laid, **laid_inputs)
        outputs = self.encoder(embedded, mask, True, relations)
        return [embedded, *outputs[:-1]], [self.in_data_layout(h, to_right) for h in outputs]

    @staticmethod
    def pointwise_losses(loss_type, pos_score, neg_score=None, logits=None, targets=None):
        """Unreduced loss per positive: CE over ``logits`` (eq. 11), BPR as RecBole's
        ``BPRLoss``, or BCE of Rec-Denoiser eq. 4 (``-log s(pos) - log(1 - s(neg))``)."""
        if loss_type == "CE":
            return F.cross_entropy(logits, targets, reduction="none")
        return pair_losses(loss_type, pos_score, neg_score)

    def auxiliary_losses(self) -> list[str]:
        """The terms this model adds to its recommendation loss (contrastive terms ...),
        named with the settings that turn them off; a protocol that computes the loss
        itself (``train_loss: bce``) refuses a model that has any."""
        return []

    def regularization_loss(self):
        """Sum of the ``regularization_loss()`` terms that encoder components define
        (e.g. a sparsity penalty of an attention operator); 0 when none does."""
        return component_regularisation(self.encoder)

    def predict(self, interaction):
        # Sampled evaluation does not come here row by row: ``protocol.sampled_scoring``
        # reads these scores off one full-sort pass per distinct sequence.
        seq_output = self.sequence_output(interaction)
        return (seq_output * self.item_scores_weight[interaction[self.ITEM_ID]]).sum(-1)

    def full_sort_predict(self, interaction):
        return self.sequence_output(interaction) @ self.item_scores_weight.t()
