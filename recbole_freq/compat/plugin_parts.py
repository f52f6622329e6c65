"""The parts of the plugin's upper layers that RecBole's patched functions call.

A fix lives below the code it needs (the restricted checkpoint loader, the model
restorer, the data guard), so it never imports that code: the package's entry
(``recbole_freq/__init__.py``, above every layer) registers each part once, and a
patched function looks its part up when it runs.
"""

from __future__ import annotations

# What each part is called with and returns.
PARTS = {
    "load_checkpoint": "(file, map_location) -> the checkpoint dict, read safely (fix 2)",
    "plain_checkpoint": "(checkpoint dict) -> its plain-data form (fix 2)",
    "restore_model": "(path, device, trust_data) -> model, config, dataset, splits, checkpoint (fix 2)",
    "download_refusal": "(RecBole dataset) -> the error to raise instead, or None (fix 9)",
}
_registered: dict = {}


def register(**parts) -> None:
    """Register the functions the fixes call, by their names in ``PARTS``."""
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise TypeError(f"unknown plugin parts {unknown}; known: {sorted(PARTS)}")
    _registered.update(parts)


def part(name: str):
    """The registered function ``name``."""
    try:
        return _registered[name]
    except KeyError:
        raise RuntimeError(
            f"recbole-freq's {name} is not registered: import recbole_freq first"
        ) from None
