from recbole_freq.model.sequential_recommender.bert4rec_denoiser import BERT4RecDenoiser
from recbole_freq.model.sequential_recommender.bsarec import BSARec
from recbole_freq.model.sequential_recommender.cl4srec import CL4SRec
from recbole_freq.model.sequential_recommender.duorec import DuoRec
from recbole_freq.model.sequential_recommender.fbsarec import FBSARec
from recbole_freq.model.sequential_recommender.fearec import FEARec
from recbole_freq.model.sequential_recommender.fmlprec import FMLPRec
from recbole_freq.model.sequential_recommender.muffin import MUFFIN
from recbole_freq.model.sequential_recommender.polyrec import PolyRec
from recbole_freq.model.sequential_recommender.recdenoiser import RecDenoiser
from recbole_freq.model.sequential_recommender.slime4rec import SLIME4Rec
from recbole_freq.model.sequential_recommender.ssept import SSEPT
from recbole_freq.model.sequential_recommender.tisasrec import TiSASRec
from recbole_freq.model.sequential_recommender.transition_count import TransitionCount
from recbole_freq.model.sequential_recommender.tvrec import TVRec
from recbole_freq.model.sequential_recommender.wearec import WEARec

__all__ = [
    "BSARec",
    "CL4SRec",
    "DuoRec",
    "FBSARec",
    "FEARec",
    "FMLPRec",
    "MUFFIN",
    "PolyRec",
    "RecDenoiser",
    "SLIME4Rec",
    "SSEPT",
    "TiSASRec",
    "TransitionCount",
    "TVRec",
    "WEARec",
    "BERT4RecDenoiser",
]
