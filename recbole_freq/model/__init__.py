"""recbole-freq models; ``MODELS`` maps each model name to its class."""

from recbole_freq.model.sequential_recommender import BSARec, FBSARec

MODELS = {model.__name__: model for model in (BSARec, FBSARec)}

__all__ = ["MODELS", "BSARec", "FBSARec"]
