"""The sequential-recommender skeleton shared by every recbole-freq model."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from recbole.model.abstract_recommender import SequentialRecommender
from torch import nn

from recbole_freq.model.encoder import ATTENTION_OPERATORS, RESIDUAL_PATHS, build_encoder
from recbole_freq.model.layers import (
    SequenceEmbedding,
    SequenceLayout,
    build_attention_mask,
    init_weights,
)
from recbole_freq.model.mask_training import LearnedMaskTraining
from recbole_freq.model.objectives import (
    DenoisingPass,
    build_objective,
    component_regularisation,
    pair_losses,
)
from recbole_freq.model.personal import SSEPTInputs
from recbole_freq.model.temporal import TimeIntervalInputs
from recbole_freq.utils.options import setting

LOSS_TYPES = ("CE", "BPR")


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
    loss is cross-entropy over all items (eq. 11) or BPR with sampled negatives, as in
    RecBole's SASRec.  Subclasses choose the token mixer and add their own encoder
    settings in ``encoder_settings``.

    Parts any model takes by configuration, each in its paper's module:
    ``self.sse`` (``personal.SSEPTInputs``: SSE-PT's user embedding and stochastic
    shared embeddings), ``self.time_inputs`` and ``self.relations``
    (``temporal.TimeIntervalInputs``: TiSASRec's timestamps and key-value embeddings,
    ``time_intervals: True``), ``self.layout`` (``layers.SequenceLayout``: RecBole's or
    the authors' padding, ``sequence_layout``) and Rec-Denoiser's mask training
    (``mask_training.LearnedMaskTraining``, for ``attention_operator: denoise``).
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
        name, unavailable = type(self).__name__, self.extra_inputs_unavailable
        self.hidden_size = config["hidden_size"]
        self.layout = SequenceLayout.from_config(config)
        self.sequence_layout = self.layout.name
        self.initializer_range = setting(config, "initializer_range")
        self.check_loss_type(config)
        self.sse = SSEPTInputs.from_config(config, name, unavailable)
        self.embedding = SequenceEmbedding(
            self.n_items + self.extra_item_tokens,
            self.max_seq_length,
            self.hidden_size,
            config["hidden_dropout_prob"],
            config["layer_norm_eps"],
            positions=bool(setting(config, "input_position_embedding")),
            n_users=dataset.user_num if self.sse.personalised else 0,
            user_size=self.sse.user_size,
        )
        self.time_inputs = TimeIntervalInputs.from_config(config, dataset, name, unavailable)
        times = self.time_inputs
        self.TIME_SEQ = times.seq_field if times else None
        self.INTERVAL_TIME_FIELD = times.field if times else None
        self.relations = times.relations(config, self.max_seq_length) if times else None
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

    def check_loss_type(self, config) -> None:
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

    def build_head(self, config) -> None:
        """Output layers beyond the item embedding (none by default)."""

    @property
    def personalised(self) -> bool:
        """Whether inputs and scores carry a user embedding (SSE-PT)."""
        return self.sse.personalised

    def sequence_inputs(self, interaction) -> dict:
        """What the encoder reads from a batch besides the item sequence: the rows'
        timestamps with ``time_intervals`` (``time_seq``) and their users when
        personalised (``users``, in training SSE-PT's stochastic shared users)."""
        inputs = {}
        for wanted, field, needed in (
            (self.time_inputs is not None, self.TIME_SEQ, "time_intervals=True"),
            (self.personalised, self.USER_ID, "user_embedding_size > 0"),
        ):
            if wanted and field not in interaction:
                raise ValueError(
                    f"{type(self).__name__} with {needed} needs the rows' {field}, which "
                    "this batch lacks"
                )
        if self.time_inputs is not None:
            inputs["time_seq"] = interaction[self.TIME_SEQ]
        if self.personalised:
            n_users = self.embedding.user_embedding.num_embeddings
            inputs["users"] = self.sse.users(interaction[self.USER_ID], n_users, self.training)
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
            block_norm=setting(config, "block_norm"),
        )

    @property
    def item_embedding(self) -> nn.Embedding:
        return self.embedding.item_embedding

    @property
    def item_scores_weight(self) -> torch.Tensor:
        """The embeddings items are scored with: the catalogue's, without the extra
        tokens (a ``[mask]``) that only inputs use (personalised, SSE-PT's eq. 5:
        ``SSEPTInputs.score_weight``)."""
        return self.sse.score_weight(self.item_embedding.weight[: self.n_items])

    def readout(self, hidden: torch.Tensor, users=None, **_) -> torch.Tensor:
        """What each position scores items with, by the dot product with
        ``item_scores_weight``: the hidden state, or, personalised, SSE-PT's
        ``[h_I, <h_U, u>]``."""
        if not self.personalised:
            return hidden
        return self.sse.readout(hidden, self.embedding.user_embedding(users))

    def encoder_inputs(self, item_seq: torch.Tensor, time_seq=None, users=None):
        """``(embedded sequence, attention mask, key-value relations or None)`` of rows
        in the encoder's layout; in training SSE-PT's stochastic shared items."""
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
        inputs = self.sse.items(item_seq, self.n_items, self.training)
        return self.embedding(inputs, users), mask, relations

    def encoder_pass(self, item_seq: torch.Tensor, output_all_layers: bool, inputs: dict):
        """``(embedded input, encoder output, to_right)``: the encoder's input and
        output (every layer's with ``output_all_layers``) in its own layout, and the
        index that puts outputs back in RecBole's (``SequenceLayout.to_data``)."""
        laid, time_seq, to_right = self.layout.to_encoder(item_seq, inputs.get("time_seq"))
        embedded, mask, relations = self.encoder_inputs(laid, time_seq, inputs.get("users"))
        return embedded, self.encoder(embedded, mask, output_all_layers, relations), to_right

    def encode(self, item_seq: torch.Tensor, output_all_layers: bool = False, **inputs):
        """Every position's ``readout`` of the last layer (or all layers' hidden
        states), in RecBole's layout; ``inputs`` are ``sequence_inputs`` of the batch."""
        _, outputs, to_right = self.encoder_pass(item_seq, output_all_layers, inputs)
        if output_all_layers:
            return [self.layout.to_data(hidden, to_right) for hidden in outputs]
        return self.readout(self.layout.to_data(outputs, to_right), **inputs)

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
        else:  # the last layer's hidden states, read out once below
            _, hidden, to_right = self.encoder_pass(item_seq, False, extra)
            inputs, outputs = (), [self.layout.to_data(hidden, to_right)]
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
        embedded, outputs, to_right = self.encoder_pass(item_seq, True, inputs)
        return [embedded, *outputs[:-1]], [self.layout.to_data(h, to_right) for h in outputs]

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
