"""A comparison's tests: the paired t-test across seeds, the per-user Wilcoxon and t
tests against the best baseline, and the Holm or Benjamini-Hochberg correction over a
table's p-values."""

from __future__ import annotations

import math

import numpy as np

from recbole_freq.jobs.compare.runs import ComparisonError


def metric_value(summary: dict, metric: str) -> float:
    """A run's test value of ``metric``: ``hit@10`` from its own protocol, ``uni100:hit@10``
    from the extra test mode ``uni100`` (``quick_start.evaluate_extra_test_modes``)."""
    mode, _, name = metric.rpartition(":")
    results = summary["extra_test_results"][mode] if mode else summary["test_result"]
    return results[name]


def smaller_is_better(metric: str) -> bool:
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


PER_USER_METRICS = ("hit", "ndcg")
CORRECTIONS = ("holm", "bh")


def per_user_values(summaries, metric: str):
    """``(users, values)``: each user's ``metric`` (hit@k or ndcg@k of the run's own test)
    from the runs' stored per-user ranks, averaged over the runs (seeds); ``None`` when a
    run kept no ranks, the metric is another one or lies beyond the ranks kept."""
    name, _, k = metric.partition("@")
    if ":" in metric or name not in PER_USER_METRICS or not k.isdigit():
        return None
    k = int(k)
    tables = [s.get("test_per_user") for s in summaries]
    if any(t is None or k > t["topk"] for t in tables):
        return None
    users = tables[0]["users"]
    if any(t["users"] != users for t in tables):
        return None
    ranks = np.asarray([t["rank"] for t in tables], dtype=float)
    inside = (ranks >= 1) & (ranks <= k)
    if name == "hit":
        values = inside.astype(float)
    else:
        values = np.where(inside, 1.0 / np.log2(np.where(inside, ranks, 1.0) + 1.0), 0.0)
    return users, values.mean(axis=0)


def per_user_p_values(values, reference) -> tuple[float | None, float | None]:
    """Two-sided paired Wilcoxon signed-rank and paired t p-values across users
    (``scipy.stats``); ``None`` where undefined (no user differs)."""
    from scipy.stats import ttest_rel, wilcoxon

    values, reference = np.asarray(values, float), np.asarray(reference, float)
    if len(values) < 2 or np.allclose(values, reference, rtol=0, atol=1e-12):
        return None, None
    wilcoxon_p = float(wilcoxon(values, reference).pvalue)
    t_p = float(ttest_rel(values, reference).pvalue)
    return (
        None if math.isnan(wilcoxon_p) else wilcoxon_p,
        None if math.isnan(t_p) else t_p,
    )


def adjust_p_values(p_values: dict, method: str) -> dict:
    """Multiple-testing correction across every test of one table: Holm's step-down
    (family-wise error) or Benjamini-Hochberg (false discovery rate,
    ``scipy.stats.false_discovery_control``).  ``None`` entries stay ``None``."""
    from scipy.stats import false_discovery_control

    keys = [key for key, value in p_values.items() if value is not None]
    adjusted = dict.fromkeys(p_values)
    if not keys:
        return adjusted
    raw = np.asarray([p_values[key] for key in keys])
    if method == "bh":
        values = false_discovery_control(raw, method="bh")
    elif method == "holm":
        order = np.argsort(raw)
        scaled = raw[order] * (len(raw) - np.arange(len(raw)))
        stepped = np.minimum(np.maximum.accumulate(scaled), 1.0)
        values = np.empty_like(raw)
        values[order] = stepped
    else:
        raise ComparisonError(f"correction {method!r} is unknown; choose holm or bh")
    adjusted.update({key: float(value) for key, value in zip(keys, values)})
    return adjusted


def add_per_user_tests(rows, records, seeds, metrics, correction: str = "holm") -> None:
    """For each proposed row and metric: paired Wilcoxon and t-tests across users against
    the metric's best baseline (per-user values averaged over seeds), corrected across
    all the table's tests (``correction``).  Sets ``<metric>_p_wilcoxon_users`` and
    ``<metric>_p_t_users``."""
    wilcoxon_p, t_p = {}, {}
    for row in rows:
        for metric in metrics:
            key = (row["model"], metric)
            wilcoxon_p[key] = t_p[key] = None
            reference = row.get(f"{metric}_best_baseline")
            if row["role"] != "proposed" or reference is None:
                continue
            ours = per_user_values([records[(row["model"], s)]["summary"] for s in seeds], metric)
            theirs = per_user_values([records[(reference, s)]["summary"] for s in seeds], metric)
            if ours is None or theirs is None or ours[0] != theirs[0]:
                continue
            wilcoxon_p[key], t_p[key] = per_user_p_values(ours[1], theirs[1])
    wilcoxon_p = adjust_p_values(wilcoxon_p, correction)
    t_p = adjust_p_values(t_p, correction)
    for row in rows:
        for metric in metrics:
            row[f"{metric}_p_wilcoxon_users"] = wilcoxon_p[(row["model"], metric)]
            row[f"{metric}_p_t_users"] = t_p[(row["model"], metric)]
