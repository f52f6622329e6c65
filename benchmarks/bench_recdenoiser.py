"""Rec-Denoiser's training and inference cost against RecBole's SASRec (issue: speed).

Targets, as ratios to RecBole's SASRec measured in the same run on the same data,
batches and sizes (``bench_speed.SIZES``: hidden 64, 2 layers, 2 heads, length 50,
batch 256, CE): per-epoch training time of RecDenoiser with AR and no Jacobian
regulariser at most 1.3x, with ARM and the Jacobian regulariser at most 3x; full-sort
inference with the learned (deterministic) masks at most 1.1x.  The variants are
interleaved round by round (``bench_speed.time_rounds``); an epoch is the same number of
steps for every model, so the per-step ratio is the per-epoch ratio.

Inference uses masks with a realistic share pruned: ``Phi ~ N(1.5, 1.5)`` (about 16% of
the links below 0.5); the dense computation does not depend on the values.

    python benchmarks/bench_recdenoiser.py                     # lastfm if prepared
    python benchmarks/bench_recdenoiser.py --steps 8 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_speed import (  # noqa: E402
    SIZES,
    default_dataset,
    predict_step,
    ratios,
    take,
    time_rounds,
    train_step,
)
from common import write_results  # noqa: E402

# name: (model, overrides, target training ratio, target inference ratio)
VARIANTS = {
    "SASRec (RecBole)": ("SASRec", {}, None, None),
    "RecDenoiser AR, no Jacobian": (
        "RecDenoiser",
        {"estimator": "AR", "jacobian_gamma": 0.0},
        1.3,
        1.1,
    ),
    "RecDenoiser ARM, no Jacobian": (
        "RecDenoiser",
        {"estimator": "ARM", "jacobian_gamma": 0.0},
        None,
        None,
    ),
    "RecDenoiser ARM + Jacobian": (
        "RecDenoiser",
        {"estimator": "ARM", "jacobian_gamma": 0.001},
        3.0,
        1.1,
    ),
}
REFERENCE = "SASRec (RecBole)"


def load(dataset, data_path, seed=2024):
    from common import load_models, with_optimizers

    from recbole_freq.config.configurator import FreqConfig

    configs = {
        name: FreqConfig(
            model, dataset, cmd_overrides=dict(SIZES, data_path=data_path, seed=seed, **extra)
        )
        for name, (model, extra, _, _) in VARIANTS.items()
    }
    first, (train, _, test), built = load_models(configs, seed, REFERENCE)
    for model in built.values():
        for block in getattr(getattr(model, "encoder", None), "blocks", []):
            operator = block.mixer.attention.operator
            if hasattr(operator, "phi"):
                with torch.no_grad():
                    operator.phi.normal_(1.5, 1.5)
    return first, train, test, with_optimizers(built)


def main(argv=None):
    import recbole_freq  # noqa: F401  (compatibility fixes)

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default=None)
    parser.add_argument("--data_path", default="dataset/")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round (+3 warm-up)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--eval_rounds", type=int, default=None, help="inference rounds (default 3 x rounds)"
    )
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    dataset = args.dataset or default_dataset(args.data_path)

    config, train, test, instances = load(dataset, args.data_path)
    device = config["device"]
    train_batches = take(train, args.steps + 3, device)
    eval_batches = take(test, min(args.steps + 3, len(test)), device)
    train_times = time_rounds(instances, train_batches, train_step, args.rounds, device)
    eval_rounds = args.eval_rounds or 3 * args.rounds
    eval_times = time_rounds(instances, eval_batches, predict_step, eval_rounds, device, warmup=1)
    train_ratio, eval_ratio = ratios(train_times, REFERENCE), ratios(eval_times, REFERENCE)
    pruned = {}
    for name, (model, _) in instances.items():
        if hasattr(model, "learned_masks"):
            pruned[name] = [round(m["pruned_fraction"], 3) for m in model.learned_masks()]

    steps_per_epoch = len(train)
    header = (
        f"dataset {dataset} ({train._dataset.item_num:,} item ids, {steps_per_epoch} steps per "
        f"epoch), batch {SIZES['train_batch_size']}, length {SIZES['MAX_ITEM_LIST_LENGTH']}, "
        f"hidden {SIZES['hidden_size']}, {SIZES['n_layers']} layers, {SIZES['n_heads']} heads; "
        f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"{args.rounds} interleaved training rounds of {args.steps} steps, {eval_rounds} "
        f"inference rounds of {len(eval_batches) - 1} batches; medians over rounds"
    )
    same = [eval_ratio[name] for name in VARIANTS if name != REFERENCE]
    noise_note = (
        "The RecDenoiser variants compute the same function at inference, so the spread of "
        f"their inference ratios ({min(same):.2f}x-{max(same):.2f}x) shows the timing noise."
    )

    def verdict(ratio, target):
        return "-" if target is None else ("yes" if ratio <= target else "**no**")

    rows = [
        "| variant | train ms/step | train / SASRec (target) | met | est. s/epoch "
        "| full-sort ms/batch | inference / SASRec (target) | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, (_, _, train_target, eval_target) in VARIANTS.items():
        ms = statistics.median(train_times[name])
        target_text = f" (<= {train_target})" if train_target else ""
        eval_text = f" (<= {eval_target})" if eval_target else ""
        rows.append(
            f"| {name} | {ms:.1f} | {train_ratio[name]:.2f}x{target_text} | "
            f"{verdict(train_ratio[name], train_target)} | {ms * steps_per_epoch / 1000:.0f} | "
            f"{statistics.median(eval_times[name]):.1f} | {eval_ratio[name]:.2f}x{eval_text} | "
            f"{verdict(eval_ratio[name], eval_target)} |"
        )
    report = "\n".join([header, "", *rows, "", noise_note])
    print(report)
    write_results(
        args.out,
        f"recdenoiser-{dataset}-{torch.device(device).type}",
        report,
        {
            "header": header,
            "train_ms": train_times,
            "eval_ms": eval_times,
            "train_ratio": train_ratio,
            "eval_ratio": eval_ratio,
            "inference_pruned_fraction": pruned,
            "steps_per_epoch": steps_per_epoch,
        },
    )


if __name__ == "__main__":
    main()
