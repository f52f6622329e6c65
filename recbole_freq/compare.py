"""Side-by-side comparison of several models over several seeds (``--compare``).

Every model is trained by :func:`recbole_freq.quick_start.run`, i.e. on the same prepared
split and evaluation protocol (``properties/overall.yaml``), each with its own property
file, once per seed.  The results are summarised as in the papers' main tables (BSARec
Table 2, FMLP-Rec Table 2, Rec-Denoiser Table 2): mean ± std over seeds per metric, the
relative improvement of each proposed model over the best baseline per metric (the
"Improv." row), a paired t-test across seeds against that baseline, and the training time
per epoch and parameter count (BSARec Table 4, FMLP-Rec Table 8)::

    python run_recbole_freq.py --compare BSARec,SASRec,BERT4Rec,FEARec \\
        --dataset=amazon-beauty --seeds 2024,2025,2026 --epochs=200

Each finished run is stored at once as ``<out>/runs/<model>-seed<seed>.json``; a repeated
command skips the runs already stored (so an interrupted comparison resumes), provided they
were made with the same dataset, config files and overrides.  Outputs:
``<out>/comparison.csv``, ``<out>/comparison.md``, ``<out>/comparison.png`` and
``<out>/runs.csv`` (one row per run).
"""

from __future__ import annotations

import ast
import csv
import hashlib
import io
import json
import math
import os
import time
from pathlib import Path

import numpy as np

from recbole_freq.files import check_writable, plain_value, write_atomic
from recbole_freq.model import MODELS
from recbole_freq.quick_start import extra_test_modes
from recbole_freq.ray_cluster import check_resources, import_ray, start_or_join

DEFAULT_SEEDS = (2024, 2025, 2026)
DEFAULT_METRICS = tuple(f"{name}@{k}" for name in ("hit", "ndcg") for k in (5, 10, 20))
# Shown by default for each of the run's ``extra_test_modes`` (e.g. ``uni100:hit@10``): the
# sampled protocol's papers (Rec-Denoiser, SASRec) report @10 only.
DEFAULT_EXTRA_MODE_METRICS = ("hit@10", "ndcg@10")
RUN_FORMAT = 1
# Summary parts that are not needed for the tables; quick_start still writes the full
# summary next to the checkpoint (``summary_file``).
DROPPED_SUMMARY_KEYS = ("model_report",)
# Keys the comparison sets itself, per run.
RESERVED_OVERRIDES = ("model", "dataset", "seed")


class ComparisonError(ValueError):
    """Bad comparison input or an output folder that holds other settings' runs."""


# ---------------------------------------------------------------------------- settings


def _normalise_value(value):
    """An override as RecBole will read it: ``"1"`` from the command line and ``1`` from
    Python are the same setting (RecBole evaluates string overrides)."""
    if isinstance(value, str):
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return plain_value(value)


def _file_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_settings(dataset: str, config_files, overrides: dict) -> dict:
    """What makes two runs comparable: dataset, config file contents and overrides."""
    files = []
    for path in config_files or []:
        if not Path(path).is_file():
            raise FileNotFoundError(f"config file {path!r} does not exist")
        files.append({"path": str(Path(path).resolve()), "sha256": _file_digest(path)})
    return {
        "dataset": dataset,
        "config_files": files,
        "overrides": {key: _normalise_value(value) for key, value in sorted(overrides.items())},
    }


def _settings_difference(stored: dict, wanted: dict) -> list[str]:
    differences = []
    if stored.get("dataset") != wanted["dataset"]:
        differences.append(f"dataset {stored.get('dataset')!r} vs {wanted['dataset']!r}")
    stored_files = [f["sha256"] for f in stored.get("config_files", [])]
    if stored_files != [f["sha256"] for f in wanted["config_files"]]:
        differences.append(
            "config files "
            f"{[f['path'] for f in stored.get('config_files', [])]} vs "
            f"{[f['path'] for f in wanted['config_files']]} (paths or contents differ)"
        )
    old, new = stored.get("overrides", {}), wanted["overrides"]
    for key in sorted(set(old) | set(new)):
        if old.get(key, "<unset>") != new.get(key, "<unset>"):
            differences.append(f"--{key}: {old.get(key, '<unset>')} vs {new.get(key, '<unset>')}")
    return differences


# ---------------------------------------------------------------------------- run files


def run_file(out: Path, model: str, seed: int) -> Path:
    return out / "runs" / f"{model}-seed{seed}.json"


