"""Unfused reference BSARec: the test oracle for the fused implementation.

Written step by step the way the authors' code computes BSARec (separate Q, K, V
projections, additive -10000 mask, explicit softmax, rfft/irfft low pass with
``c // 2 + 1`` bins, ``nn.Dropout``), as a RecBole model so that RecBole's own trainer
can evaluate it.  ``copy_weights_from`` loads the parameters of a ``recbole_freq``
BSARec / FBSARec so both forms can be compared on identical weights.
"""

import math

import torch
from recbole.model.abstract_recommender import SequentialRecommender
from torch import nn


class ReferenceSelfAttention(nn.Module):
    def __init__(self, hidden, heads, attn_dropout, hidden_dropout, eps):
        super().__init__()
        self.heads, self.head_size = heads, hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attn_dropout = nn.Dropout(attn_dropout)
        self.dense = nn.Linear(hidden, hidden)
        self.out_dropout = nn.Dropout(hidden_dropout)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def split(self, x):
        b, n, _ = x.shape
        return x.view(b, n, self.heads, self.head_size).permute(0, 2, 1, 3)

    def forward(self, x, additive_mask):
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
        probs = nn.Softmax(dim=-1)(scores + additive_mask)
        context = torch.matmul(self.attn_dropout(probs), v)
        context = context.permute(0, 2, 1, 3).reshape(x.shape)
        return self.LayerNorm(self.out_dropout(self.dense(context)) + x)


class ReferenceFrequencyLayer(nn.Module):
    def __init__(self, hidden, c, dropout, eps, beta_width):
        super().__init__()
        self.c = c // 2 + 1
        self.sqrt_beta = nn.Parameter(torch.randn(1, 1, beta_width))
        self.out_dropout = nn.Dropout(dropout)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x):
        spectrum = torch.fft.rfft(x, dim=1, norm="ortho")
        spectrum[:, self.c :, :] = 0
        low = torch.fft.irfft(spectrum, n=x.size(1), dim=1, norm="ortho")
        mixed = low + self.sqrt_beta**2 * (x - low)
        return self.LayerNorm(self.out_dropout(mixed) + x)


class ReferenceFeedForward(nn.Module):
    def __init__(self, hidden, inner, dropout, eps):
        super().__init__()
        self.dense_1 = nn.Linear(hidden, inner)
        self.dense_2 = nn.Linear(inner, hidden)
        self.dropout = nn.Dropout(dropout)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x):
        h = self.dense_1(x)
        h = h * 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0)))
        return self.LayerNorm(self.dropout(self.dense_2(h)) + x)


class ReferenceBlock(nn.Module):
    def __init__(self, config, beta_width, branches, weights):
        super().__init__()
        hidden, eps = config["hidden_size"], config["layer_norm_eps"]
        self.attention = ReferenceSelfAttention(
            hidden,
            config["n_heads"],
            config["attn_dropout_prob"],
            config["hidden_dropout_prob"],
            eps,
        )
        self.filter = ReferenceFrequencyLayer(
            hidden, config["c"], config["hidden_dropout_prob"], eps, beta_width
        )
        self.feed_forward = ReferenceFeedForward(
            hidden, config["inner_size"], config["hidden_dropout_prob"], eps
        )
        self.alpha = config["alpha"]
        self.branches, self.weights = branches, weights

    def forward(self, x, additive_mask):
        dsp = self.filter(x)
        gsp = self.attention(x, additive_mask)
        features = {"ib": dsp, "sa": gsp, "bsa": self.alpha * dsp + (1 - self.alpha) * gsp}
        return sum(w * self.feed_forward(features[b]) for b, w in zip(self.branches, self.weights))


class ReferenceBSARec(SequentialRecommender):
    def __init__(self, config, dataset, branches=("bsa",), weights=(1.0,)):
        super().__init__(config, dataset)
        hidden = config["hidden_size"]
        self.item_embeddings = nn.Embedding(self.n_items, hidden, padding_idx=0)
        self.position_embeddings = nn.Embedding(self.max_seq_length, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=config["layer_norm_eps"])
        self.dropout = nn.Dropout(config["hidden_dropout_prob"])
        width = hidden if (config["beta_type"] or "vector") == "vector" else 1
        self.blocks = nn.ModuleList(
            ReferenceBlock(config, width, branches, weights) for _ in range(config["n_layers"])
        )
        self.loss_fct = nn.CrossEntropyLoss()

    def forward(self, item_seq, item_seq_len):
        positions = torch.arange(item_seq.size(1), device=item_seq.device)
        x = self.dropout(
            self.LayerNorm(self.item_embeddings(item_seq) + self.position_embeddings(positions))
        )
        additive_mask = self.get_attention_mask(item_seq)
        for block in self.blocks:
            x = block(x, additive_mask)
        return self.gather_indexes(x, item_seq_len - 1)

    def calculate_loss(self, interaction):
        out = self.forward(interaction[self.ITEM_SEQ], interaction[self.ITEM_SEQ_LEN])
        return self.loss_fct(out @ self.item_embeddings.weight.t(), interaction[self.POS_ITEM_ID])

    def predict(self, interaction):
        out = self.forward(interaction[self.ITEM_SEQ], interaction[self.ITEM_SEQ_LEN])
        return (out * self.item_embeddings(interaction[self.ITEM_ID])).sum(-1)

    def full_sort_predict(self, interaction):
        out = self.forward(interaction[self.ITEM_SEQ], interaction[self.ITEM_SEQ_LEN])
        return out @ self.item_embeddings.weight.t()

    @torch.no_grad()
    def copy_weights_from(self, model):
        """Load the parameters of a recbole_freq BSARec/FBSARec with the same config."""
        self.item_embeddings.weight.copy_(model.embedding.item_embedding.weight)
        self.position_embeddings.weight.copy_(model.embedding.position_embedding.weight)
        self.LayerNorm.load_state_dict(model.embedding.layer_norm.state_dict())
        for ref, block in zip(self.blocks, model.encoder.blocks):
            attention = block.mixer.attention
            for target, weight, bias in zip(
                (ref.attention.query, ref.attention.key, ref.attention.value),
                attention.qkv.weight.chunk(3, dim=0),
                attention.qkv.bias.chunk(3, dim=0),
            ):
                target.weight.copy_(weight)
                target.bias.copy_(bias)
            ref.attention.dense.load_state_dict(attention.dense.state_dict())
            ref.attention.LayerNorm.load_state_dict(attention.residual.layer_norm.state_dict())
            ref.filter.sqrt_beta.copy_(block.mixer.rescaler.sqrt_beta)
            ref.filter.LayerNorm.load_state_dict(block.mixer.residual.layer_norm.state_dict())
            feed_forward = block.feed_forward
            ref.feed_forward.dense_1.load_state_dict(feed_forward.dense_in.state_dict())
            ref.feed_forward.dense_2.load_state_dict(feed_forward.dense_out.state_dict())
            ref.feed_forward.LayerNorm.load_state_dict(
                feed_forward.residual.layer_norm.state_dict()
            )
        return self
