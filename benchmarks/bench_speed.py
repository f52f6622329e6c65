"""Training and inference speed and peak memory of plugin models against RecBole's SASRec.

Everything is measured in one run on the same prepared data, batches and sizes, with
the models interleaved round by round so that machine noise hits all of them alike;
targets are ratios to RecBole's SASRec, never absolute times.

    python benchmarks/bench_speed.py                       # lastfm if prepared, else ml-100k
    python benchmarks/bench_speed.py --dataset lastfm --models SASRec,BSARec,FBSARec
    python benchmarks/bench_speed.py --dataset lastfm --name speed-baselines \
        --models SASRec,FMLPRec,DuoRec,CL4SRec,FEARec --steps 8 --rounds 3
    python benchmarks/bench_speed.py --models SASRec,TiSASRec --length 200  # n = 200
    python benchmarks/bench_speed.py --models SASRec,FEARec,RecBole:FEARec   # RecBole's class

Peak memory: on CUDA ``max_memory_allocated``; on the CPU each model trains in a child
process whose resident-set high-water mark is reset (``/proc/self/clear_refs``) after
set-up, so the number is the training-time peak above the set-up footprint.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import write_results

HERE = Path(__file__).resolve().parent
SIZES = {
    "hidden_size": 64,
    "inner_size": 256,
    "n_layers": 2,
    "n_heads": 2,
    "MAX_ITEM_LIST_LENGTH": 50,
    "hidden_dropout_prob": 0.5,
    "attn_dropout_prob": 0.5,
    "train_batch_size": 256,
    "eval_batch_size": 256,
    "loss_type": "CE",
    "show_progress": False,
    "state": "WARNING",
}


def default_dataset(data_path: str) -> str:
    return "lastfm" if Path(data_path, "lastfm", "lastfm.inter").is_file() else "ml-100k"


def load(models, dataset, data_path, length, seed=2024):
    from common import load_models, with_optimizers

    from recbole_freq.config.configurator import FreqConfig

    overrides = dict(SIZES, data_path=data_path, seed=seed, MAX_ITEM_LIST_LENGTH=length)
    configs = {m: FreqConfig(builtin_name(m), dataset, cmd_overrides=overrides) for m in models}
    first, (train, _, test), built = load_models(configs, seed, models[0])
    for label in models:
        if label != builtin_name(label):  # RecBole's own class, with the same settings
            from recbole.utils import get_model, init_seed

            init_seed(seed, True)
            klass = get_model(builtin_name(label))
            built[label] = klass(configs[label], train._dataset).to(configs[label]["device"])
    return first, train, test, with_optimizers(built)


def builtin_name(label: str) -> str:
    """``RecBole:FEARec`` names RecBole's own FEARec class (``FEARec``: the plugin's)."""
    return label.removeprefix("RecBole:")


def take(loader, n, device):
    batches = []
    for batch in loader:
        batch = batch[0] if isinstance(batch, tuple) else batch
        batches.append(batch.to(device))
        if len(batches) == n:
            break
    return batches


def train_step(model, optimizer, batch):
    model.train()
    optimizer.zero_grad()
    model.calculate_loss(batch).backward()
    optimizer.step()


@torch.no_grad()
def predict_step(model, _optimizer, batch):
    model.eval()
    model.full_sort_predict(batch)


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_rounds(instances, batches, step, rounds, device, warmup=3):
    """Per round and model, mean milliseconds per step; model order alternates by round."""
    names = list(instances)
    per_round = {name: [] for name in names}
    for name in names:
        for batch in batches[:warmup]:
            step(*instances[name], batch)
    for round_index in range(rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            sync(device)
            start = time.perf_counter()
            for batch in batches[warmup:]:
                step(*instances[name], batch)
            sync(device)
            per_round[name].append((time.perf_counter() - start) * 1000 / (len(batches) - warmup))
    return per_round


def ratios(per_round, reference):
    """Median over rounds of (model time / reference time) in the same round."""
    return {
        name: statistics.median(t / r for t, r in zip(times, per_round[reference]))
        for name, times in per_round.items()
    }


def peak_memory_mb(model_name, dataset, data_path, length, steps, device):
    if torch.device(device).type == "cuda":
        _, train, _, instances = load([model_name], dataset, data_path, length)
        batches = take(train, steps, device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        for batch in batches:
            train_step(*instances[model_name], batch)
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    result = subprocess.run(
        [
            sys.executable,
            __file__,
            "--memory-child",
            model_name,
            "--dataset",
            dataset,
            "--data_path",
            data_path,
            "--steps",
            str(steps),
            "--length",
            str(length),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])["peak_mb"]


def _status_kb(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def memory_child(model_name, dataset, data_path, length, steps):
    import ctypes
    import gc

    _, train, _, instances = load([model_name], dataset, data_path, length)
    batches = take(train, steps, "cpu")
    gc.collect()
    # Hand memory freed during set-up back to the OS, or training could reuse it unseen.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # reset the RSS high-water mark
    base = _status_kb("VmRSS")
    for batch in batches:
        train_step(*instances[model_name], batch)
    print(json.dumps({"peak_mb": (_status_kb("VmHWM") - base) / 1024}))


def main(argv=None):
    import recbole_freq  # noqa: F401  (compatibility fixes)

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="SASRec,BSARec,FBSARec")
    parser.add_argument("--reference", default="SASRec")
    parser.add_argument("--dataset", default=None)
    parser.add_argument("--data_path", default="dataset/")
    parser.add_argument("--steps", type=int, default=23, help="timed steps per round (+3 warm-up)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--length",
        type=int,
        default=SIZES["MAX_ITEM_LIST_LENGTH"],
        help="MAX_ITEM_LIST_LENGTH n; results of another n than 50 are named <name>-n<n>-...",
    )
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument(
        "--name", default="speed", help="results are <out>/<name>-<dataset>-<device>.{md,json}"
    )
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    dataset = args.dataset or default_dataset(args.data_path)
    if args.memory_child:
        memory_child(args.memory_child, dataset, args.data_path, args.length, args.steps)
        return

    models = args.models.split(",")
    if args.reference not in models:
        models.insert(0, args.reference)
    config, train, test, instances = load(models, dataset, args.data_path, args.length)
    device = config["device"]
    steps_per_epoch = len(train)
    train_batches = take(train, args.steps + 3, device)
    eval_batches = take(test, min(args.steps + 3, len(test)), device)
    train_times = time_rounds(instances, train_batches, train_step, args.rounds, device)
    eval_times = time_rounds(instances, eval_batches, predict_step, args.rounds, device, warmup=1)
    train_ratio, eval_ratio = (
        ratios(train_times, args.reference),
        ratios(eval_times, args.reference),
    )
    memory = {
        name: peak_memory_mb(name, dataset, args.data_path, args.length, 8, device)
        for name in models
    }

    n_items = train._dataset.item_num
    header = (
        f"dataset {dataset} ({n_items:,} item ids), batch {SIZES['train_batch_size']}, length "
        f"{args.length}, hidden {SIZES['hidden_size']}, {SIZES['n_layers']} layers; "
        f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"{args.rounds} interleaved rounds of {args.steps} steps"
    )
    rows = [
        "| model | train ms/step (median) | train time / SASRec | est. s/epoch | full-sort ms/batch | inference / SASRec | peak train memory MB | params |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in models:
        model = instances[name][0]
        ms = statistics.median(train_times[name])
        rows.append(
            f"| {name} | {ms:.1f} | {train_ratio[name]:.2f}x | {ms * steps_per_epoch / 1000:.0f} | "
            f"{statistics.median(eval_times[name]):.1f} | {eval_ratio[name]:.2f}x | {memory[name]:.0f} | "
            f"{sum(p.numel() for p in model.parameters()):,} |"
        )
    report = "\n".join([header, "", *rows])
    print(report)
    name = (
        args.name if args.length == SIZES["MAX_ITEM_LIST_LENGTH"] else f"{args.name}-n{args.length}"
    )
    write_results(
        args.out,
        f"{name}-{dataset}-{torch.device(device).type}",
        report,
        {
            "header": header,
            "train_ms": train_times,
            "eval_ms": eval_times,
            "train_ratio": train_ratio,
            "eval_ratio": eval_ratio,
            "peak_memory_mb": memory,
            "steps_per_epoch": steps_per_epoch,
        },
    )


if __name__ == "__main__":
    main()
