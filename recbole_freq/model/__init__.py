"""recbole-freq models; ``MODELS`` maps each model name to its class, ``BASELINES`` names
the ones that are the papers' baselines (reimplemented here because RecBole lacks them)."""

from recbole_freq.model.sequential_recommender import (
    BERT4RecDenoiser,
    BSARec,
    DuoRec,
    FBSARec,
    FMLPRec,
    PolyRec,
    RecDenoiser,
)

MODELS = {
    model.__name__: model
    for model in (BSARec, FBSARec, FMLPRec, DuoRec, PolyRec, RecDenoiser, BERT4RecDenoiser)
}
# Comparisons count these with RecBole's built-ins as baselines (the Improv. row).
BASELINES = frozenset({"FMLPRec", "DuoRec"})

__all__ = [
    "BASELINES",
    "MODELS",
    "BSARec",
    "DuoRec",
    "FBSARec",
    "FMLPRec",
    "PolyRec",
    "RecDenoiser",
    "BERT4RecDenoiser",
]
