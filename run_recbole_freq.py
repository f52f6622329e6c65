"""Entry point: ``python run_recbole_freq.py --model=BSARec --dataset=amazon-beauty``."""

import signal
import sys

terminated = []


def _stop(signum, frame):
    terminated.append(signum)
    raise KeyboardInterrupt


try:  # importing torch and RecBole takes seconds: Ctrl-C or SIGTERM may come meanwhile
    signal.signal(signal.SIGTERM, _stop)
    from recbole_freq.cli import main
except KeyboardInterrupt:
    print("interrupted: while starting; nothing was written", file=sys.stderr)
    sys.exit(143 if terminated else 130)

if __name__ == "__main__":
    from recbole_freq.utils.signals import run_to_exit

    sys.exit(run_to_exit(main))
