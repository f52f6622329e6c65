"""The main job's training epoch alone and beside one busy process: this version's
default threads (OpenMP's own spin, shortened by the package's governor while the cores
are contended; one thread per usable core), the previous default (a passive wait policy
after 1,000 spins), the same thread count under OpenMP's own policy without the
governor (what every run did before either), and one thread.

    python benchmarks/bench_shared_cpu.py                       # 2 rounds, ml-100k, BSARec
    python benchmarks/bench_shared_cpu.py --rounds 1 --out benchmarks/results

Each measurement is one fresh process training the README's main job (BSARec, its paper
settings, RecBole's bundled ml-100k) for one epoch; it reports that epoch's training
seconds and how long the governor held its team.  "Before" sets ``GOMP_SPINCOUNT=300000``,
libgomp's own default written out: OpenMP then behaves as with nothing set (spin about
3 ms before sleeping, 100 spins when oversubscribed), exactly what a run of earlier
versions got, and the package, seeing the user's choice, starts no governor.  The busy process is
a Python loop on one core, started in a session of its own (another terminal's job:
Linux's autogroup scheduling then shares the CPU between the two sessions whatever
their nice values).  Configurations alternate within each round, in the opposite order
every other round (so none always runs first); every ratio is to a measurement of the
same round, so slow drifts of a shared machine cancel.  Run it on an otherwise idle
machine: the busy process is meant to be the only other load.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# name: (what the child imports first, run settings, environment it starts with)
SETTINGS = {
    "default threads (this version)": ("package first", {}, {}),
    "default threads, passive after 1,000 spins (the previous default)": (
        "package first", {}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "1000"},
    ),
    "default threads, passive without spinning": (
        "package first", {}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"},
    ),
    "default threads, OpenMP's wait policy (before)": (
        "torch first", {}, {"GOMP_SPINCOUNT": "300000"},
    ),
    "1 thread": ("package first", {"torch_threads": 1}, {}),
}  # fmt: skip
NOW, PREVIOUS, NO_SPIN, BEFORE, ONE = SETTINGS
# --settings' short names
SHORT_NAMES = {
    "now": NOW, "previous": PREVIOUS, "no_spin": NO_SPIN, "before": BEFORE, "one": ONE,
}  # fmt: skip
CHILD = """
import json, sys
if sys.argv[1] == "torch first":
    import torch
from recbole_freq.quick_start import run
from recbole_freq.utils.threads import governor_record
summary = run("BSARec", "ml-100k", config_dict=json.loads(sys.argv[2]), saved=False)
print(json.dumps({"seconds": summary["history"][0]["train_seconds"],
                  "environment": summary["environment"], "governor": governor_record()}))
