"""The plugin's configuration: ``FreqConfig`` (``configurator``) and the checks of
every setting it holds (``settings``).

``recbole_freq.config.FreqConfig`` is the name under which checkpoints and run files
pickle the config class (``FreqConfig.__module__``); it stays importable here, loaded on
first use so that ``settings`` can be read without torch and RecBole.
"""

__all__ = ["FreqConfig", "get_model_class"]


def __getattr__(name):
    if name in __all__:
        from recbole_freq.config import configurator

        return getattr(configurator, name)
    raise AttributeError(f"module 'recbole_freq.config' has no attribute {name!r}")
