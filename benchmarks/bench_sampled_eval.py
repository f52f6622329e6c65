"""Sampled evaluation (``uni100``, the SASRec / Rec-Denoiser protocol): scoring cost with
and without ``protocol.sampled_scoring.SampledScorer`` (one full-sort pass per distinct sequence).

RecBole's sampled test loader puts every candidate item (the target and 100 negatives) in
its own row, each with a copy of the user's sequence; ``predict`` used to run the encoder
on every row.  Both variants score the same batches of the real test loader in the same
process, alternating by round; the script checks that the scores agree and reports the
median time ratio (target: at least 10x faster).

    python benchmarks/bench_sampled_eval.py                  # lastfm if prepared
    python benchmarks/bench_sampled_eval.py --model BSARec --batches 4 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_speed import SIZES, default_dataset  # noqa: E402
from common import write_results  # noqa: E402

from recbole_freq.protocol.sampled_scoring import SampledScorer  # noqa: E402


def load_uni100(model_name: str, dataset: str, data_path: str, seed: int):
    from recbole_freq.config.configurator import FreqConfig, properties_dir
    from recbole_freq.quick_start.quick_start import load_splits, new_model

    protocol = str(properties_dir() / "protocol" / "uni100.yaml")
    # The protocol's own eval_batch_size: a batch holds eval_batch_size // 101 users.
    sizes = {key: value for key, value in SIZES.items() if key != "eval_batch_size"}
    overrides = dict(sizes, data_path=data_path, seed=seed, state="ERROR")
    config = FreqConfig(model_name, dataset, [protocol], cmd_overrides=overrides)
    _, (train, _, test) = load_splits(config)
    return config, new_model(config, train).eval(), test


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="RecDenoiser")
    parser.add_argument("--dataset", default=None, help="default: lastfm if prepared, else ml-100k")
    parser.add_argument("--data_path", default="dataset/")
    parser.add_argument("--batches", type=int, default=2, help="test batches timed per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    dataset = args.dataset or default_dataset(args.data_path)

    config, model, test = load_uni100(args.model, dataset, args.data_path, args.seed)
    batches = []
    for batch in test:
        batches.append(batch[0].to(config["device"]))
        if len(batches) == args.batches:
            break

    every_row = model.predict  # the model's own predict: one encoder pass per row
    variants = {"every row": every_row, "distinct sequences": SampledScorer(model)}
    per_round = {name: [] for name in variants}
    rows = sum(len(batch) for batch in batches)
    distinct = sum(torch.unique(batch[model.ITEM_SEQ], dim=0).size(0) for batch in batches)
    with torch.no_grad():
        for batch in batches:
            torch.testing.assert_close(
                variants["distinct sequences"](batch), every_row(batch), rtol=1e-5, atol=1e-5
            )
        for round_index in range(args.rounds):
            order = list(variants) if round_index % 2 == 0 else list(variants)[::-1]
            for name in order:
                start = time.perf_counter()
                for batch in batches:
                    variants[name](batch)
                per_round[name].append(time.perf_counter() - start)
    speedup = statistics.median(
        slow / fast for slow, fast in zip(per_round["every row"], per_round["distinct sequences"])
    )
    result = {
        "model": args.model,
        "dataset": dataset,
        "device": str(config["device"]),
        "threads": torch.get_num_threads(),
        "rows": rows,
        "distinct_sequences": distinct,
        "seconds_per_round": per_round,
        "speedup_median": speedup,
        "target": 10.0,
        "meets_target": speedup >= 10.0,
    }
    table = "\n".join(
        [
            f"uni100 scoring, {args.model} on {dataset}, {len(batches)} test batches "
            f"({rows} rows, {distinct} distinct sequences), {args.rounds} rounds, "
            f"{result['device']}, {result['threads']} threads",
            "",
            "| variant | median s per round |",
            "|---|---|",
            *(f"| {name} | {statistics.median(times):.3f} |" for name, times in per_round.items()),
            "",
            f"speed-up (median of per-round ratios): {speedup:.1f}x (target >= 10x)",
        ]
    )
    print(table)
    write_results(
        args.out, f"sampled-eval-{dataset}-{result['device'].split(':')[0]}", table, result
    )
    return result


if __name__ == "__main__":
    main()
