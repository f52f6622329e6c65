"""The data guard (prepared atomic files, fingerprints) and training-data noise."""