def partial_file(out: Path, model: str, seed: int) -> Path:
    """The resume state of an unfinished run (removed when the run is stored)."""
    return out / "partial" / f"{model}-seed{seed}.resume.pth"


def _load_run(path: Path) -> dict:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ComparisonError(
            f"cannot read run file {path}: {error}; delete it to redo the run"
        ) from error
    if not isinstance(record, dict) or "settings" not in record or "summary" not in record:
        raise ComparisonError(f"{path} is not a comparison run file; delete it to redo the run")
    return record


def _check_out_dir(out: Path, settings: dict) -> None:
    """Every run stored in ``out`` must have been made with ``settings``: an output folder
    holds one comparison, never a silent mix of settings."""
    for path in sorted((out / "runs").glob("*.json")):
        differences = _settings_difference(_load_run(path)["settings"], settings)
        if differences:
            raise ComparisonError(
                f"{out} already holds runs made with other settings ({path.name}: "
                + "; ".join(differences)
                + "). Pick another --out, or delete "
                + str(out / "runs")
                + " to redo them with the new settings."
            )


def _store_run(out: Path, settings: dict, model: str, seed: int, summary: dict) -> Path:
    kept = {key: value for key, value in summary.items() if key not in DROPPED_SUMMARY_KEYS}
    record = {
        "format": RUN_FORMAT,
        "model": model,
        "seed": seed,
        "settings": settings,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "summary": kept,
    }
    path = run_file(out, model, seed)
    write_atomic(path, json.dumps(record, indent=2, default=str))
    return path


# ---------------------------------------------------------------------------- training


def _train_one(
    model, dataset, config_files, overrides, seed, workdir=None, models=(), resume_file=None
) -> dict:
    """One run of the comparison (also the body of a Ray task); ``models``: all compared
    models, which share the overrides (a key one of them reads is accepted);
    ``resume_file``: the run's resume state, continued from if it exists."""
    from recbole_freq.quick_start import run

    if workdir and os.path.isdir(workdir):
        # Ray workers of a remote cluster may start elsewhere; relative paths
        # (data_path, checkpoint_dir, log/) are meant relative to the driver's folder.
        os.chdir(workdir)
    return run(
        model,
        dataset,
        config_files,
        cmd_overrides={**overrides, "seed": seed},
        shared_with=models,
        resume_file=resume_file,
    )


def _validate(models, dataset, config_files, overrides, seeds) -> dict:
    """Build each model's configuration once before any training, so that an unknown model,
    a missing file or an unprepared dataset fails in seconds, not after hours of runs.
    Returns the configuration of the first model (for the protocol notes)."""
    from recbole_freq.config import FreqConfig
    from recbole_freq.data import check_prepared

    first = None
    for model in models:
        config = FreqConfig(
            model,
            dataset,
            config_files,
            cmd_overrides={**overrides, "seed": seeds[0]},
            shared_with=models,
        )
        check_prepared(config)
        if first is None:
            first = config
    return first


def _run_sequential(jobs, dataset, config_files, overrides, out, settings, log, models):
    trained = []
    for index, (model, seed) in enumerate(jobs, 1):
        log(f"[{index}/{len(jobs)}] training {model} seed {seed} ...")
        summary = _train_one(
            model,
            dataset,
            config_files,
            overrides,
            seed,
            models=tuple(models),
            resume_file=partial_file(out, model, seed),
        )
        _store_run(out, settings, model, seed, summary)
        trained.append((model, seed))
        log(f"[{index}/{len(jobs)}] {model} seed {seed} done: {_headline(summary)}")
    return trained


def _run_on_ray(jobs, dataset, config_files, overrides, out, settings, log, ray_options, models):
    ray = import_ray("--ray", "ray[default]", ComparisonError)
    started_here = start_or_join(ray, ray_options.get("address"), error=ComparisonError)
    try:
        _check_ray_resources(ray.cluster_resources(), ray_options, started_here, log)
    except ComparisonError:
        if started_here:
            ray.shutdown()
        raise
    remote = ray.remote(_train_one).options(
        num_cpus=ray_options.get("cpus_per_run", 1.0),
        num_gpus=ray_options.get("gpus_per_run", 0.0),
        max_retries=0,
    )
    workdir = os.getcwd()
    pending = {
        remote.remote(
            model,
            dataset,
            config_files,
            overrides,
            seed,
            workdir,
            tuple(models),
            str(partial_file(out, model, seed).resolve()),
        ): (model, seed)
        for model, seed in jobs
    }
    log(f"submitted {len(pending)} runs to Ray")
    trained, failures = [], []
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            model, seed = pending.pop(done[0])
            try:
                summary = ray.get(done[0])
            except Exception as error:  # reported below; the other runs go on
                failures.append(f"{model} seed {seed}: {error}")
                log(f"{model} seed {seed} FAILED: {error}")
                continue
            # Stored as each run finishes, so an interrupted comparison keeps them.
            _store_run(out, settings, model, seed, summary)
            trained.append((model, seed))
            log(f"[{len(trained)}/{len(jobs)}] {model} seed {seed} done: {_headline(summary)}")
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()
    if failures:
        raise RuntimeError(f"{len(failures)} Ray run(s) failed:\n" + "\n".join(failures))
    return trained


