"""PolyRec training speed against RecBole's SASRec, as asked in issue 5.

One run, the same prepared data, batches and sizes (those of ``bench_speed.py``), the
variants interleaved round by round so that machine noise hits all of them alike:

- at each sequence length (default 50, 100, 200): SASRec, PolyRec without contrastive
  learning (``cl_weight: 0``) and PolyRec with it, both at K = 3;
- at the first length: PolyRec without CL for each order K (default 1..8).

Times are per training step (forward, loss, backward, Adam step, and for CL the
positive sampling); the per-epoch estimate is that times the steps of one epoch.
Targets of the issue: without CL at most 1.5x SASRec, with CL at most 2.5x, at K = 3.

    python benchmarks/bench_polyrec.py                        # lastfm if prepared
    python benchmarks/bench_polyrec.py --steps 3 --rounds 3 --lengths 50,100
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_speed import SIZES, default_dataset, ratios, take, time_rounds, train_step  # noqa: E402
from common import write_results  # noqa: E402

REFERENCE = "SASRec"


def variants(length: int, orders, main_length: int) -> dict[str, tuple[str, dict]]:
    """label -> (model, config overrides) measured at this sequence length."""
    chosen = {
        REFERENCE: (REFERENCE, {}),
        "PolyRec K=3 no CL": ("PolyRec", {"poly_order": 3, "cl_weight": 0.0}),
        "PolyRec K=3 CL": ("PolyRec", {"poly_order": 3, "cl_weight": 0.1}),
    }
    if length == main_length:
        for order in orders:
            chosen.setdefault(
                f"PolyRec K={order} no CL", ("PolyRec", {"poly_order": order, "cl_weight": 0.0})
            )
    return chosen


def load(chosen, dataset, data_path, length, seed=2024):
    from common import load_models, with_optimizers

    from recbole_freq.config.configurator import FreqConfig

    base = dict(SIZES, MAX_ITEM_LIST_LENGTH=length, data_path=data_path, seed=seed)
    configs = {
        label: FreqConfig(model, dataset, cmd_overrides=dict(base, **extra))
        for label, (model, extra) in chosen.items()
    }
    first, (train, _, _), built = load_models(configs, seed, REFERENCE)
    return first, train, with_optimizers(built)


def main(argv=None):
    import recbole_freq  # noqa: F401  (compatibility fixes)

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default=None)
    parser.add_argument("--data_path", default="dataset/")
    parser.add_argument("--lengths", default="50,100,200")
    parser.add_argument("--orders", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    dataset = args.dataset or default_dataset(args.data_path)
    lengths = [int(v) for v in args.lengths.split(",")]
    orders = [int(v) for v in args.orders.split(",")]

    rows, raw = [], {}
    device = None
    for length in lengths:
        chosen = variants(length, orders, lengths[0])
        config, train, instances = load(chosen, dataset, args.data_path, length)
        device = config["device"]
        batches = take(train, args.steps + args.warmup, device)
        times = time_rounds(instances, batches, train_step, args.rounds, device, args.warmup)
        ratio = ratios(times, REFERENCE)
        raw[length] = {"train_ms": times, "ratio": ratio, "steps_per_epoch": len(train)}
        for label in chosen:
            ms = statistics.median(times[label])
            target = {"PolyRec K=3 no CL": 1.5, "PolyRec K=3 CL": 2.5}.get(label)
            verdict = "" if target is None else ("yes" if ratio[label] <= target else "NO")
            rows.append(
                f"| {length} | {label} | {ms:.0f} | {ratio[label]:.2f}x | "
                f"{ms * len(train) / 1000:.0f} | "
                f"{f'<= {target}x: {verdict}' if target else ''} |"
            )
        del instances

    header = (
        f"dataset {dataset}, batch {SIZES['train_batch_size']}, hidden {SIZES['hidden_size']}, "
        f"{SIZES['n_layers']} layers, {SIZES['n_heads']} heads, dropout "
        f"{SIZES['hidden_dropout_prob']}; device {device}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; {args.rounds} interleaved rounds of {args.steps} "
        f"training steps (+{args.warmup} warm-up) per variant"
    )
    table = [
        "| length | variant | train ms/step (median) | time / SASRec (median ratio) "
        "| est. s/epoch | issue target |",
        "|---|---|---|---|---|---|",
        *rows,
    ]
    report = "\n".join([header, "", *table])
    print(report)
    write_results(
        args.out,
        f"polyrec-speed-{dataset}-{torch.device(device).type}",
        report,
        {"header": header, "lengths": raw},
    )


if __name__ == "__main__":
    main()
