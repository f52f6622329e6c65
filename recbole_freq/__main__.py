"""``python -m recbole_freq``: the same command line as ``run_recbole_freq.py``."""

import sys

from recbole_freq.cli import main

if __name__ == "__main__":
    sys.exit(main())
