"""A researcher's own model on the plugin's core, outside the package (docs/models.md,
"Your own model"): SASRec's blocks, with a low-pass copy of each row's embeddings (the
first ``lp_keep`` frequencies of its real FFT over positions) blended in by ``lp_alpha``.
Its defaults are ``LowPassSASRec.yaml`` beside this file."""

import torch

from recbole_freq.model.abstract_recommender import TransformerRecommender


class LowPassSASRec(TransformerRecommender):
    def __init__(self, config, dataset):
        super().__init__(config, dataset)
        self.lp_alpha = config["lp_alpha"]
        self.lp_keep = config["lp_keep"]

    def encoder_inputs(self, item_seq, time_seq=None, users=None):
        embedded, mask, relations = super().encoder_inputs(item_seq, time_seq, users)
        spectrum = torch.fft.rfft(embedded, dim=1, norm="ortho")
        spectrum[:, self.lp_keep :] = 0
        low = torch.fft.irfft(spectrum, n=embedded.size(1), dim=1, norm="ortho")
        return (1 - self.lp_alpha) * embedded + self.lp_alpha * low, mask, relations
