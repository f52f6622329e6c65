from recbole_freq.model.sequential_recommender.bsarec import BSARec
from recbole_freq.model.sequential_recommender.fbsarec import FBSARec

__all__ = ["BSARec", "FBSARec"]
