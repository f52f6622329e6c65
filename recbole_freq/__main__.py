"""``python -m recbole_freq``: the same command line as ``run_recbole_freq.py``."""

import sys

from recbole_freq.cli import main
from recbole_freq.utils.signals import run_to_exit

if __name__ == "__main__":
    sys.exit(run_to_exit(main))
