"""The plugin's configuration: ``FreqConfig`` (``configurator``) and the checks of
every setting it holds (``settings``).

``recbole_freq.config.FreqConfig`` and ``recbole_freq.config.SafeConfigLoader`` are the
names under which checkpoints and run files record the config class and its yaml loader
(their ``__module__``); they stay importable here, loaded on first use so that
``settings`` can be read without torch and RecBole.
"""

__all__ = ["FreqConfig", "SafeConfigLoader", "get_model_class"]


def __getattr__(name):
    if name == "SafeConfigLoader":
        from recbole_freq.utils.property_files import SafeConfigLoader

        return SafeConfigLoader
    if name in __all__:
        from recbole_freq.config import configurator

        return getattr(configurator, name)
    raise AttributeError(f"module 'recbole_freq.config' has no attribute {name!r}")
