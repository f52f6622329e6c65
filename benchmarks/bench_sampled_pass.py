"""One whole sampled evaluation pass (the `sasrec` protocol: the target against 100 unseen
items), the trainer's own ``evaluate``, as it was and as it is now.

- **before**: RecBole's ``NegSampleEvalDataLoader.collate_fn`` (the batch built one user at
  a time) and the sampled scorer's sort-based grouping of equal rows
  (``torch.unique(dim=0)``);
- **now**: ``sampled_scoring.batch_sampled_collate`` (each batch built at once, the
  negatives still drawn user by user in RecBole's order) and ``sampled_scoring.equal_runs``
  (runs of consecutive equal rows).

Both variants evaluate the same model on the same validation loader in one process,
alternating by round, each round from the same numpy random state (so the same negatives);
the script checks that they give the same metrics and reports the median ratio of their
times (a ratio measured in the same run: this machine's noise hits both alike).

    python benchmarks/bench_sampled_pass.py --dataset amazon-beauty --data_path DATA
    python benchmarks/bench_sampled_pass.py --model RecDenoiser --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import write_results  # noqa: E402

from recbole_freq.protocol import sampled_scoring  # noqa: E402


def sorted_unique_runs(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The grouping ``SampledScorer`` used before ``equal_runs``: every distinct row once
    (``torch.unique(dim=0)``, a lexicographic sort), with the first row of each."""
    distinct, inverse = torch.unique(key, dim=0, return_inverse=True)
    positions = torch.arange(key.size(0), device=key.device)
    first = torch.full((distinct.size(0),), key.size(0), device=key.device, dtype=torch.long)
    return first.scatter_reduce(0, inverse, positions, reduce="amin"), inverse


@contextlib.contextmanager
def as_before(trainer, loader):
    """RecBole's collate on ``loader`` and the sort-based grouping, for one pass."""
    trainer_module = sys.modules[type(trainer).__module__]
    install, grouping = trainer_module.batch_sampled_collate, sampled_scoring.equal_runs
    loader.collate_fn = type(loader).collate_fn.__get__(loader)
    trainer_module.batch_sampled_collate = lambda loader: False
    sampled_scoring.equal_runs = sorted_unique_runs
    try:
        yield
    finally:
        trainer_module.batch_sampled_collate, sampled_scoring.equal_runs = install, grouping


def evaluate_pass(trainer, loader, variant: str, seed: int) -> tuple[float, dict]:
    with as_before(trainer, loader) if variant == "before" else contextlib.nullcontext():
        np.random.seed(seed)  # RecBole's samplers draw from numpy's global stream
        start = time.perf_counter()
        result = trainer.evaluate(loader, load_best_model=False)
        return time.perf_counter() - start, dict(result)


def placeholders(argv) -> list[str]:
    """The command's arguments with this machine's folders as DATA and OUT."""
    shown, hide = [], {"--data_path": "DATA", "--out": "OUT"}
    arguments = list(argv if argv is not None else sys.argv[1:])
    for index, argument in enumerate(arguments):
        flag = argument.split("=")[0]
        if flag in hide and "=" in argument:
            shown.append(f"{flag}={hide[flag]}")
        elif index and arguments[index - 1] in hide:
            shown.append(hide[arguments[index - 1]])
        else:
            shown.append(argument)
    return shown


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="SASRec")
    parser.add_argument("--dataset", default="amazon-beauty")
    parser.add_argument("--data_path", default="dataset/")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=2020)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)
    from recbole_freq.protocol.trainer import trainer_for
    from recbole_freq.quick_start.quick_start import prepare_run

    overrides = dict(
        protocol="sasrec", MAX_ITEM_LIST_LENGTH=25, data_path=args.data_path, seed=args.seed,
        state="ERROR", show_progress=False,
    )  # fmt: skip
    config, _, (_, valid, _), model = prepare_run(args.model, args.dataset, cmd_overrides=overrides)
    trainer = trainer_for(config, model)
    model.eval()
    per_round: dict[str, list[float]] = {"before": [], "now": []}
    results = {}
    for round_index in range(args.rounds):
        order = ["before", "now"] if round_index % 2 == 0 else ["now", "before"]
        for variant in order:
            seconds, results[variant] = evaluate_pass(trainer, valid, variant, args.seed)
            per_round[variant].append(seconds)
    if results["before"] != results["now"]:
        raise SystemExit(f"the two passes differ: {results['before']} against {results['now']}")
    ratio = statistics.median(b / n for b, n in zip(per_round["before"], per_round["now"]))
    result = {
        "model": args.model,
        "dataset": args.dataset,
        "protocol": "sasrec (n 25, 100 unseen negatives)",
        "users": int(len(valid.uid_list)),
        "device": str(config["device"]),
        "threads": torch.get_num_threads(),
        "seconds_per_round": per_round,
        "speedup_median": ratio,
        "metrics_equal": True,
        "valid_result": results["now"],
    }
    from recbole_freq.utils.reproducibility import code_identity

    code = code_identity()
    result["code"] = code
    command = " ".join(["python benchmarks/bench_sampled_pass.py", *placeholders(argv)])
    table = "\n".join(
        [
            f"Command: `{command}` (commit {str(code.get('commit'))[:10]}"
            f"{', uncommitted changes' if code.get('uncommitted_changes') else ''}).",
            "",
            f"One validation pass (trainer.evaluate), {args.model} on {args.dataset}, protocol "
            f"sasrec (n 25, the target against 100 unseen items), {result['users']} users, "
            f"{args.rounds} interleaved rounds, {result['device']}, {result['threads']} "
            "threads; both variants gave the same metrics",
            "",
            "| variant | median s per pass |",
            "|---|---|",
            *(f"| {name} | {statistics.median(times):.2f} |" for name, times in per_round.items()),
            "",
            f"speed-up (median of per-round ratios): {ratio:.2f}x",
        ]
    )
    print(table)
    stem = f"sampled-pass-{args.model.lower()}-{args.dataset}-{result['device'].split(':')[0]}"
    write_results(args.out, stem, table, result)
    return result


if __name__ == "__main__":
    main()
