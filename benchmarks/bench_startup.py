"""Start-up time of the command line and the package against importing torch alone.

Each command runs in a fresh interpreter, interleaved round by round with the reference
(``python -c "import torch"``), so that machine noise hits all alike; the result is the
median seconds and the median ratio to the reference of the same round.

    python benchmarks/bench_startup.py                 # 7 rounds
    python benchmarks/bench_startup.py --rounds 11 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
COMMANDS = {
    "import torch (reference)": [sys.executable, "-c", "import torch"],
    "import recbole_freq": [sys.executable, "-c", "import recbole_freq"],
    "run_recbole_freq.py --help": [sys.executable, str(ROOT / "run_recbole_freq.py"), "--help"],
    "from recbole_freq import FreqConfig": [
        sys.executable,
        "-c",
        "from recbole_freq import FreqConfig",
    ],
}
REFERENCE = "import torch (reference)"


def seconds(command) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - start


def main(argv=None) -> None:
    from common import write_results

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    for command in COMMANDS.values():  # warm the file cache and .pyc files
        seconds(command)
    times = {name: [] for name in COMMANDS}
    for _ in range(args.rounds):
        for name, command in COMMANDS.items():
            times[name].append(seconds(command))
    ratios = {
        name: statistics.median(t / r for t, r in zip(values, times[REFERENCE]))
        for name, values in times.items()
    }
    rows = ["| command | median s | / import torch |", "|---|---|---|"]
    for name, values in times.items():
        rows.append(f"| `{name}` | {statistics.median(values):.2f} | {ratios[name]:.2f}x |")
    header = f"{args.rounds} interleaved rounds, one fresh interpreter per command; {sys.version.split()[0]}"
    report = "\n".join([header, "", *rows])
    print(report)
    write_results(args.out, "startup-cpu", report, {"seconds": times, "ratio": ratios})


if __name__ == "__main__":
    main()