"""
BUSY = "while True: pass"


def shown(value: float, spec: str, unit: str = "") -> str:
    """A table cell: the value, or "not measured" for a setting or condition left out."""
    return "not measured" if math.isnan(value) else f"{value:{spec}}{unit}"


def governor_cell(rounds: list, name: str) -> str:
    """Median seconds the setting's governor held its team over the rounds (the whole
    process: data loading, the epoch, evaluation), or why there is no figure."""
    held = [r[name].get("governor") for r in rounds if name in r]
    if not held:
        return "not measured"
    if any(record is None for record in held):
        return "no governor"
    return f"{statistics.median(record['engaged_seconds'] for record in held):.1f}"


def one_epoch(order: str, settings: dict, extra_environ: dict, data_path: str) -> dict:
    config = dict(data_path=data_path, epochs=1, show_progress=False, state="WARNING", **settings)
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OMP_", "GOMP_", "RECBOLE_FREQ_", "MKL_NUM_THREADS"))
    }
    environ.update(extra_environ)
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, order, json.dumps(config)],
            capture_output=True,
            text=True,
            cwd=folder,
            env=environ,
            check=False,
        )
    if done.returncode:
        raise SystemExit(f"bench_shared_cpu: a run failed: {done.stderr.strip()[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(condition: str, data_path: str, skip: tuple = (), reverse: bool = False) -> dict:
    """One round: each setting's epoch under ``condition``, in the table's order or, with
    ``reverse``, the other way round (rounds alternate, so no setting always runs first)."""
    busy = None
    if condition == "beside one busy process":
        busy = subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
        time.sleep(1)
    try:
        names = [name for name in SETTINGS if name not in skip]
        return {
            name: one_epoch(*SETTINGS[name], data_path)
            for name in (reversed(names) if reverse else names)
        }
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def main(argv=None) -> None:
    from common import write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument(
        "--spin_counts",
        default="",
        help="more settings to try: the passive policy with each of these GOMP_SPINCOUNTs",
    )
    parser.add_argument(
        "--before_alone_only",
        action="store_true",
        help="measure OpenMP's own policy alone only (beside a busy process it takes ~13 min)",
    )
    parser.add_argument(
        "--alone_only",
        action="store_true",
        help="measure alone only (what the idle-machine target compares), more rounds per hour",
    )
    parser.add_argument(
        "--settings",
        default="now,previous,before,one",
        help=f"which settings, by short name: {', '.join(SHORT_NAMES)}",
    )
    parser.add_argument(
        "--name", default=None, help="file stem (default: shared-cpu-ml-100k-<device>)"
    )
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.settings.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(SHORT_NAMES))
    if unknown or NOW not in {SHORT_NAMES.get(name) for name in chosen}:
        parser.error(f"--settings takes {', '.join(SHORT_NAMES)} and must include now")
    for name in set(SHORT_NAMES) - set(chosen):
        del SETTINGS[SHORT_NAMES[name]]
    for count in [c for c in args.spin_counts.split(",") if c]:
        SETTINGS[f"default threads, passive, spin {int(count)}"] = (
            "package first", {}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": str(int(count))},
        )  # fmt: skip
    import recbole

    data_path = str(Path(recbole.__file__).parent / "dataset_example")
    conditions = ("alone", "beside one busy process")
    results = {condition: [] for condition in conditions}
    for round_ in range(args.rounds):
        for condition in conditions[:1] if args.alone_only else conditions:
            skip = (BEFORE,) if args.before_alone_only and condition != "alone" else ()
            results[condition].append(measure(condition, data_path, skip, round_ % 2 == 1))

    def median(condition, name):
        if not results[condition] or name not in results[condition][0]:
            return float("nan")
        return statistics.median(r[name]["seconds"] for r in results[condition])

    def ratio(condition, name, reference):
        rounds = results[condition]
        if not rounds or name not in rounds[0] or reference not in rounds[0]:
            return float("nan")
        return statistics.median(
            r[name]["seconds"] / r[reference]["seconds"] for r in results[condition]
        )

    rows = [
        "| setting | threads | wait policy, spin count | alone: s | beside a busy process: s | "
        "busy / alone | / 1 thread, busy | / before, alone | governor held its team: s, "
        "alone / busy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in SETTINGS:
        record = results["alone"][0][name]["environment"]
        pairs = list(zip(results["alone"], results["beside one busy process"]))
        slowdown = statistics.median(
            busy[name]["seconds"] / alone[name]["seconds"] if name in busy else float("nan")
            for alone, busy in pairs
        ) if pairs else float("nan")  # fmt: skip
        rows.append(
            f"| {name} | {record['torch_threads']} | {record['omp_wait_policy'] or 'unset'}, "
            f"{record.get('gomp_spincount') or 'unset'} | "
            f"{shown(median('alone', name), '.1f')} | "
            f"{shown(median(conditions[1], name), '.1f')} | {shown(slowdown, '.2f', 'x')} | "
            f"{shown(ratio(conditions[1], name, ONE), '.2f', 'x')} | "
            f"{shown(ratio('alone', name, BEFORE), '.2f', 'x')} | "
            f"{governor_cell(results['alone'], name)} / "
            f"{governor_cell(results[conditions[1]], name)} |"
        )
    environment = results["alone"][0][NOW]["environment"]
    header = (
        f"The main job (BSARec, paper settings, ml-100k bundled with RecBole, one epoch per "
        f"process, training seconds of that epoch), {args.rounds} interleaved round(s); "
        f"{environment['device_name']}, {environment['usable_cores']} usable cores, torch "
        f"{environment['torch']}. Busy process: one Python loop in a session of its own. "
        f"Command: `python benchmarks/bench_shared_cpu.py {' '.join(sys.argv[1:])}`."
    )
    targets = (
        f"Targets (issue 'Fast where researchers run it'): beside a busy process the default "
        f"no slower than 1 thread (here {shown(ratio(conditions[1], NOW, ONE), '.2f', 'x')}); "
        f"alone no more than 5% slower than before (here "
        f"{shown(ratio('alone', NOW, BEFORE), '.2f', 'x')})."
    )
    per_round = [
        f"- {name}: "
        + ", ".join(f"{r[name]['seconds'] / r[BEFORE]['seconds']:.3f}x" for r in results["alone"])
        for name in SETTINGS
        if name != BEFORE and BEFORE in SETTINGS
    ]
    if per_round:
        per_round.insert(0, "Alone, each round's time over the same round's 'before' (the spread):")
        per_round.append("")
    markdown = "\n".join([header, "", *rows, "", *per_round, targets])
    print(markdown)
    write_results(
        args.out, args.name or f"shared-cpu-ml-100k-{environment['device']}", markdown,
        {"results": results, "args": vars(args)},
    )  # fmt: skip


if __name__ == "__main__":
    main()
