"""Why RecBole's Caser is slow at the papers' length, and what its window costs.

RecBole's Caser (and the BSARec authors' copy of it) ties its window L to
``MAX_ITEM_LIST_LENGTH``: one vertical convolution of height L and L horizontal
convolutions of heights 1..L, each run as its own ``Conv2d`` over the whole sequence.  At
L = 50 that is 50 convolutions per forward pass whose work grows as L^3 (height h slides
over L - h + 1 positions), against SASRec's L^2 attention.  This benchmark trains Caser
at several L beside SASRec at 50, interleaved round by round in one process, and times
the horizontal convolutions' share of Caser's forward pass with module hooks.

    python benchmarks/bench_caser.py --data_path <folder> [--lengths 50,20,10,5]

Caser runs with the BSARec authors' settings (nh 8, nv 4, reg_weight 1e-4, dropout 0.5,
embedding 64; RecBole's Caser.yaml has the same filters and regulariser, dropout 0.4).
Only the ratios mean something; times are per training step of batch 256.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from bench_speed import ratios, take, time_rounds, train_step
from common import with_optimizers, write_results

HERE = Path(__file__).resolve().parent
SASREC = {
    "hidden_size": 64,
    "inner_size": 256,
    "n_layers": 2,
    "n_heads": 2,
    "hidden_dropout_prob": 0.5,
    "attn_dropout_prob": 0.5,
}
CASER = {"embedding_size": 64, "nh": 8, "nv": 4, "reg_weight": 1e-4, "dropout_prob": 0.5}
COMMON = {"train_batch_size": 256, "loss_type": "CE", "show_progress": False, "state": "WARNING"}


def build(model, length, dataset, data_path, seed, steps):
    from recbole_freq.config.configurator import FreqConfig
    from recbole_freq.quick_start.quick_start import load_splits, new_model

    settings = SASREC if model == "SASRec" else CASER
    overrides = dict(COMMON, **settings, MAX_ITEM_LIST_LENGTH=length, data_path=data_path)
    config = FreqConfig(model, dataset, cmd_overrides=dict(overrides, seed=seed))
    _, (train, _, _) = load_splits(config)
    built = new_model(config, train)
    torch.autograd.set_detect_anomaly(False)  # RecBole's sine.py turns it on on import
    return built, take(train, steps, "cpu")


def horizontal_share(model, batches) -> float:
    """Share of Caser's forward time spent in its horizontal convolutions (``conv_h``)."""
    spent = [0.0]
    started = {}

    def before(module, _inputs):
        started[module] = time.perf_counter()

    def after(module, _inputs, _output):
        spent[0] += time.perf_counter() - started.pop(module)

    handles = [conv.register_forward_pre_hook(before) for conv in model.conv_h]
    handles += [conv.register_forward_hook(after) for conv in model.conv_h]
    model.train()
    total = 0.0
    with torch.no_grad():
        for batch in batches:
            start = time.perf_counter()
            model.calculate_loss(batch)
            total += time.perf_counter() - start
    for handle in handles:
        handle.remove()
    return spent[0] / total


def main(argv=None):
    import recbole_freq  # noqa: F401  (compatibility fixes)

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="lastfm")
    parser.add_argument("--data_path", default="dataset/")
    parser.add_argument("--lengths", default="50,20,10,5")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per round (+3 warm-up)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]

    models, batches = {}, {}
    models["SASRec L=50"], batches["SASRec L=50"] = build(
        "SASRec", 50, args.dataset, args.data_path, 2024, args.steps + 3
    )
    for length in lengths:
        label = f"Caser L={length}"
        models[label], batches[label] = build(
            "Caser", length, args.dataset, args.data_path, 2024, args.steps + 3
        )
    instances = with_optimizers(models)
    # time_rounds feeds each model its own batches: wrap the step to pick them by model.
    per_round = {name: [] for name in instances}
    for round_index in range(args.rounds):
        order = list(instances) if round_index % 2 == 0 else list(instances)[::-1]
        for name in order:
            times = time_rounds(
                {name: instances[name]}, batches[name], train_step, 1, "cpu", warmup=3
            )
            per_round[name].append(times[name][0])
    relative = ratios(per_round, "SASRec L=50")
    shares = {
        name: horizontal_share(models[name], batches[name][3:])
        for name in models
        if name.startswith("Caser")
    }
    rows, data = [], {}
    for name in instances:
        median = statistics.median(per_round[name])
        share = shares.get(name)
        params = sum(p.numel() for p in models[name].parameters())
        convs = len(models[name].conv_h) if name.startswith("Caser") else None
        rows.append(
            f"| {name} | {median:.1f} | {relative[name]:.2f}x | "
            f"{'' if convs is None else convs} | "
            f"{'' if share is None else f'{share:.0%}'} | {params:,} |"
        )
        data[name] = {
            "train_ms_per_step": median,
            "ratio_to_sasrec": relative[name],
            "horizontal_convolutions": convs,
            "horizontal_share_of_forward": share,
            "parameters": params,
            "per_round_ms": per_round[name],
        }
    header = (
        f"dataset {args.dataset}, batch 256, CPU, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; {args.rounds} interleaved rounds of "
        f"{args.steps} steps (+3 warm-up)\n\n"
        "| model | train ms/step (median) | time / SASRec L=50 | horizontal convs | "
        "their share of the forward pass | params |\n|---|---|---|---|---|---|\n"
    )
    markdown = header + "\n".join(rows) + "\n"
    print(markdown)
    write_results(
        args.out,
        f"caser-window-{args.dataset}-cpu",
        markdown,
        {"settings": {"caser": CASER, "sasrec": SASREC, **COMMON}, "results": data},
    )


if __name__ == "__main__":
    main()