def _check_ray_resources(resources: dict, ray_options: dict, started_here: bool, log) -> None:
    """A run asking for more than the cluster has waits forever: refused on a local
    instance, a warning on a cluster (``ray_cluster.check_resources``)."""
    wanted = {
        "CPU": (ray_options.get("cpus_per_run", 0.0), "cpus_per_run"),
        "GPU": (ray_options.get("gpus_per_run", 0.0), "gpus_per_run"),
    }
    local = not (ray_options.get("address") or os.environ.get("RAY_ADDRESS"))
    check_resources(resources, wanted, started_here, local, log, error=ComparisonError)


def _headline(summary: dict) -> str:
    test = summary["test_result"]
    shown = ", ".join(f"{m} {test[m]:.4f}" for m in ("hit@10", "ndcg@10") if m in test)
    return f"test {shown or test}; {summary['epochs_run']} epochs"


# ---------------------------------------------------------------------------- statistics


def _available_metrics(config) -> set[str]:
    """The test metrics of the run's own protocol (``hit@10``) and, for every entry of
    ``extra_test_modes``, the same metrics under that mode (``uni100:hit@10``)."""
    names = [m.lower() for m in config["metrics"]]
    topk = config["topk"] if isinstance(config["topk"], list) else [config["topk"]]
    own = {f"{name}@{k}" for name in names for k in topk} | set(names)
    return own | {f"{mode}:{m}" for mode in extra_test_modes(config) for m in own}


def _choose_metrics(metrics, config) -> list[str]:
    available = _available_metrics(config)
    if metrics is None:
        chosen = [m for m in DEFAULT_METRICS if m in available] or sorted(
            m for m in available if ":" not in m
        )
        extra = [
            f"{mode}:{m}" for mode in extra_test_modes(config) for m in DEFAULT_EXTRA_MODE_METRICS
        ]
        return chosen + [m for m in extra if m in available]
    chosen = [m.strip().lower() for m in metrics if m.strip()]
    missing = [m for m in chosen if m not in available]
    if missing:
        raise ComparisonError(
            f"metric(s) {', '.join(missing)} are not evaluated with this configuration; "
            f"available: {', '.join(sorted(available))} (set RecBole's metrics/topk to add, "
            "or extra_test_modes for <mode>:<metric>)"
        )
    if len(set(chosen)) != len(chosen):
        raise ComparisonError(f"--metrics lists a metric twice: {metrics}")
    return chosen


def metric_value(summary: dict, metric: str) -> float:
    """A run's test value of ``metric``: ``hit@10`` from its own protocol, ``uni100:hit@10``
    from the extra test mode ``uni100`` (``quick_start.evaluate_extra_test_modes``)."""
    mode, _, name = metric.rpartition(":")
    results = summary["extra_test_results"][mode] if mode else summary["test_result"]
    return results[name]


def _smaller_is_better(metric: str) -> bool:
    from recbole.evaluator.register import smaller_metrics

    return metric.rpartition(":")[2].split("@")[0] in smaller_metrics


def paired_p_value(values, reference) -> float | None:
    """Two-sided paired t-test across seeds (``scipy.stats.ttest_rel``); ``None`` where it is
    undefined: fewer than two seeds, or differences without variance (scipy would report
    p = 0 or nan, neither of which is evidence)."""
    from scipy.stats import ttest_rel

    values, reference = np.asarray(values, float), np.asarray(reference, float)
    difference = values - reference
    if len(difference) < 2 or np.allclose(difference, difference[0], rtol=0, atol=1e-12):
        return None
    p_value = float(ttest_rel(values, reference).pvalue)
    return None if math.isnan(p_value) else p_value


