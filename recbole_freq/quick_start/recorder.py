"""What a run records of each epoch as it trains: ``TrainingRecorder``."""

from __future__ import annotations

import logging
import time


class TrainingRecorder:
    """Per-epoch training loss, validation metrics and time of a RecBole trainer: the one
    place that hooks into the trainer's epochs (``_train_epoch`` / ``_valid_epoch`` of
    this instance).  ``before_epoch(epoch)`` runs before an epoch once all earlier ones
    are complete (the resume state is written there); ``after_valid(record)`` after each
    validation, with the epoch's record (the search reports it to Ray Tune there)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.epochs: list[dict] = []
        self.train_seconds = 0.0
        # Wall time of a resumed run's earlier segments (each up to its last resume state;
        # None when that state predates the count) and how many segments the run had.
        self.run_start = time.perf_counter()
        self.earlier_seconds: float | None = 0.0
        self.segments = 1
        self.before_epoch = None
        self.after_valid = None
        train_epoch, valid_epoch = trainer._train_epoch, trainer._valid_epoch

        def timed_train_epoch(train_data, epoch_idx, *args, **kwargs):
            self.current_epoch = epoch_idx
            if self.before_epoch is not None and epoch_idx > trainer.start_epoch:
                self.before_epoch(epoch_idx)
            start = time.perf_counter()
            loss = train_epoch(train_data, epoch_idx, *args, **kwargs)
            seconds = time.perf_counter() - start
            self.train_seconds += seconds
            total = sum(loss) if isinstance(loss, tuple) else loss
            self.epochs.append(
                {"epoch": len(self.epochs), "train_loss": float(total), "train_seconds": seconds}
            )
            self._add_model_report(epoch_idx)
            return loss

        def recorded_valid_epoch(*args, **kwargs):
            score, result = valid_epoch(*args, **kwargs)
            self.epochs[-1].update(valid_score=float(score), valid=dict(result))
            if self.after_valid is not None:
                self.after_valid(self.epochs[-1])
            return score, result

        trainer._train_epoch = timed_train_epoch
        trainer._valid_epoch = recorded_valid_epoch

    def _add_model_report(self, epoch_idx) -> None:
        # Optional model hook, as run_summary is for the whole run (e.g. how many links
        # the denoising masks prune after this epoch).
        epoch_report = getattr(self.trainer.model, "epoch_report", None)
        report = epoch_report() if callable(epoch_report) else None
        if not report:
            return
        self.epochs[-1]["model_report"] = report
        described = ", ".join(
            f"{key} {' / '.join(f'{value:.3f}' for value in values)}"
            for key, values in report.items()
        )
        model_name = type(self.trainer.model).__name__
        logging.getLogger().info(f"epoch {epoch_idx} {model_name}: {described}")

    @property
    def best_epoch(self):
        scored = [e for e in self.epochs if "valid_score" in e]
        if not scored:
            return None
        pick = max if self.trainer.valid_metric_bigger else min
        best = pick(e["valid_score"] for e in scored)
        reached = [e["epoch"] for e in scored if e["valid_score"] == best]
        # The epoch whose checkpoint the trainer kept: RecBole's early_stopping counts a
        # tie as an improvement (the last epoch reaching the best), the strict rule does
        # not (the first).
        return (
            reached[0] if getattr(self.trainer, "stopping_rule", None) == "strict" else reached[-1]
        )
