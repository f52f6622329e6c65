"""Entry point: ``python run_recbole_freq.py --model=BSARec --dataset=amazon-beauty``."""

import sys

from recbole_freq.cli import main

if __name__ == "__main__":
    sys.exit(main())