def improvement(value: float, baseline: float, smaller_better: bool = False) -> float | None:
    """Relative improvement in percent, positive = better (the papers' "Improv.")."""
    if baseline == 0:
        return None
    change = float((value - baseline) / abs(baseline) * 100)
    return -change if smaller_better else change


def summarise(records: dict, models, seeds, metrics, baselines) -> list[dict]:
    """One row per model: mean/std per metric and, for proposed models, improvement over
    the best baseline per metric and the paired t-test against it."""
    rows = []
    per_model = {}
    for model in models:
        summaries = [records[(model, seed)]["summary"] for seed in seeds]
        values = {m: [metric_value(s, m) for s in summaries] for m in metrics}
        per_model[model] = values
        seconds = [s["train_seconds_per_epoch"] for s in summaries]
        epochs = [s["epochs_run"] for s in summaries]
        row = {
            "model": model,
            "role": "baseline" if model in baselines else "proposed",
            "seeds": len(seeds),
        }
        for metric in metrics:
            row[f"{metric}_mean"] = float(np.mean(values[metric]))
            row[f"{metric}_std"] = _std(values[metric])
        row.update(
            train_seconds_per_epoch_mean=float(np.mean(seconds)),
            train_seconds_per_epoch_std=_std(seconds),
            epochs_run_mean=float(np.mean(epochs)),
            parameters=int(summaries[0]["parameters"]),
        )
        rows.append(row)

    best_baseline = {}
    baseline_rows = [row for row in rows if row["role"] == "baseline"]
    for metric in metrics:
        if baseline_rows:
            pick = min if _smaller_is_better(metric) else max
            best_baseline[metric] = pick(baseline_rows, key=lambda r: r[f"{metric}_mean"])["model"]
    for row in rows:
        for metric in metrics:
            gain = p_value = reference = None
            if row["role"] == "proposed" and metric in best_baseline:
                reference = best_baseline[metric]
                gain = improvement(
                    row[f"{metric}_mean"],
                    np.mean(per_model[reference][metric]),
                    _smaller_is_better(metric),
                )
                p_value = paired_p_value(
                    per_model[row["model"]][metric], per_model[reference][metric]
                )
            row[f"{metric}_best_baseline"] = reference
            row[f"{metric}_improv_pct"] = gain
            row[f"{metric}_p_value"] = p_value
    return rows


def _std(values) -> float:
    # Sample standard deviation across seeds (ddof=1), 0 for a single seed.
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


# ---------------------------------------------------------------------------- output


def csv_text(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buffer.getvalue()


def runs_csv_text(records: dict, models, seeds, metrics) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        ["model", "seed", *metrics, "train_seconds_per_epoch", "epochs_run", "best_epoch",
         "parameters", "checkpoint"]
    )  # fmt: skip
    for model in models:
        for seed in seeds:
            s = records[(model, seed)]["summary"]
            writer.writerow(
                [model, seed, *(metric_value(s, m) for m in metrics),
                 s["train_seconds_per_epoch"], s["epochs_run"], s["best_epoch"],
                 s["parameters"], s["checkpoint"]]
            )  # fmt: skip
    return buffer.getvalue()


