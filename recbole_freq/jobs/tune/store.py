"""A search's trial store (``--trial_store``): each trial's validation reports and, until
it finishes, its resume state, kept as plain files that a later search replays.

Ray's own ``--resume`` continues a search from its experiment state: pickled objects
(code runs as they load, so a folder must be trusted) on the machine that ran it.  A
store holds only JSON records and resume states read by the restricted loader, so it
can be committed, copied to another machine or kept on shared storage, and a new
search with the same settings continues where each trial stood:

- a finished trial's reports are sent to Ray again as they were, its test included,
  without training;
- an unfinished one (stopped by ASHA, or interrupted) replays its reports, the last
  with its resume state as the Ray checkpoint, then trains on from that state, as a
  resumed run does (same weights, optimizer, early stopping and random generators, so
  the same numbers as training it straight through);
- the scheduler sees the same reports in the same order, so with trials run one at a
  time (``--max_concurrent 1``) ASHA stops the same trials at the same rounds.

A record is keyed by the trial's tuned values and holds every setting the trial ran
with and the segments it was trained in (each with the environment a run file records:
code commit, device, torch threads, libraries; a trial continued on another device mixes
two float paths, as a resumed run does); a trial whose settings differ from its record's
(another ``--epochs``, other data) fails with one line naming the differences instead of
mixing two computations.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

from recbole_freq.utils.files import plain_value, write_atomic
from recbole_freq.utils.inputs import read_input_text

RECORD_FORMAT = "recbole-freq trial record 1"
RECORD_SUFFIX = ".trial.json"
STATE_SUFFIX = ".resume.pth"
# Settings of the place a trial ran in, not of its computation (``settings_differences``
# ignores the same and more).
PLACE_KEYS = ("device", "use_gpu", "gpu_id", "checkpoint_dir", "data_path", "show_progress")


class TrialStoreError(RuntimeError):
    """A store record that cannot be this trial's (other settings, a damaged file)."""


def trial_key(params: dict) -> str:
    """The file name stem of the trial with tuned values ``params``: their sha256."""
    canonical = json.dumps(plain_value(params), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


def recorded_settings(config) -> dict:
    """Every setting of the trial as text, those of the place it runs in left out."""
    return {
        key: str(value)
        for key, value in sorted(config.final_config_dict.items())
        if key not in PLACE_KEYS
    }


class TrialStore:
    """The folder of a search's trial records (``<key>.trial.json``) and resume states
    (``<key>.resume.pth``, removed when the trial finishes)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)

    def record_path(self, params: dict) -> Path:
        return self.folder / f"{trial_key(params)}{RECORD_SUFFIX}"

    def state_path(self, params: dict) -> Path:
        return self.folder / f"{trial_key(params)}{STATE_SUFFIX}"

    def read(self, params: dict, config) -> dict | None:
        """The trial's record, checked to be of these tuned values and settings; None
        when the store has none."""
        path = self.record_path(params)
        if not path.exists():
            return None
        try:
            record = json.loads(read_input_text(path, "trial record"))
        except (OSError, ValueError, RecursionError) as error:
            raise TrialStoreError(f"{path} cannot be read as a trial record ({error})") from None
        if not _well_formed(record) or record["params"] != plain_value(params):
            raise TrialStoreError(
                f"{path} is not the record of the trial {plain_value(params)} (it was edited "
                "or damaged); delete it to train the trial again"
            )
        differences = _settings_differences(record["settings"], recorded_settings(config))
        if differences:
            raise TrialStoreError(
                f"the trial store's record {path.name} was written with other settings ("
                + "; ".join(differences[:3])
                + "): give this search another --trial_store, or the settings it ran with"
            )
        return record

    def load_state(self, params: dict) -> dict | None:
        """The unfinished trial's resume state (restricted loader), or None."""
        from recbole_freq.quick_start.resume import load_resume_state

        path = self.state_path(params)
        return load_resume_state(path) if path.is_file() else None

    def add_report(
        self, params: dict, config, record: dict | None, report: dict, state_file, first: bool
    ) -> dict:
        """Append an epoch's ``report`` (dropping any report of that epoch or later: a
        trial that continues from an earlier state trains those epochs again), then
        store the state it continues from.  The record goes first: a state never runs
        ahead of its record, and replay stops at the state's epoch.  ``first``: the first
        epoch this process trains, which opens a segment (the environment a run file
        records: code, device, threads, libraries).  Returns the record."""
        from recbole_freq.utils.reproducibility import environment_record

        record = record or _new_record(params, config)
        epoch = report["epoch"]
        record["reports"] = [r for r in record["reports"] if r["epoch"] < epoch] + [report]
        if first:
            record["segments"] = [s for s in record["segments"] if s["first_epoch"] < epoch]
            record["segments"].append({"first_epoch": epoch, **environment_record(config)})
        write_atomic(self.record_path(params), json.dumps(record, indent=1))
        write_atomic(self.state_path(params), Path(state_file).read_bytes())
        return record

    def finish(self, params: dict, config, record: dict | None, final: dict) -> None:
        """Store the final report (the test) and drop the resume state."""
        record = record or _new_record(params, config)
        record["final"] = plain_value(final)
        write_atomic(self.record_path(params), json.dumps(record, indent=1))
        self.state_path(params).unlink(missing_ok=True)


def _new_record(params: dict, config) -> dict:
    return {
        "format": RECORD_FORMAT,
        "model": str(config["model"]),
        "dataset": str(config["dataset"]),
        "params": plain_value(params),
        "settings": recorded_settings(config),
        "segments": [],
        "reports": [],
        "final": None,
    }


def _well_formed(record) -> bool:
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        return False
    reports = record.get("reports")
    return (
        isinstance(record.get("params"), dict)
        and isinstance(record.get("settings"), dict)
        and isinstance(record.get("segments"), list)
        and all(
            isinstance(g, dict) and isinstance(g.get("first_epoch"), int)
            for g in record["segments"]
        )
        and isinstance(reports, list)
        and all(isinstance(r, dict) and isinstance(r.get("epoch"), int) for r in reports)
        and (record.get("final") is None or isinstance(record.get("final"), dict))
    )


def _settings_differences(saved: dict, now: dict) -> list[str]:
    from recbole_freq.quick_start.resume import settings_differences

    return settings_differences(
        SimpleNamespace(final_config_dict=saved), SimpleNamespace(final_config_dict=now)
    )


def replay_reports(record: dict, state: dict | None) -> tuple[list[dict], bool]:
    """``(reports, finished)``: what a replay sends to Ray, in order.  A finished trial:
    all its reports and the final one; an unfinished one: the reports of the epochs its
    resume state covers (none without a state: it trains from the start)."""
    if record["final"] is not None:
        final = dict(record["final"])
        checkpoint = final.get("checkpoint_file")
        if checkpoint and not os.path.isfile(checkpoint):
            final["checkpoint_file"] = None  # written on another machine or since removed
        return [*record["reports"], final], True
    if state is None:
        return [], False
    return [r for r in record["reports"] if r["epoch"] < state["next_epoch"]], False
