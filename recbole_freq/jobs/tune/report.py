"""What a finished search leaves: the trials ranked on validation (``trials.csv``,
``trials.md``) and the best trial's settings as a config file (``best.yaml``)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import yaml

from recbole_freq.utils.command import invoked_command
from recbole_freq.utils.files import plain_value, write_atomic


class TrialsFailedError(RuntimeError):
    """Every trial of a search failed, so there is no best configuration."""


def finished_trials(results) -> tuple[int, int]:
    """``(finished, started)`` trials of a search: finished is a trial that sent its final
    report (tested) or failed.  Ray's status is no guide after Ctrl-C: it marks a trial it
    interrupted TERMINATED, and --resume then continues it."""
    trials = getattr(getattr(results, "_experiment_analysis", None), "trials", None) or []
    finished = sum(
        trial.status == "ERROR" or bool((trial.last_result or {}).get("final")) for trial in trials
    )
    return finished, len(trials)


def _unfinished_status(result, epochs_run: int, budget) -> str:
    """A trial without its final report: failed, or stopped by ASHA, which may stop a
    trial at its last validation round too (it then ran its whole budget)."""
    if result.error is not None:
        return "error"
    if isinstance(budget, int) and epochs_run >= budget:
        return "ran its budget (ASHA stopped it before its test)"
    return "stopped early (ASHA)"


def rank_trials(
    results, names: list[str], mode: str, stopped_tests=None, epochs=None
) -> list[dict]:
    """One row per trial, best validation score first; failed trials last.
    ``stopped_tests``: trial folder -> the test results of a trial ASHA stopped (from its
    last checkpoint's best weights, ``trial.test_stopped_trial``).  ``epochs``: the
    search's fixed budget (a trial's own ``epochs`` when it is tuned)."""
    stopped_tests = stopped_tests or {}
    rows = []
    for result in results:
        budget = (result.config or {}).get("epochs", epochs)
        metrics = result.metrics or {}
        history = result.metrics_dataframe
        epochs = []
        if history is not None and "epoch" in history:
            is_final = history["final"].eq(True) if "final" in history else False
            epochs = history[history["epoch"].notna() & ~is_final]
        final = metrics if metrics.get("final") else {}
        row = {"trial_id": metrics.get("trial_id") or Path(str(result.path)).name}
        row.update({name: plain_value((result.config or {}).get(name)) for name in names})
        if final:
            row["status"] = "completed"
            row["best_valid"] = final["valid_score"]
            row["best_epoch"] = final["best_epoch"]
            row["epochs_run"] = final["epochs_run"]
        elif len(epochs):
            scores = epochs["valid_score"]
            best = scores.idxmax() if mode == "max" else scores.idxmin()
            row["best_valid"] = float(scores[best])
            row["best_epoch"] = int(epochs["epoch"][best])
            row["epochs_run"] = int(epochs["epoch"].max()) + 1
            row["status"] = _unfinished_status(result, row["epochs_run"], budget)
        else:
            row["status"] = "error" if result.error is not None else "no result"
            row["best_valid"] = None
        if result.error is not None:
            row["error"] = str(result.error).strip().splitlines()[-1][:300]
        for key, value in final.items():
            if key.startswith(("test_", "valid_")) and key != "valid_score":
                row[key] = value
        tested = {} if final else stopped_tests.get(str(result.path), {})
        for key, value in tested.items():
            if key.startswith("test_"):
                row[key] = value
        if tested:
            row["protocol"] = tested.get("protocol")
        if final:
            row["checkpoint"] = final.get("checkpoint_file")
            row["device"] = final.get("device")
            row["protocol"] = final.get("protocol")
        row["trial_dir"] = str(result.path)
        rows.append(row)
    sign = -1 if mode == "max" else 1
    rows.sort(key=lambda r: (r["best_valid"] is None, sign * (r["best_valid"] or 0.0)))
    for rank, row in enumerate(rows, start=1):
        row["rank"] = rank
    return rows


def _markdown(rows, names, metric) -> str:
    key = metric.lower()
    header = ["rank", "trial", *names, f"valid {metric} (best)", "best epoch", f"test {metric}"]
    header.append("status")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def fmt(value, spec=".4f"):
        if value is None:
            return "-"
        return format(value, spec) if isinstance(value, float) else str(value)

    for row in rows:
        # Tuned values keep 4 significant digits (learning rates of 1e-5 stay visible).
        cells = [fmt(row["rank"]), row["trial_id"], *(fmt(row.get(n), ".4g") for n in names)]
        cells += [fmt(row.get(k)) for k in ("best_valid", "best_epoch", f"test_{key}")]
        cells.append(row["status"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _model_argument(name: str) -> str:
    """How ``--model`` names the model in a new process: a researcher's own model by its
    ``package.module:Class`` (its class name is known only where it was imported)."""
    from recbole_freq.config.configurator import get_model_class
    from recbole_freq.config.user_models import is_user_model, user_model_path

    model_class = get_model_class(name)
    return user_model_path(model_class) if is_user_model(model_class) else name


def write_outputs(summary, experiment_dir: Path, names, job, config_dict, cmd_overrides):
    from recbole_freq.config.configurator import FreqConfig

    rows, metric = summary["trials"], summary["metric"]
    experiment_dir.mkdir(parents=True, exist_ok=True)
    table = _markdown(rows, names, metric)
    summary["table"] = table
    trials_md = experiment_dir / "trials.md"
    protocols = sorted({str(row.get("protocol")) for row in rows if row.get("protocol")})
    write_atomic(
        trials_md,
        f"# {summary['model']} on {summary['dataset']}: trials ranked by validation "
        f"{metric} ({summary['mode']})\n\nProtocol: {', '.join(protocols) or 'unrecorded'}"
        f"\n\n{table}\n",
    )
    columns = ["rank", "trial_id", "status", *names, "best_valid", "best_epoch", "epochs_run"]
    for row in rows:
        columns += [key for key in row if key not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()})
    trials_csv = experiment_dir / "trials.csv"
    write_atomic(trials_csv, buffer.getvalue())
    summary.update(trials_csv=str(trials_csv), trials_md=str(trials_md))

    scored = [row for row in rows if row.get("best_valid") is not None]
    if not scored:
        errors = [row.get("error") for row in rows if row.get("error")]
        raise TrialsFailedError(
            f"all {len(rows)} trials failed, see {experiment_dir} (Ray's log: ray.log)"
            + (f"; first error: {errors[0]}" if errors else "")
        )
    best = scored[0]
    best_params = {name: best[name] for name in names}
    # The fixed settings of the search, as RecBole reads them, so the file alone
    # reproduces the best trial (command-line flags still win over it).
    # Paths as the trials used them (absolute), but only the keys the user set.
    given = {**config_dict, **(cmd_overrides or {})}
    fixed = FreqConfig._convert_config_dict(
        None, {k: job["overrides"].get(k, v) for k, v in given.items()}
    )
    fixed = {k: plain_value(v) for k, v in fixed.items() if k not in best_params}
    test_key = f"test_{metric.lower()}"
    test_text = f"{best[test_key]:.4f}" if best.get(test_key) is not None else "- (stopped early)"
    files = " ".join([*job["config_files"], str(experiment_dir / "best.yaml")])
    header = [
        f"# Best of {len(rows)} trials: {summary['model']} on {summary['dataset']}",
        f"# experiment: {experiment_dir}",
        f"# trial {best['trial_id']}: best validation {metric} = {best['best_valid']:.4f} "
        f"(epoch {best.get('best_epoch')}), test {metric} = {test_text}",
        f"# ranked by validation {metric}; the test split did not influence the choice",
        f"# protocol: {best.get('protocol') or 'unrecorded'} (docs/protocols.md)",
        # --paper as the search had it: its paper file under best.yaml, so the line
        # trains the best trial's settings under the trial's protocol and seed.
        f"# train it: {invoked_command()} --model={_model_argument(summary['model'])} "
        f"--dataset={summary['dataset']}{' --paper' if job['paper'] else ''} "
        f"--config_files {files}",
    ]
    body = yaml.safe_dump(best_params, sort_keys=False, default_flow_style=False)
    if fixed:
        body += "# fixed for every trial of the search:\n"
        body += yaml.safe_dump(fixed, sort_keys=False, default_flow_style=False)
    best_yaml = experiment_dir / "best.yaml"
    write_atomic(best_yaml, "\n".join(header) + "\n" + body)
    summary.update(best=best, best_params=best_params, best_yaml=str(best_yaml))
    return summary
