"""Property (yaml) files of recbole-freq, installed as ``recbole_freq.properties``."""
