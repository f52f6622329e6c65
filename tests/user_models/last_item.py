"""A researcher's own model written the RecBole way (a ``SequentialRecommender``, no
plugin class): the newest item's embedding through a linear layer, scored against every
item.  Its forward reads ``item_seq_len`` only in ``gather_indexes``, which it declares
(``left_layout_reads``), so it runs under the BSARec authors' left-padded layout too."""

from recbole.model.abstract_recommender import SequentialRecommender
from recbole.utils import InputType
from torch import nn


class LastItemLinear(SequentialRecommender):
    input_type = InputType.POINTWISE
    left_layout_reads = "lengths"

    def __init__(self, config, dataset):
        super().__init__(config, dataset)
        self.embedding_size = config["embedding_size"]
        self.item_embedding = nn.Embedding(self.n_items, self.embedding_size, padding_idx=0)
        self.project = nn.Linear(self.embedding_size, self.embedding_size)
        self.loss_fct = nn.CrossEntropyLoss()

    def forward(self, item_seq, item_seq_len):
        hidden = self.project(self.item_embedding(item_seq))
        return self.gather_indexes(hidden, item_seq_len - 1)

    def calculate_loss(self, interaction):
        output = self.forward(interaction[self.ITEM_SEQ], interaction[self.ITEM_SEQ_LEN])
        logits = output @ self.item_embedding.weight.t()
        return self.loss_fct(logits, interaction[self.POS_ITEM_ID])

    def predict(self, interaction):
        output = self.forward(interaction[self.ITEM_SEQ], interaction[self.ITEM_SEQ_LEN])
        return (output * self.item_embedding(interaction[self.ITEM_ID])).sum(-1)

    def full_sort_predict(self, interaction):
        output = self.forward(interaction[self.ITEM_SEQ], interaction[self.ITEM_SEQ_LEN])
        return output @ self.item_embedding.weight.t()


class Undeclared(LastItemLinear):
    """The same model without saying how it reads a row."""

    left_layout_reads = None
