"""recbole-freq models; ``MODELS`` maps each model name to its class, ``BASELINES`` names
the ones that are the papers' baselines (reimplemented here because RecBole lacks them,
or, FEARec, because RecBole's draws its positives and delays with per-row Python loops)."""

from recbole_freq.model import sequential_recommender
from recbole_freq.model.sequential_recommender import (
    MUFFIN,
    SSEPT,
    BERT4RecDenoiser,
    BSARec,
    CL4SRec,
    DuoRec,
    FBSARec,
    FEARec,
    FMLPRec,
    PolyRec,
    RecDenoiser,
    SLIME4Rec,
    TiSASRec,
    TransitionCount,
    TVRec,
    WEARec,
)

MODELS = {
    model.__name__: model
    for model in (
        BSARec,
        FBSARec,
        FMLPRec,
        DuoRec,
        CL4SRec,
        FEARec,
        TiSASRec,
        SSEPT,
        PolyRec,
        SLIME4Rec,
        MUFFIN,
        RecDenoiser,
        BERT4RecDenoiser,
        TransitionCount,
        WEARec,
        TVRec,
    )
}
# Comparisons count these with RecBole's built-ins as baselines (the Improv. row).
BASELINES = frozenset(
    {"FMLPRec", "DuoRec", "CL4SRec", "FEARec", "TiSASRec", "SSEPT", "TransitionCount"}
)

__all__ = ["BASELINES", "MODELS", *sequential_recommender.__all__]
