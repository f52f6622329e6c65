"""The sequential-recommender skeleton shared by every recbole-freq model."""

from __future__ import annotations

import torch
from recbole.model.abstract_recommender import SequentialRecommender
from recbole.model.loss import BPRLoss
from torch import nn

from recbole_freq.model.layers import (
    ATTENTION_OPERATORS,
    RESIDUAL_PATHS,
    SequenceEmbedding,
    build_attention_mask,
    build_encoder,
    init_weights,
)

LOSS_TYPES = ("CE", "BPR")


def config_value(config, key, default=None):
    """``config[key]`` with a default; RecBole's ``Config`` returns None for missing keys."""
    value = config[key]
    return default if value is None else value


def component_options(config, registry, name) -> dict:
    """The config values a registered encoder component asks for (unknown names pass
    through; ``build_encoder`` reports them)."""
    component = registry.get(name)
    keys = component.config_keys if component else ()
    return {key: config[key] for key in keys if config[key] is not None}


class TransformerRecommender(SequentialRecommender):
    """Embedding (BSARec eq. 4) -> configurable Transformer encoder -> dot-product scores.

    Scores follow BSARec eq. 10 (``e_v^T X^L`` at the last real position of the
    right-padded sequence); the loss is cross-entropy over all items (eq. 11) or BPR
    with sampled negatives, as in RecBole's SASRec.  Subclasses choose the token mixer
    and add their own encoder settings in ``encoder_settings``.
    """

    token_mixer = "self_attention"
    bidirectional = False
    loss_types: tuple[str, ...] = LOSS_TYPES
    extra_item_tokens = 0  # ids after the catalogue, e.g. BERT4Rec's [mask]
    needs_sampled_negatives = True  # non-CE losses read train_neg_sample_args' negatives

    def __init__(self, config, dataset):
        super().__init__(config, dataset)
        self.hidden_size = config["hidden_size"]
        self.initializer_range = config_value(config, "initializer_range", 0.02)
        self.loss_type = config_value(config, "loss_type", "CE")
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
        self.embedding = SequenceEmbedding(
            self.n_items + self.extra_item_tokens,
            self.max_seq_length,
            self.hidden_size,
            config["hidden_dropout_prob"],
            config["layer_norm_eps"],
        )
        self.encoder = build_encoder(**self.encoder_settings(config))
        self.loss_fct = nn.CrossEntropyLoss() if self.loss_type == "CE" else BPRLoss()
        self.build_head(config)
        self.apply(lambda module: init_weights(module, self.initializer_range))

    def build_head(self, config) -> None:
        """Output layers beyond the item embedding (none by default)."""

    def encoder_settings(self, config) -> dict:
        operator = config_value(config, "attention_operator", "softmax")
        residual = config_value(config, "residual", "standard")
        return dict(
            n_layers=config["n_layers"],
            hidden_size=config["hidden_size"],
            n_heads=config["n_heads"],
            inner_size=config["inner_size"],
            hidden_dropout_prob=config["hidden_dropout_prob"],
            attn_dropout_prob=config["attn_dropout_prob"],
            hidden_act=config_value(config, "hidden_act", "gelu"),
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

    def encode(self, item_seq: torch.Tensor, output_all_layers: bool = False):
        """Hidden states of every position, last layer (or all layers)."""
        mask = build_attention_mask(item_seq, self.bidirectional)
        return self.encoder(self.embedding(item_seq), mask, output_all_layers)

    def forward(self, item_seq: torch.Tensor, item_seq_len: torch.Tensor) -> torch.Tensor:
        return self.gather_indexes(self.encode(item_seq), item_seq_len - 1)

    def calculate_loss(self, interaction):
        seq_output = self.forward(interaction[self.ITEM_SEQ], interaction[self.ITEM_SEQ_LEN])
        pos_items = interaction[self.POS_ITEM_ID]
        if self.loss_type == "BPR":
            neg_items = interaction[self.NEG_ITEM_ID]
            pos_score = (seq_output * self.item_embedding(pos_items)).sum(-1)
            neg_score = (seq_output * self.item_embedding(neg_items)).sum(-1)
            return self.loss_fct(pos_score, neg_score) + self.regularization_loss()
        logits = seq_output @ self.item_embedding.weight.t()
        return self.loss_fct(logits, pos_items) + self.regularization_loss()

    def regularization_loss(self):
        """Sum of the ``regularization_loss()`` terms that encoder components define
        (e.g. a sparsity penalty of an attention operator); 0 when none does."""
        terms = [
            module.regularization_loss()
            for module in self.encoder.modules()
            if hasattr(module, "regularization_loss")
        ]
        return sum(terms) if terms else 0.0

    def predict(self, interaction):
        seq_output = self.forward(interaction[self.ITEM_SEQ], interaction[self.ITEM_SEQ_LEN])
        return (seq_output * self.item_embedding(interaction[self.ITEM_ID])).sum(-1)

    def full_sort_predict(self, interaction):
        seq_output = self.forward(interaction[self.ITEM_SEQ], interaction[self.ITEM_SEQ_LEN])
        return seq_output @ self.item_embedding.weight.t()
