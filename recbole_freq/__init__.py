"""recbole-freq: frequency-domain and denoising sequential recommenders for RecBole."""

from recbole_freq import compat

compat.require_recbole()
compat.apply()

from recbole_freq.config import FreqConfig, get_model_class  # noqa: E402
from recbole_freq.model import MODELS  # noqa: E402

__version__ = "0.1.0"
__all__ = ["FreqConfig", "MODELS", "get_model_class", "__version__"]
