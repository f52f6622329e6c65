"""recbole-freq models; ``MODELS`` maps each model name to its class."""

from recbole_freq.model.sequential_recommender import (
    BERT4RecDenoiser,
    BSARec,
    FBSARec,
    PolyRec,
    RecDenoiser,
)

MODELS = {
    model.__name__: model for model in (BSARec, FBSARec, PolyRec, RecDenoiser, BERT4RecDenoiser)
}

__all__ = ["MODELS", "BSARec", "FBSARec", "PolyRec", "RecDenoiser", "BERT4RecDenoiser"]
