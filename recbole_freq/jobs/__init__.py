"""The jobs built on single runs: ``compare`` (multi-seed comparison), ``tune`` (Ray
Tune search), ``analyze`` (spectra of a trained model), ``recommend`` and ``evaluate``."""
