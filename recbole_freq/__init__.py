"""recbole-freq: frequency-domain and denoising sequential recommenders for RecBole.

Importing the package first chooses how torch's OpenMP threads wait (``utils/threads.py``:
OpenMP's own spin, shortened by a governor while the cores are contended, or a passive
wait policy where the governor cannot work; unless the user set one), then
installs RecBole's fixes (``compat``; each is applied when the
RecBole module it repairs is first imported, so the import itself stays light),
registers the plugin's parts that those fixes call (``compat.plugin_parts``: this
module is the top of the layers, so the fixes below never import the code above them),
and offers ``FreqConfig``, ``MODELS`` and ``get_model_class``, loaded on first use.
"""

from recbole_freq.utils.threads import choose_wait_policy

choose_wait_policy()  # before anything loads torch (and with it OpenMP): utils/threads.py

from recbole_freq import compat  # noqa: E402

__version__ = "0.1.0"
__all__ = ["FreqConfig", "MODELS", "get_model_class", "__version__"]


def _load_checkpoint(file, map_location="cpu"):
    from recbole_freq.checkpoint.loader import load_checkpoint

    return load_checkpoint(file, map_location=map_location)


def _plain_checkpoint(checkpoint):
    from recbole_freq.checkpoint.schema import to_plain_checkpoint

    return to_plain_checkpoint(checkpoint)


def _restore_model(path, device="cpu", trust_data=False):
    from recbole_freq.quick_start.restore import restore_model

    return restore_model(path, device=device, trust_data=trust_data)


def _download_refusal(dataset):
    """A plugin run (its config a ``FreqConfig``) never downloads a missing dataset: the
    error that names the ``dataset_prep`` command; a program's own RecBole run: ``None``."""
    from recbole_freq.config.configurator import FreqConfig
    from recbole_freq.data.guard import not_prepared_error

    if not isinstance(dataset.config, FreqConfig):
        return None
    return not_prepared_error(dataset.dataset_name, dataset.dataset_path)


compat.require_recbole()
compat.register(
    load_checkpoint=_load_checkpoint,
    plain_checkpoint=_plain_checkpoint,
    restore_model=_restore_model,
    download_refusal=_download_refusal,
)
compat.apply()


def __getattr__(name):
    # Torch, RecBole's Config and every model load only when one of these is used.
    if name in ("FreqConfig", "get_model_class"):
        from recbole_freq.config import configurator

        return getattr(configurator, name)
    if name == "MODELS":
        from recbole_freq.model import MODELS

        return MODELS
    raise AttributeError(f"module 'recbole_freq' has no attribute {name!r}")
