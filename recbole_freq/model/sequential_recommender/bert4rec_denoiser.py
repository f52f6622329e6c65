"""Rec-Denoiser (Chen et al., RecSys 2022) on a bidirectional BERT4Rec backbone."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from recbole_freq.model.objectives import DenoisingPass
from recbole_freq.model.sequential_recommender.recdenoiser import DenoisingRecommender
from recbole_freq.utils.options import setting


def expected_cloze_targets(
    lengths: list[int], mask_ratio: float, max_length: int, ft_ratio: float
) -> float:
    """The mean number of positions RecBole's ``MaskItemSequence`` gives a training row
    of each length in ``lengths`` that the cloze loss scores.  In a share ``1 - ft_ratio``
    of batches each of the row's ``L`` items is masked with probability ``mask_ratio``
    and the last ``m = int(mask_ratio * max_length)`` masked are kept: ``E[min(K, m)]``,
    ``K ~ Binomial(L, mask_ratio)``, less the first position, kept when ``K <= m`` and
    never scored (index 0 is padding); in the other batches the last item alone, scored
    when ``L >= 2``."""
    kept_max = int(mask_ratio * max_length)

    def binomial(n: int, k: int) -> float:
        return math.comb(n, k) * mask_ratio**k * (1 - mask_ratio) ** (n - k)

    expected = {}
    for length in set(lengths):
        kept = sum(min(k, kept_max) * binomial(length, k) for k in range(length + 1))
        first = mask_ratio * sum(binomial(length - 1, k) for k in range(min(kept_max, length)))
        expected[length] = (1 - ft_ratio) * (kept - first) + ft_ratio * (length >= 2)
    return sum(expected[length] for length in lengths) / max(len(lengths), 1)


class BERT4RecDenoiser(DenoisingRecommender):
    r"""Rec-Denoiser on BERT4Rec: bidirectional attention with learned masks, cloze training.

    The backbone is RecBole's BERT4Rec rebuilt from the shared core: item embedding with
    an extra ``[mask]`` token (id ``n_items``), bidirectional blocks, output layer
    ``LayerNorm(GELU(W h + b))``, scores ``<h, T_i> + bias_i``.  Training is RecBole's
    cloze task (``transform: mask_itemseq``: each item masked with ``mask_ratio``, a
    share ``ft_ratio`` of batches masks only the last item), the loss taken at masked
    positions (CE over all items, or BPR / BCE against the transform's negatives);
    prediction appends ``[mask]`` after the history exactly as RecBole's
    ``reconstruct_test_data`` (which also drops the first item).  ``backbone: BSARec``
    uses BSARec's beyond-self-attention layer in the blocks.

    The mask, estimator and Jacobian options are those of ``RecDenoiser``; masks are not
    causal here (every allowed link may be kept).  With all masks 1 and both regularisers
    0 this is RecBole's BERT4Rec (tested on shared weights).
    """

    bidirectional = True
    backbones = {"BERT4Rec": "self_attention", "BSARec": "bsa"}
    default_backbone = "BERT4Rec"
    other_model = "RecDenoiser"
    other_backbones = ("SASRec", "TiSASRec", "SSE-PT")
    extra_item_tokens = 1
    extra_inputs_unavailable = (
        "its [mask] at the next position has no timestamp, its head no user part"
    )
    needs_sampled_negatives = False  # BPR / BCE use the cloze transform's negatives

    def __init__(self, config, dataset):
        if config["transform"] != "mask_itemseq":
            raise ValueError(
                f"transform={config['transform']!r}: BERT4RecDenoiser trains on RecBole's "
                "cloze task; set transform: mask_itemseq (as properties/model/"
                "BERT4RecDenoiser.yaml does)"
            )
        ratio = setting(config, "mask_ratio")
        if not 0.0 < float(ratio) < 1.0 or int(ratio * config["MAX_ITEM_LIST_LENGTH"]) < 1:
            raise ValueError(
                f"mask_ratio={ratio!r} must lie in (0, 1) and mask at least one of the "
                f"MAX_ITEM_LIST_LENGTH={config['MAX_ITEM_LIST_LENGTH']} positions, e.g. 0.2"
            )
        super().__init__(config, dataset)
        self.mask_token = self.n_items
        # The field names RecBole's MaskItemSequence transform writes.
        self.MASK_ITEM_SEQ = "Mask_" + self.ITEM_SEQ
        self.POS_ITEMS = "Pos_" + self.ITEM_ID
        self.NEG_ITEMS = "Neg_" + self.ITEM_ID
        self.MASK_INDEX = "MASK_INDEX"

    def paper_loss_targets_per_row(self, config, dataset) -> float:
        """BERT4Rec's cloze loss is a mean over a batch's scored masked positions, so
        Algorithm 1's ``beta R_M`` once per mini-batch weighs against the masked targets:
        their expected number per training row (``expected_cloze_targets``) under
        RecBole's ``mask_itemseq`` transform."""
        lengths = dataset.inter_feat[self.ITEM_SEQ_LEN].clamp(max=self.max_seq_length)
        return expected_cloze_targets(
            lengths.tolist(),
            float(config["mask_ratio"]),
            self.max_seq_length,
            float(setting(config, "ft_ratio")),
        )

    def build_head(self, config) -> None:
        self.output_ffn = nn.Linear(self.hidden_size, self.hidden_size)
        self.output_ln = nn.LayerNorm(self.hidden_size, eps=config["layer_norm_eps"])
        self.output_bias = nn.Parameter(torch.zeros(self.n_items))

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output_ln(F.gelu(self.output_ffn(hidden)))

    def reconstruct_test_data(self, item_seq, item_seq_len):
        """RecBole's BERT4Rec: ``[mask]`` after the last item, then drop the first column."""
        padded = F.pad(item_seq, (0, 1))
        padded.scatter_(1, item_seq_len[:, None], self.mask_token)
        return padded[:, 1:]

    def forward(self, item_seq, item_seq_len):
        item_seq = self.reconstruct_test_data(item_seq, item_seq_len)
        return self.gather_indexes(self.head(self.encode(item_seq)), item_seq_len - 1)

    def predict(self, interaction):
        seq_output = self.forward(interaction[self.ITEM_SEQ], interaction[self.ITEM_SEQ_LEN])
        items = interaction[self.ITEM_ID]
        return (seq_output * self.item_embedding(items)).sum(-1) + self.output_bias[items]

    def full_sort_predict(self, interaction):
        seq_output = self.forward(interaction[self.ITEM_SEQ], interaction[self.ITEM_SEQ_LEN])
        return seq_output @ self.item_scores_weight.t() + self.output_bias

    def training_pass(self, interaction) -> DenoisingPass:
        masked_seq = interaction[self.MASK_ITEM_SEQ]
        masked_index = interaction[self.MASK_INDEX]  # (batch, mask_len), left-padded by 0
        pos_items = interaction[self.POS_ITEMS]
        inputs, outputs = self.run_encoder(masked_seq)
        hidden = self.head(outputs[-1])
        index = masked_index[..., None].expand(-1, -1, hidden.size(-1))
        hidden = hidden.gather(1, index)  # (batch, mask_len, hidden)
        # As RecBole's BERT4Rec: index 0 is padding (a mask on position 0 is not scored).
        targets = (masked_index > 0).to(hidden.dtype)
        if self.loss_type == "CE":
            # Scores over all items only where a masked item is scored: most of the
            # mask_len slots are padding (6 of 15 used on lastfm), and these logits and
            # their softmax are most of a training step.
            scored = masked_index > 0
            logits = hidden[scored] @ self.item_scores_weight.t() + self.output_bias
            picked = F.cross_entropy(logits, pos_items[scored], reduction="none")
            losses = picked.new_zeros(targets.shape).masked_scatter(scored, picked)
        else:
            neg_items = interaction[self.NEG_ITEMS]
            pos_score = (hidden * self.item_embedding(pos_items)).sum(-1)
            neg_score = (hidden * self.item_embedding(neg_items)).sum(-1)
            pos_score = pos_score + self.output_bias[pos_items]
            neg_score = neg_score + self.output_bias[neg_items]
            if self.loss_type == "BPR":  # RecBole's BERT4Rec BPR
                losses = -torch.log(1e-14 + torch.sigmoid(pos_score - neg_score))
            else:
                losses = self.pointwise_losses("BCE", pos_score, neg_score)
        per_sequence = (losses * targets).sum(-1) / targets.sum().clamp_min(1.0)
        return DenoisingPass(per_sequence, inputs, outputs, masked_seq != 0)
