"""The plugin's configuration: ``FreqConfig`` (``configurator``) and the checks of
every setting it holds (``settings``).

``recbole_freq.config.FreqConfig`` and ``recbole_freq.config.SafeConfigLoader`` are the
names under which checkpoints and run files record the config class and its yaml loader
(their ``__module__``); they stay importable here.
"""

from recbole_freq.config.configurator import FreqConfig, get_model_class
from recbole_freq.utils.property_files import SafeConfigLoader

__all__ = ["FreqConfig", "SafeConfigLoader", "get_model_class"]
