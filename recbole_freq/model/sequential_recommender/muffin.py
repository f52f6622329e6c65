"""MUFFIN: mixture of user-adaptive frequency filtering for sequential recommendation
(CIKM 2025; code ilwoong100/MUFFIN, on RecBole)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from recbole_freq.model.abstract_recommender import TransformerRecommender
from recbole_freq.model.band_mixture import UserAdaptiveFilter
from recbole_freq.model.encoder import build_encoder
from recbole_freq.model.layers import Dropout
from recbole_freq.utils.options import finite_non_negative, setting, whole_number


class MUFFIN(TransformerRecommender):
    r"""MUFFIN: two filter encoders over one embedded sequence, fused at every position.

    - embedding: item embeddings only (no positions; the padding item's embedding is 0,
      as the authors' mask makes it), LayerNorm and dropout;
    - user-adaptive filter ``U = sigmoid(BatchNorm(Conv1d(|rfft(E)|)))`` of the embedded
      sequence ``E`` (``band_mixture.UserAdaptiveFilter``, ``kernel_size``), shared by
      every filter layer of both encoders;
    - global encoder (GFM): ``n_layers`` blocks of the token mixer
      ``adaptive_global_filter`` (``irfft(rfft(X) U W)``, dropout ``freq_dropout_prob``,
      residual, LayerNorm) and the feed-forward network;
    - local encoder (LFM, ``self.encoder``): ``n_layers`` blocks of ``band_mixture``
      (``num_bands`` bands of the filtered spectrum mixed by a softmax gate);
    - fusion at each position: ``Dropout(LayerNorm(Linear([h_L; h_G]) + E))``, the linear
      map without bias; scores by the dot product with the item embeddings.

    Loss (the authors' ``calculate_loss``): ``CE(fused) + alpha (CE(h_G) + CE(h_L)) + beta
    sum_layers balance``, every CE over all items at the newest position, ``balance`` the
    band mixture's load-balancing penalty.  RecBole's right padding is the authors'
    layout (their code is RecBole's).
    """

    token_mixer = "band_mixture"
    loss_types = ("CE",)
    extra_inputs_unavailable = "its filters read only the item sequence"

    def __init__(self, config, dataset):
        self.alpha = finite_non_negative(setting(config, "alpha"), "alpha", "0 drops the terms")
        self.beta = finite_non_negative(setting(config, "beta"), "beta", "0 drops the term")
        super().__init__(config, dataset)
        settings = dict(self.encoder_settings(config), token_mixer="adaptive_global_filter")
        self.global_encoder = build_encoder(**settings)
        kernel = whole_number(setting(config, "kernel_size"), "kernel_size")
        self.user_filter = UserAdaptiveFilter(self.hidden_size, kernel, self.max_seq_length)
        self.fusion = nn.Linear(2 * self.hidden_size, self.hidden_size, bias=False)
        self.output_norm = nn.LayerNorm(self.hidden_size, eps=1e-12)
        self.output_dropout = Dropout(config["hidden_dropout_prob"])
        for module in (self.global_encoder, self.user_filter, self.fusion):
            module.apply(self._init_new_weights)
        with torch.no_grad():
            self.item_embedding.weight[0].zero_()

    def _init_new_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            module.weight.data.normal_(mean=0.0, std=self.initializer_range)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.LayerNorm):
            module.bias.data.zero_()
            module.weight.data.fill_(1.0)

    def encoder_settings(self, config) -> dict:
        settings = super().encoder_settings(config)
        settings["mixer_options"] = {
            "num_bands": whole_number(setting(config, "num_bands"), "num_bands"),
            "freq_dropout_prob": float(setting(config, "freq_dropout_prob")),
        }
        return settings

    def auxiliary_losses(self) -> list[str]:
        return [f"both encoders' CE (alpha={self.alpha}), band balance (beta={self.beta})"]

    def branch_outputs(self, item_seq: torch.Tensor):
        """``(fused, local, global)`` hidden states of every position, RecBole's layout."""
        laid, _, to_right = self.layout.to_encoder(item_seq, None)
        embedded, mask, _ = self.encoder_inputs(laid)
        gains = self.user_filter(embedded)
        local = self.encoder(embedded, mask, relations=gains)
        global_ = self.global_encoder(embedded, mask, relations=gains)
        fused = self.fusion(torch.cat([local, global_], dim=-1)) + embedded
        fused = self.output_dropout(self.output_norm(fused))
        return tuple(self.layout.to_data(h, to_right) for h in (fused, local, global_))

    def encoder_pass(self, item_seq: torch.Tensor, output_all_layers: bool, inputs: dict):
        raise ValueError(
            "MUFFIN fuses two encoders at the output: it has no single stack of layer "
            "states (per-layer analyses, the Jacobian term, block-level losses)"
        )

    def encode(self, item_seq: torch.Tensor, output_all_layers: bool = False, **inputs):
        if output_all_layers:
            self.encoder_pass(item_seq, True, inputs)
        return self.branch_outputs(item_seq)[0]

    def balance_loss(self) -> torch.Tensor:
        return sum(block.mixer.balance_loss() for block in self.encoder.blocks)

    def calculate_loss(self, interaction):
        last = interaction[self.ITEM_SEQ_LEN] - 1
        targets = interaction[self.POS_ITEM_ID]
        weight = self.item_scores_weight
        losses = [
            F.cross_entropy(self.gather_indexes(hidden, last) @ weight.t(), targets)
            for hidden in self.branch_outputs(interaction[self.ITEM_SEQ])
        ]
        return losses[0] + self.alpha * (losses[1] + losses[2]) + self.beta * self.balance_loss()
