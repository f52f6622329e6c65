"""Entry point for ``python -m dataset_prep``."""

import sys

from .cli import main

sys.exit(main())