def markdown_table(rows, metrics, dataset, seeds, protocol: str = "") -> str:
    """The papers' layout: a mean ± std row per model (best mean in bold), then per proposed
    model an "Improv." row and a paired t-test row against the best baseline."""
    header = ["Model", *metrics, "s/epoch (train)", "epochs", "parameters"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    best = {}
    for metric in metrics:
        pick = min if _smaller_is_better(metric) else max
        best[metric] = pick(row[f"{metric}_mean"] for row in rows)
    # With one seed there is no spread to show: values alone.
    spread = len(seeds) > 1
    for row in rows:
        cells = [row["model"] + (" (baseline)" if row["role"] == "baseline" else "")]
        for metric in metrics:
            text = f"{row[f'{metric}_mean']:.4f}"
            text += f" ± {row[f'{metric}_std']:.4f}" if spread else ""
            cells.append(f"**{text}**" if row[f"{metric}_mean"] == best[metric] else text)
        seconds = _seconds(row["train_seconds_per_epoch_mean"])
        cells += [
            seconds + (f" ± {_seconds(row['train_seconds_per_epoch_std'])}" if spread else ""),
            f"{row['epochs_run_mean']:.1f}",
            f"{row['parameters']:,}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    for row in rows:
        if row["role"] != "proposed" or not any(row[f"{m}_best_baseline"] for m in metrics):
            continue
        gains, tests = [f"Improv. {row['model']}"], [f"p (paired t) {row['model']}"]
        for metric in metrics:
            gain, p_value = row[f"{metric}_improv_pct"], row[f"{metric}_p_value"]
            gains.append("n/a" if gain is None else f"{gain:+.2f}%")
            tests.append("n/a" if p_value is None else f"{p_value:.3g}")
        lines.append("| " + " | ".join(gains + [""] * 3) + " |")
        lines.append("| " + " | ".join(tests + [""] * 3) + " |")

    notes = [
        "",
        f"Dataset {dataset}; test results, "
        + (
            f"mean ± sample std over {len(seeds)} seeds ({', '.join(map(str, seeds))}); "
            "best mean per metric in bold."
            if spread
            else f"one seed ({seeds[0]}); best per metric in bold."
        ),
    ]
    # The best baseline per metric is the same for every proposed row.
    references = {
        metric: row[f"{metric}_best_baseline"]
        for row in rows
        for metric in metrics
        if row[f"{metric}_best_baseline"]
    }
    if references:
        notes.append(
            "Improv.: relative change of the proposed model's mean over the best baseline's "
            "mean per metric (positive = better); p: two-sided paired t-test across seeds "
            "against that baseline (n/a with fewer than 2 seeds or no variance). Best "
            "baseline: " + _describe_references(references) + "."
        )
    else:
        notes.append("No Improv. rows: the comparison has no baseline or no proposed model.")
    if protocol:
        notes.append(protocol)
    return "\n".join(lines + notes) + "\n"


def _describe_references(references: dict) -> str:
    if len(set(references.values())) == 1:
        return f"{next(iter(references.values()))} for every metric"
    return ", ".join(f"{metric} {model}" for metric, model in references.items())


def _seconds(value: float) -> str:
    return f"{value:.2f}" if value >= 1 else f"{value:.3f}"


def save_plot(path: Path, rows, metrics, dataset, seeds) -> None:
    """Grouped bars (one group per metric, one bar per model) with std error bars."""
    # Figure without pyplot: no GUI backend, safe in headless workers and threads.
    from matplotlib.figure import Figure

    n_models = len(rows)
    width = 0.8 / n_models
    figure = Figure(figsize=(max(6.0, 1.1 * len(metrics) * max(1, n_models / 2)), 4.2))
    axes = figure.subplots()
    positions = np.arange(len(metrics))
    for index, row in enumerate(rows):
        axes.bar(
            positions + (index - (n_models - 1) / 2) * width,
            [row[f"{m}_mean"] for m in metrics],
            width,
            yerr=[row[f"{m}_std"] for m in metrics],
            capsize=3,
            label=row["model"] + (" (baseline)" if row["role"] == "baseline" else ""),
        )
    axes.set_xticks(positions, metrics)
    axes.set_ylabel("test value (mean ± std)")
    axes.set_title(f"{dataset}: {n_models} models, {len(seeds)} seed(s)")
    axes.legend(fontsize="small")
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    write_atomic(path, lambda handle: figure.savefig(handle, format="png", dpi=120))


def _protocol_note(config) -> str:
    note = (
        f"Protocol: eval_args {dict(config['eval_args'])}, valid_metric {config['valid_metric']}, "
        f"epochs ≤ {config['epochs']}, stopping_step {config['stopping_step']}."
    )
    modes = extra_test_modes(config)
    if modes:
        note += (
            f" Columns <mode>:<metric> test the same best checkpoint, on the same split, "
            f"under the extra test mode(s) {', '.join(modes)} (uni<N>: the target ranked "
            "against N uniformly sampled negatives)."
        )
    return note


# ---------------------------------------------------------------------------- API


def _parse_list(value, name) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value)
    items = [str(item).strip() for item in items if str(item).strip()]
    if not items:
        raise ComparisonError(f"{name} is empty")
    if len(set(items)) != len(items):
        raise ComparisonError(f"{name} lists an entry twice: {', '.join(items)}")
    return items


def _parse_seeds(seeds) -> list[int]:
    values = []
    for item in _parse_list(seeds, "--seeds"):
        try:
            values.append(int(item))
        except ValueError as error:
            raise ComparisonError(
                f"seed {item!r} is not an integer (--seeds 2024,2025,2026)"
            ) from error
    return values


def compare(
    models,
    dataset: str,
    seeds=DEFAULT_SEEDS,
    config_files=None,
    overrides: dict | None = None,
    out=None,
    baselines=None,
    metrics=None,
    use_ray: bool = False,
    cpus_per_run: float = 1.0,
    gpus_per_run: float = 0.0,
    ray_address: str | None = None,
    log=print,
) -> dict:
    """Train ``models`` x ``seeds`` on ``dataset`` (skipping runs already stored in ``out``)
    and write the comparison tables and plot.

    ``baselines``: the models the "Improv." row compares against; by default the RecBole
    built-ins among ``models`` (the others, i.e. plugin models, are "proposed").
    Returns ``rows`` (one dict per model, as in ``comparison.csv``), ``markdown``,
    ``files``, and the ``trained`` and ``skipped`` (model, seed) pairs.
    """
    from recbole_freq.config import get_model_class

    models = _parse_list(models, "--compare")
    seeds = _parse_seeds(seeds)
    overrides = dict(overrides or {})
    reserved = [key for key in RESERVED_OVERRIDES if key in overrides]
    if reserved:
        raise ComparisonError(
            f"--{reserved[0]} cannot be an override of a comparison: give models with "
            "--compare, the dataset with --dataset and seeds with --seeds"
        )
    for model in models:
        get_model_class(model)  # UnknownModelError names the known models
    if baselines is None:
        baselines = [model for model in models if model not in MODELS]
    else:
        baselines = _parse_list(baselines, "--baselines")
        unknown = [model for model in baselines if model not in models]
        if unknown:
            raise ComparisonError(
                f"baseline(s) {', '.join(unknown)} are not among the compared models "
                f"({', '.join(models)})"
            )
    if not use_ray and (cpus_per_run != 1.0 or gpus_per_run != 0.0 or ray_address):
        raise ComparisonError("--cpus_per_run, --gpus_per_run and --ray_address need --ray")
    if cpus_per_run <= 0 or gpus_per_run < 0:
        raise ComparisonError("--cpus_per_run must be > 0 and --gpus_per_run >= 0")
    out = Path(out) if out is not None else Path("comparisons") / dataset
    config_files = list(config_files or [])

    settings = run_settings(dataset, config_files, overrides)
    config = _validate(models, dataset, config_files, overrides, seeds)
    metrics = _choose_metrics(
        None if metrics is None else _parse_list(metrics, "--metrics"), config
    )
    check_writable(out, "--out")
    _check_out_dir(out, settings)

    jobs = [(m, s) for m in models for s in seeds if not run_file(out, m, s).is_file()]
    skipped = [(m, s) for m in models for s in seeds if (m, s) not in jobs]
    if skipped:
        log(f"{len(skipped)} run(s) already stored in {out / 'runs'}: skipped")
    try:
        if jobs and use_ray:
            ray_options = dict(
                address=ray_address, cpus_per_run=cpus_per_run, gpus_per_run=gpus_per_run
            )
            trained = _run_on_ray(
                jobs, dataset, config_files, overrides, out, settings, log, ray_options, models
            )
        elif jobs:
            trained = _run_sequential(
                jobs, dataset, config_files, overrides, out, settings, log, tuple(models)
            )
        else:
            trained = []
    except KeyboardInterrupt as interrupt:
        from recbole_freq.quick_start import RunInterrupted

        stored = sum(run_file(out, m, s).is_file() for m in models for s in seeds)
        partial = sorted((out / "partial").glob("*.resume.pth"))
        kept = f"{stored} of {len(models) * len(seeds)} runs are stored in {out / 'runs'}"
        if partial:
            kept += f"; the unfinished run keeps its completed epochs in {partial[0]}"
        raise RunInterrupted(kept) from interrupt

    records = {(m, s): _load_run(run_file(out, m, s)) for m in models for s in seeds}
    # Baselines first, as in the papers' tables; given order within each group.
    ordered = [m for m in models if m in baselines] + [m for m in models if m not in baselines]
    rows = summarise(records, ordered, seeds, metrics, set(baselines))
    markdown = markdown_table(rows, metrics, dataset, seeds, _protocol_note(config))
    files = {
        "csv": out / "comparison.csv",
        "markdown": out / "comparison.md",
        "plot": out / "comparison.png",
        "runs_csv": out / "runs.csv",
    }
    write_atomic(files["csv"], csv_text(rows))
    write_atomic(files["markdown"], markdown)
    write_atomic(files["runs_csv"], runs_csv_text(records, ordered, seeds, metrics))
    save_plot(files["plot"], rows, metrics, dataset, seeds)
    return {
        "rows": rows,
        "markdown": markdown,
        "files": files,
        "trained": trained,
        "skipped": skipped,
        "metrics": metrics,
        "baselines": [m for m in ordered if m in baselines],
    }
