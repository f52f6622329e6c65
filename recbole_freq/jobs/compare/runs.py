"""The runs of a comparison: settings that must match for a stored run to count, the run
files under ``<out>/runs/``, and training them one after another or as Ray tasks."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import time
from pathlib import Path

from recbole_freq.utils.files import plain_value, write_atomic
from recbole_freq.utils.inputs import read_input_text

DEFAULT_METRICS = tuple(f"{name}@{k}" for name in ("hit", "ndcg") for k in (5, 10, 20))
# Shown by default for each of the run's ``extra_test_modes`` (e.g. ``uni100:hit@10``): the
# sampled protocol's papers (Rec-Denoiser, SASRec) report @10 only.
DEFAULT_EXTRA_MODE_METRICS = ("hit@10", "ndcg@10")
RUN_FORMAT = 1
# Summary parts that are not needed for the tables (of the model report: the learned mask
# matrices; their pruned fractions stay); quick_start still writes the full summary next
# to the checkpoint (``summary_file``).
DROPPED_SUMMARY_KEYS = ("model_report",)
DROPPED_MASK_KEYS = ("mask",)
# Keys the comparison sets itself, per run.
RESERVED_OVERRIDES = ("model", "dataset", "seed")
# Where a run reads and writes and how it shows progress, not what decides its numbers:
# runs stored with other values table together (a grid continued on another machine).
# The data themselves are compared by their fingerprint (``dataset_sha256``).
PLACE_OVERRIDES = ("checkpoint_dir", "data_path", "show_progress", "gpu_id")


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
    if stored.get("paper") != wanted.get("paper"):
        differences.append(f"--paper {bool(stored.get('paper'))} vs {bool(wanted.get('paper'))}")
    if stored.get("paper_references") != wanted.get("paper_references"):
        differences.append(
            f"--paper backbone settings {stored.get('paper_references')} vs "
            f"{wanted.get('paper_references')}"
        )
    if stored.get("protocols") != wanted.get("protocols"):
        differences.append(f"--protocols {stored.get('protocols')} vs {wanted.get('protocols')}")
    old, new = stored.get("overrides", {}), wanted["overrides"]
    for key in sorted((set(old) | set(new)) - set(PLACE_OVERRIDES)):
        if old.get(key, "<unset>") != new.get(key, "<unset>"):
            differences.append(f"--{key}: {old.get(key, '<unset>')} vs {new.get(key, '<unset>')}")
    return differences


# ---------------------------------------------------------------------------- run files


def entry_name(model: str, protocol: str | None) -> str:
    """A comparison entry: a model, or a model under one of ``--protocols``."""
    return model if protocol is None else f"{model}@{protocol}"


def split_entry(entry: str) -> tuple[str, str | None]:
    model, _, protocol = entry.partition("@")
    return model, protocol or None


def entry_model_name(entry: str) -> str:
    """The model name an entry's runs and states record: its model, or for a researcher's
    own ``package.module:Class`` the class name."""
    return split_entry(entry)[0].rpartition(":")[2]


def entry_label(entry: str) -> str:
    """How a table names an entry, and the key of its published figures: the model, or
    ``Model [variant]`` for a named variant (``Model@variant=only-self-attention``);
    another loss or protocol keeps the model's name (the row's loss or protocol column
    tells them apart)."""
    model, variant = split_entry(entry)
    if variant and variant.startswith(("variant=", "config=")):
        return f"{model} [{variant.partition('=')[2]}]"
    return model


def entry_overrides(entry: str) -> dict:
    """What an entry adds to the comparison's settings: ``Model@protocol`` its protocol,
    ``Model@train_loss=model`` a model piece (the same model trained with another loss,
    beside the first in one table); ``Model@config=FILE`` adds a file instead
    (``entry_config_files``)."""
    _, variant = split_entry(entry)
    if variant is None:
        return {}
    piece, sep, value = variant.partition("=")
    if piece == "config":
        return {}
    return {piece: value} if sep else {"protocol": variant}


def entry_config_files(entry: str) -> list[str]:
    """``Model@config=FILE``: the entry's own settings file, read after the comparison's
    ``--config_files`` and before its command-line settings, for this entry alone (a
    researcher's sizes for their model never reach another model's paper settings)."""
    from recbole_freq.utils.property_files import find_config_file

    _, variant = split_entry(entry)
    piece, _, value = (variant or "").partition("=")
    if piece != "config":
        return []
    return [os.path.abspath(find_config_file(value))]


def entry_models(entries) -> tuple[str, ...]:
    """The model names of ``entries``, each once (what a setting may be shared with)."""
    return tuple(dict.fromkeys(split_entry(entry)[0] for entry in entries))


def run_protocol_label(record: dict) -> str:
    """The protocol a stored run was made under (runs stored before protocols were
    recorded say so)."""
    protocol = record["summary"].get("protocol")
    return protocol["label"] if isinstance(protocol, dict) else "unrecorded"


def run_file(out: Path, model: str, seed: int) -> Path:
    return out / "runs" / f"{model}-seed{seed}.json"


def partial_file(out: Path, model: str, seed: int) -> Path:
    """The resume state of an unfinished run (removed when the run is stored)."""
    return out / "partial" / f"{model}-seed{seed}.resume.pth"


def record_digest(record: dict) -> str:
    """sha256 of a run record as stored (its JSON, keys sorted), without its digest."""
    body = {key: value for key, value in record.items() if key != "digest"}
    text = json.dumps(body, sort_keys=True, default=str, allow_nan=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_run(path: Path, entry: str | None = None, seed=None, dataset=None) -> dict:
    """A stored run, once it is whole and unedited: its digest (written with it) matches,
    every metric it holds is a finite number and, where the caller says whose place
    ``path`` is (``entry``, ``seed``, ``dataset``), it records that run; ``ComparisonError``
    naming the file otherwise, so that no edited, broken or misplaced file is tabulated
    as if measured."""
    try:
        record = json.loads(read_input_text(path, "run file"))
    except (OSError, ValueError, RecursionError) as error:
        raise ComparisonError(
            f"cannot read run file {path}: {error}; delete it to redo the run"
        ) from error
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("settings"), dict)
        or not isinstance(record.get("summary"), dict)
    ):
        raise ComparisonError(f"{path} is not a comparison run file; delete it to redo the run")
    if "digest" not in record:
        # The digest is unkeyed: it finds a file edited or cut after it was stored, not
        # one forged with its digest recomputed (the checks below read what it records).
        raise ComparisonError(
            f"{path} records no digest (written before run files carried one, or its digest "
            "was removed), so nothing shows it is the file its run stored; delete it to redo "
            "the run"
        )
    if record["digest"] != record_digest(record):
        raise ComparisonError(
            f"{path} was changed after its run was stored (its digest no longer matches); "
            "delete it to redo the run"
        )
    problem = _metrics_problem(record["summary"]) or _identity_problem(record, entry, seed, dataset)
    if problem:
        raise ComparisonError(f"{path}: {problem}; delete it to redo the run")
    return record


def _identity_problem(record: dict, entry, seed, dataset) -> str | None:
    """Why ``record`` is not the run of ``entry``, ``seed`` on ``dataset`` (a run file
    copied under another run's name), or None."""
    if entry is None:
        return None
    summary = record["summary"]
    recorded = {
        "model": (record.get("model"), entry),
        "seed": (record.get("seed"), seed),
        "seed of its summary": (summary.get("seed"), seed),
        # A researcher's own package.module:Class is recorded by its class name.
        "model of its summary": (summary.get("model"), entry_model_name(entry)),
        "dataset": (summary.get("dataset"), dataset),
    }
    for what, (found, wanted) in recorded.items():
        if wanted is not None and str(found) != str(wanted):
            return (
                f"it records the run of {what} {found!r}, but its place is the run of "
                f"{what} {wanted!r} (a run file is read only under its own name)"
            )
    return None


def _metrics_problem(summary: dict) -> str | None:
    """Why the metrics of a stored run cannot be measurements, or None."""
    import math

    def results_problem(results, where: str) -> str | None:
        if not isinstance(results, dict) or not results:
            return f"its {where} holds no metrics"
        for name, value in results.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return f"its {where} {name} is {value!r}, not a number"
            if not math.isfinite(value):
                return f"its {where} {name} is {value!r}, not a finite number"
        return None

    if "test_result" not in summary:
        return "it holds no test_result"
    problem = results_problem(summary["test_result"], "test_result")
    extra = summary.get("extra_test_results") or {}
    if not problem and not isinstance(extra, dict):
        return "its extra_test_results is not a mapping of modes to metrics"
    for mode, results in extra.items():
        problem = problem or results_problem(results, f"extra_test_results {mode}")
    per_user = summary.get("test_per_user")
    if not problem and per_user is not None:
        if not isinstance(per_user, dict) or not all(
            isinstance(per_user.get(key), list) for key in ("users", "rank")
        ):
            return "its test_per_user is not a mapping with the users and their ranks"
        if len(per_user["users"]) != len(per_user["rank"]):
            return "its test_per_user holds a different number of users and ranks"
    return problem


class OutDirLock:
    """An exclusive lock on a comparison's ``--out`` folder (the folder itself: no lock
    file is left behind), held while the comparison trains, stores and tabulates."""

    def __init__(self, fd: int | None):
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None


def lock_out_dir(out: Path) -> OutDirLock:
    """``ComparisonError`` if another comparison holds ``out``: two at once stored runs
    of different settings side by side and tabulated them together."""
    from dataset_prep.atomic import lock_folder
    from dataset_prep.errors import UsageError

    try:
        return OutDirLock(lock_folder(out, ""))
    except UsageError:
        raise ComparisonError(
            f"another comparison is writing {out} right now; wait for it to finish, or "
            "give this one another --out"
        ) from None


def check_output_entries(out: Path) -> None:
    """``<out>/partial`` and ``<out>/runs`` are real folders and every resume state and run
    file in them a regular file: the grid writes, renames and at last deletes them, and a
    symbolic link would carry all of that to its target outside ``out`` (a pipe would
    hang the run).  ``ComparisonError`` before anything is trained otherwise."""
    import stat

    from recbole_freq.utils.inputs import file_kind

    for name, what in (("partial", "resume states"), ("runs", "run files")):
        folder = out / name
        try:
            mode = folder.lstat().st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(mode):
            raise ComparisonError(
                f"{folder} is {file_kind(mode)}, not a folder: the comparison keeps its {what} "
                "there; move it away (or pick another --out) and run again"
            )
        for entry in sorted(folder.iterdir()):
            if not entry.name.endswith((".resume.pth", ".json")):
                continue
            mode = entry.lstat().st_mode
            if not stat.S_ISREG(mode):
                raise ComparisonError(
                    f"{entry} is {file_kind(mode)}, not a regular file: the comparison writes, "
                    "replaces and deletes its files there (copy a resume state in with cp, "
                    "never ln -s); move it away and run again"
                )


# Settings that say where and how visibly a run ran, not what it computed (and the seed,
# which differs between the runs of one row by design).
PLACE_SETTINGS = frozenset({
    "seed", "data_path", "checkpoint_dir", "show_progress", "gpu_id", "device", "use_gpu",
    "state", "log_wandb", "wandb_project", "dataset_sha256", "worker", "overlap_loader",
    "dataset_save_path", "dataloaders_save_path", "save_dataset", "save_dataloaders",
    "torch_threads", "memory_check", "local_rank", "single_spec", "nproc", "world_size",
    "offset", "ip", "port", "backend",
})  # fmt: skip


# Settings added after run files were first stored whose default is not what the code
# did before they existed: a run file without the key was trained with this value.
SETTINGS_BEFORE_THEY_EXISTED = {
    "trc_skip": "truncated",  # PolyRec's reading of eq. 13 until issue 66
}


def check_stored_settings(
    out: Path, entries_seeds: list, effective: dict, dataset=None, labels=None
) -> None:
    """Every stored run of the comparison was trained with the settings its entry gets
    now, as far as its run file records them (``summary.config``; a setting added to the
    plugin since is not in an older file and is compared only where its default differs
    from what the code did before, ``SETTINGS_BEFORE_THEY_EXISTED``): a property file
    changed between two calls would otherwise put runs of two settings into one row."""
    for entry, seed in entries_seeds:
        path = run_file(out, entry, seed)
        now = effective.get(entry)
        if now is None or not path.is_file():
            continue
        record = load_run(path, entry, seed, dataset)
        if labels and run_protocol_label(record) != labels.get(entry):
            continue  # another protocol: the protocol check says so (--mixed_protocols)
        stored = record["summary"].get("config")
        if not isinstance(stored, dict):
            continue
        stored = {**_implied_settings(now), **stored}
        # A setting left to the model (~ in its property file: what Rec-Denoiser's
        # backbone decides) is recorded as the value the model chose from the others,
        # which are compared here.
        differences = [
            f"{key} {stored[key]!r} then, {now[key]!r} now"
            for key in sorted(set(stored) & set(now))
            if key not in PLACE_SETTINGS
            and now[key] is not None
            and str(stored[key]) != str(now[key])
        ]
        if differences:
            shown = "; ".join(differences[:4]) + ("; ..." if len(differences) > 4 else "")
            raise ComparisonError(
                f"{path} was trained with other settings than {entry} gets now ({shown}): "
                "a property file or default changed since. Pick another --out, or delete "
                f"the run files of {entry} to redo them with today's settings."
            )


def _implied_settings(now: dict) -> dict:
    return {key: value for key, value in SETTINGS_BEFORE_THEY_EXISTED.items() if key in now}


def code_of(environment) -> tuple | None:
    """``(commit, uncommitted changes)`` of one segment's environment, or None where it
    records no commit (stored before runs recorded their code, or an installed copy)."""
    code = (environment or {}).get("code") if isinstance(environment, dict) else None
    if not isinstance(code, dict) or not code.get("commit"):
        return None
    return (str(code["commit"]), bool(code.get("uncommitted_changes")))


def run_codes(record: dict) -> list:
    """The code of each segment of a stored run, its earlier ones first."""
    summary = record["summary"]
    earlier = summary.get("earlier_segments_environment") or []
    return [code_of(env) for env in earlier if isinstance(env, dict)] + [
        code_of(summary.get("environment"))
    ]


def code_label(code) -> str:
    if code is None:
        return "unrecorded"
    return code[0][:10] + ("+uncommitted changes" if code[1] else "")


def code_differences(records: dict, current=None, segments: bool = False) -> dict:
    """``{code label: [run names]}`` when the runs (``{(entry, seed): record}``) and the
    code about to train (``current``) are of more than one recorded code, else ``{}``:
    each run's code is its last segment's, or with ``segments`` every segment's (a run
    continued across commits, as a lease's runs are).  A segment that records no code is
    not counted as different: nothing shows it is."""
    by_code: dict = {}
    for (entry, seed), record in records.items():
        codes = run_codes(record) if segments else run_codes(record)[-1:]
        for code in dict.fromkeys(codes):
            if code is not None:
                by_code.setdefault(code, []).append(f"{entry}-seed{seed}")
    if current is not None and current[0]:
        by_code.setdefault(current, []).append("the runs this call trains")
    if len(by_code) < 2:
        return {}
    return {code_label(code): runs for code, runs in by_code.items()}


def check_code(records: dict, current, allowed: bool) -> None:
    """A table holds the runs of one code unless ``--mixed_code``: ``ComparisonError``
    naming each code and its runs otherwise."""
    differences = code_differences(records, current)
    if differences and not allowed:
        listing = "; ".join(
            f"{label}: {', '.join(runs[:4])}{', ...' if len(runs) > 4 else ''}"
            for label, runs in differences.items()
        )
        raise ComparisonError(
            f"the comparison's runs are of different code ({listing}); pass --mixed_code to "
            "table them together (the tables then name each run's code), or delete the runs "
            "of one code to redo them"
        )


def code_note(records: dict) -> str:
    """The tables' paragraph naming each run's code, when they are of several (runs
    tabled with ``--mixed_code``, or segments of one run continued across commits)."""
    differences = code_differences(records, segments=True)
    if not differences:
        return ""
    listing = "; ".join(f"{label}: {', '.join(runs)}" for label, runs in differences.items())
    return f"\n**Code.** These runs were made by different code: {listing}.\n"


def check_out_dir(out: Path, settings: dict, dataset_sha256: str | None = None) -> None:
    """Every run stored in ``out`` must have been made with ``settings`` and on the data
    whose fingerprint is ``dataset_sha256``: an output folder holds one comparison, never
    a silent mix of settings."""
    for path in sorted((out / "runs").glob("*.json")):
        record = load_run(path)
        differences = _settings_difference(record["settings"], settings)
        stored_data = record["summary"].get("dataset_sha256")
        if dataset_sha256 and not stored_data:
            differences.append(
                "the data (the run records no fingerprint of its data, so nothing shows they "
                f"are today's, fingerprint {dataset_sha256[:12]})"
            )
        elif dataset_sha256 and stored_data != dataset_sha256:
            differences.append(
                f"the data (fingerprint {stored_data[:12]} then, {dataset_sha256[:12]} now)"
            )
        if differences:
            raise ComparisonError(
                f"{out} already holds runs made with other settings ({path.name}: "
                + "; ".join(differences)
                + "). Pick another --out, or delete "
                + str(out / "runs")
                + " to redo them with the new settings."
            )


def store_run(out: Path, settings: dict, model: str, seed: int, summary: dict) -> Path:
    kept = {key: value for key, value in summary.items() if key not in DROPPED_SUMMARY_KEYS}
    report = summary.get("model_report") or {}
    if report.get("learned_masks"):
        kept["model_report"] = {
            **{key: value for key, value in report.items() if key != "learned_masks"},
            "learned_masks": [
                {key: value for key, value in entry.items() if key not in DROPPED_MASK_KEYS}
                for entry in report["learned_masks"]
            ],
        }
    record = {
        "format": RUN_FORMAT,
        "model": model,
        "seed": seed,
        "settings": settings,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "summary": kept,
    }
    record = json.loads(json.dumps(record, default=str))  # as it will read back
    record["digest"] = record_digest(record)
    path = run_file(out, model, seed)
    write_atomic(path, json.dumps(record, indent=2))
    return path


# ---------------------------------------------------------------------------- checks


def validate(
    models,
    dataset,
    config_files,
    overrides,
    seeds,
    protocols=(None,),
    paper_models=(),
    references=None,
) -> dict:
    """Build each model's configuration once before any training, so that an unknown model,
    a missing file or an unprepared dataset fails in seconds, not after hours of runs.
    Returns the configuration of the first model under each protocol (for the notes),
    each entry's protocol label, and each entry's effective settings (as run files store
    them, for ``check_stored_settings``)."""
    from recbole_freq.config.configurator import FreqConfig
    from recbole_freq.data.guard import check_prepared
    from recbole_freq.protocol import protocol_label

    first, labels, effective = {}, {}, {}
    for protocol in protocols:
        chosen = {} if protocol is None else {"protocol": protocol}
        for model in models:
            config = FreqConfig(
                split_entry(model)[0],
                dataset,
                [*config_files, *entry_config_files(model)],
                cmd_overrides={
                    **(references or {}).get(model, {}),
                    **overrides,
                    **entry_overrides(model),
                    **chosen,
                    "seed": seeds[0],
                },
                paper=model in paper_models,
                shared_with=entry_models(models),
            )
            check_prepared(config)
            first.setdefault(protocol, config)
            labels[entry_name(model, protocol)] = protocol_label(config)
            effective[entry_name(model, protocol)] = {
                key: plain_value(config[key]) for key in config.final_config_dict
            }
    return first, labels, effective


def stored_label_differences(out: Path, entries, seeds, labels: dict) -> list[str]:
    """The stored runs that this command skips although it would run them under another
    protocol (e.g. runs stored before ``sequence_layout: left`` became the default of
    ``bsarec``, ``fmlprec`` and ``sasrec``): one line each.  They keep their own, true
    label in every table, and ``check_protocols`` refuses to table them beside runs of
    another protocol unless asked."""
    lines = []
    for entry in entries:
        for seed in seeds:
            path = run_file(out, entry, seed)
            if not path.is_file():
                continue
            stored = run_protocol_label(load_run(path))
            if stored != labels[entry]:
                lines.append(
                    f"{path.name}: stored under protocol {stored}; this command would run "
                    f"{split_entry(entry)[0]} under {labels[entry]} (delete the file to redo it)"
                )
    return lines
