"""Checkpoint files read safely: the restricted loader (``loader``), the plain-data
schema the plugin writes (``schema``) and the unpickling allowlist (``safe_pickle``).
Rebuilding a model from a checkpoint is the run's business
(``recbole_freq.quick_start``)."""
