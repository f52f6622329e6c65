"""Evaluate a trained checkpoint under other evaluation protocols (``--evaluate``).

The evaluation pieces of a protocol (``history_mask``, ``eval_negatives`` and the test
ranking mode) act on a trained model only, so one checkpoint can be tested under each of
them: how much of a gap between two tables is the ranking's, not the model's.  A variant
is a protocol name (its evaluation pieces) or ``key=value`` changes joined by ``+``, e.g.
``recbole``, ``bsarec``, ``history_mask=zero``, ``mode=uni100+eval_negatives=unseen``.
The training pieces (``train_rows``, ``stopping_rule``, ``sequence_layout``) stay the
checkpoint's, and each result's label says so.
"""

from __future__ import annotations

from recbole_freq.config.settings import evaluation_mode_problem
from recbole_freq.protocol import (
    PIECES,
    ProtocolError,
    protocol_defaults,
    protocol_label,
    protocol_names,
    trainer_for,
)

EVALUATION_PIECES = ("history_mask", "eval_negatives")
MODE_KEY = "mode"


def parse_variant(text: str) -> dict:
    """``{setting: value}`` that a variant changes; ``ProtocolError`` in one line."""
    text = str(text).strip()
    if not text:
        raise ProtocolError("an empty evaluation variant; give a protocol or key=value")
    if "=" not in text:
        if text not in protocol_names():
            raise ProtocolError(
                f"unknown protocol {text!r}; choose one of {', '.join(protocol_names())} "
                "or give key=value changes"
            )
        fixed = protocol_defaults(text)
        mode = (fixed.get("eval_args") or {}).get("mode", "full")
        changes = {"protocol": text, MODE_KEY: mode}
        changes.update({piece: fixed.get(piece, PIECES[piece][0]) for piece in EVALUATION_PIECES})
        return changes
    changes = {}
    for part in text.split("+"):
        key, _, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if key in EVALUATION_PIECES:
            if value not in PIECES[key]:
                raise ProtocolError(
                    f"{key}={value!r} is unknown; choose one of {', '.join(PIECES[key])}"
                )
        elif key == MODE_KEY:
            problem = evaluation_mode_problem(value)
            if problem:
                raise ProtocolError(f"mode={problem}")
        else:
            allowed = ", ".join((*EVALUATION_PIECES, MODE_KEY))
            raise ProtocolError(
                f"{key!r} cannot change after training; an evaluation variant sets {allowed} "
                "or names a protocol"
            )
        changes[key] = value
    return changes


def _apply(config, changes: dict) -> None:
    for key, value in changes.items():
        if key == MODE_KEY:
            config["eval_args"]["mode"] = {"valid": value, "test": value}
            config._set_eval_neg_sample_args("valid")
            config._set_eval_neg_sample_args("test")
        else:
            config[key] = value


def evaluate_checkpoint(
    path, variants, data_path=None, device="cpu", trust_data=False
) -> list[dict]:
    """Test the checkpoint at ``path`` under each variant; one dict per variant with
    ``variant``, ``protocol`` (the label: training pieces are the checkpoint's),
    ``test_result`` and ``test_per_user`` (each test user's rank, as run summaries keep).  Sampled negatives are drawn after seeding with the checkpoint's
    seed, so a variant gives the same numbers every time."""
    from recbole.utils import init_seed

    from recbole_freq.quick_start.restore import restore_model

    parsed = [(str(variant), parse_variant(variant)) for variant in variants]
    results = []
    for text, changes in parsed:
        model, config, _, (_, _, test_data), _ = restore_model(
            path, data_path=data_path, device=device,
            adjust=lambda c, ch=changes: _apply(c, ch), trust_data=trust_data,
        )  # fmt: skip
        init_seed(config["seed"], config["reproducibility"])
        trainer = trainer_for(config, model)
        test_result = trainer.evaluate(test_data, load_best_model=False, show_progress=False)
        result = {
            "variant": text,
            "protocol": protocol_label(config),
            "trained_under": _trained_under(config),
            "test_result": {key: float(value) for key, value in test_result.items()},
        }
        per_user = trainer.per_user_ranks()
        if per_user is not None:
            # as in run summaries: lets two checkpoints be tested user by user
            result["test_per_user"] = per_user
        results.append(result)
    return results


def _trained_under(config) -> str:
    return f"train_rows={config['train_rows'] or 'all_prefixes'}"


def markdown(results: list[dict], checkpoint: str) -> str:
    metrics = list(results[0]["test_result"])
    header = ["variant", "protocol label", *metrics]
    labels = ", ".join(dict.fromkeys(result["protocol"] for result in results))
    lines = [
        f"Protocol labels: {labels} (training pieces: the checkpoint's, "
        f"{results[0]['trained_under']})",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for result in results:
        cells = [result["variant"], result["protocol"]]
        cells += [f"{result['test_result'][m]:.4f}" for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Test results of one checkpoint ({checkpoint}; trained with "
        f"{results[0]['trained_under']}) under each evaluation variant.",
    ]
    return "\n".join(lines) + "\n"
