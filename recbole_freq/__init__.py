"""recbole-freq: frequency-domain and denoising sequential recommenders for RecBole.

Importing the package installs RecBole's fixes (``compat``; each is applied when the
RecBole module it repairs is first imported, so the import itself stays light) and
offers ``FreqConfig``, ``MODELS`` and ``get_model_class``, loaded on first use.
"""

from recbole_freq import compat

compat.require_recbole()
compat.apply()

__version__ = "0.1.0"
__all__ = ["FreqConfig", "MODELS", "get_model_class", "__version__"]


def __getattr__(name):
    # Torch, RecBole's Config and every model load only when one of these is used.
    if name in ("FreqConfig", "get_model_class"):
        from recbole_freq.config import configurator as config

        return getattr(config, name)
    if name == "MODELS":
        from recbole_freq.model import MODELS

        return MODELS
    raise AttributeError(f"module 'recbole_freq' has no attribute {name!r}")
