"""Where BSARec's low-pass filter should switch from the dense projector to rfft/irfft.

``LFC[X]`` (BSARec eq. 2) is computed either as ``P X`` with a precomputed n x n matrix
``P`` or as ``irfft(rfft(X)[:bins])``.  For each sequence length this times one training
step of ``FrequencyRescaler`` alone (forward and backward, batch 256, hidden 64, c = 3)
with both methods, interleaved round by round so machine noise hits both alike, and
reports the median over rounds of the per-round ratio fft / matmul.  The crossover used
by ``FFT_LOW_PASS_FROM_LENGTH`` is the first length from which the FFT wins at every
longer measured length.

    python benchmarks/bench_low_pass.py
    python benchmarks/bench_low_pass.py --lengths 50,100,200 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from recbole_freq.model.frequency import FFT_LOW_PASS_FROM_LENGTH, FrequencyRescaler
from recbole_freq.utils.files import write_atomic

HERE = Path(__file__).resolve().parent
LENGTHS = "16,32,50,64,100,128,144,160,176,200,256,300,400,500,750,1000"


def step_ms(rescaler, hidden, repeats):
    start = time.perf_counter()
    for _ in range(repeats):
        hidden.grad = None
        rescaler(hidden).sum().backward()
    return (time.perf_counter() - start) * 1000 / repeats


def measure(length, batch, hidden_size, c, rounds, repeats):
    torch.manual_seed(0)
    hidden = torch.randn(batch, length, hidden_size, requires_grad=True)
    rescalers = {m: FrequencyRescaler(length, c, hidden_size, method=m) for m in ("matmul", "fft")}
    rescalers["fft"].load_state_dict(rescalers["matmul"].state_dict())
    with torch.no_grad():
        difference = (rescalers["fft"](hidden) - rescalers["matmul"](hidden)).abs().max().item()
    times = {m: [] for m in rescalers}
    for rescaler in rescalers.values():
        step_ms(rescaler, hidden, 2)  # warm-up
    for index in range(rounds):
        order = ("matmul", "fft") if index % 2 == 0 else ("fft", "matmul")
        for method in order:
            times[method].append(step_ms(rescalers[method], hidden, repeats))
    ratio = statistics.median(f / m for f, m in zip(times["fft"], times["matmul"]))
    return {
        "length": length,
        "matmul_ms": statistics.median(times["matmul"]),
        "fft_ms": statistics.median(times["fft"]),
        "fft_over_matmul": ratio,
        "max_abs_difference": difference,
    }


def crossover(rows):
    """First length from which the FFT is faster at this and every longer length."""
    first = None
    for row in rows:
        if row["fft_over_matmul"] < 1.0:
            first = row["length"] if first is None else first
        else:
            first = None
    return first


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", default=LENGTHS)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--hidden_size", type=int, default=64)
    parser.add_argument("--c", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=5, help="steps per round and method")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    rows = []
    for length in (int(n) for n in args.lengths.split(",")):
        row = measure(length, args.batch, args.hidden_size, args.c, args.rounds, args.repeats)
        rows.append(row)
        print(json.dumps(row), flush=True)
    found = crossover(rows)
    header = (
        f"FrequencyRescaler training step (forward + backward), batch {args.batch}, hidden "
        f"{args.hidden_size}, c {args.c}; torch {torch.__version__}, {torch.get_num_threads()} "
        f"CPU threads; median of {args.rounds} interleaved rounds of {args.repeats} steps. "
        f"Measured crossover: {found}; FFT_LOW_PASS_FROM_LENGTH = {FFT_LOW_PASS_FROM_LENGTH}."
    )
    lines = [
        header,
        "",
        "| length | matmul ms/step | fft ms/step | fft / matmul | max abs difference |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['length']} | {row['matmul_ms']:.2f} | {row['fft_ms']:.2f} | "
            f"{row['fft_over_matmul']:.2f}x | {row['max_abs_difference']:.1e} |"
        )
    report = "\n".join(lines) + "\n"
    print(report)
    out = Path(args.out)
    write_atomic(out / "low-pass-crossover-cpu.md", report)
    write_atomic(
        out / "low-pass-crossover-cpu.json",
        json.dumps({"header": header, "crossover": found, "rows": rows}, indent=2) + "\n",
    )


if __name__ == "__main__":
    main()
