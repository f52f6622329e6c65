"""One prepared script for a lent GPU (or any machine for a fixed number of minutes).

    python benchmarks/lease.py run --minutes 14 --data_path DATA --out OUT
    python benchmarks/lease.py bring_back FILES_AT          # back here, after the lease
    python benchmarks/lease.py prepare                      # before the lease, if needed
    python benchmarks/lease.py status                       # what the queue still needs
    python benchmarks/lease.py code_bundle --since START --to .lease-data/code.bundle

``run``, within ``--minutes`` from its start:
1. the GPU suite (``benchmarks/gpu_suite.sh``: the CUDA tests and the speed tables) when
   the machine has CUDA, within ``--suite_minutes``;
2. the queue (``benchmarks/lease_queue.json``): in its order, every item with runs not
   yet stored is continued with its own ``--compare`` command into its results folder,
   ``--at_once`` items side by side (each packing ``--parallel`` runs), each with
   ``--time_limit`` set to what is left of the lease, so that every run stops at an
   epoch boundary with its resume state in ``<folder>/partial/``; an item that finishes
   early makes room for the next.  A search item runs as a new search with the trial
   store ``<folder>/store`` (``--trial_store``: its trials' records and resume states,
   replayed by the next lease or on a CPU), stopped by SIGTERM at the lease's end; a
   finished one leaves ``trials.csv``, ``trials.md`` and ``best.yaml`` in ``<folder>``;
3. everything the lease changed under ``benchmarks/results/`` (run files, tables,
   resume states, removed states) goes into ``OUT`` as at most 8 files of at most 16 MiB,
   64 MiB in all (what a lent machine gives back): ``lease-manifest.json``,
   ``lease-status.md`` and a tar archive cut into parts; resume states that do not fit are
   left out, in queue order, and the status says so (their runs continue from the state
   the repository holds).

``bring_back FILES_AT`` checks each part's sha256, and writes every file of the archive
into this checkout (atomically; only regular files under ``benchmarks/results/``), and
removes the resume states of runs the lease stored.

``prepare``: a lent machine takes at most 64 MiB of working tree, and every resume state
in the repository travels (14 MB each on Beauty).  ``prepare`` moves into ``.lease-held/``
(ignored by git), until the tree fits: first the stored results outside the queue's
folders (the lease neither continues nor reads them), then the states of the
lowest-priority queue items, listed in ``benchmarks/lease-held.json``; ``run`` skips those
items (started without their state, they would train again from scratch), and
``bring_back`` moves everything back.

``code_bundle``: a lent machine is sent the working tree with the ``.git`` of the commit
the session started from (START), so runs there would record START "with uncommitted
changes".  The commits since START, written here as a git bundle (small unless resume
states were committed since) and carried, are applied by ``run --code_bundle`` before
anything runs (``git fetch`` of the bundle, ``git reset`` of HEAD and the index to it; the
working tree is already that commit's), so each run records the commit it ran.

The lease's own clock decides everything: nothing here depends on the machine being a
GPU but the suite, so the same script is tried on a CPU with a one-minute budget
(``tests/test_lease.py`` does it on small data).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "benchmarks/lease_queue.json"
RESULTS = "benchmarks/results"
HELD_LIST = "benchmarks/lease-held.json"
HELD_FOLDER = ".lease-held"

# What a lent machine gives back (/work/.library/device/README.md, "Limits").
FILES_BACK = 8
FILE_BYTES = 16 * 2**20
TOTAL_BYTES = 64 * 2**20
TREE_BYTES = 64 * 2**20
# Room left in the tree for the prepared data that travels with it (Beauty: 3.2 MB).
DATA_ROOM = 8 * 2**20

# Seconds kept at the lease's end to pack what changed (a few 14-MB states).
PACK_SECONDS = 10

MANIFEST = "lease-manifest.json"
STATUS = "lease-status.md"
PART = "lease-files.tar.{:03d}"


class LeaseError(Exception):
    """A queue, manifest or archive that cannot be used: one line, exit 2."""


# ---------------------------------------------------------------------------- the queue


ITEM_KEYS = ("name", "folder", "fills", "note")
KINDS = {"compare": "--compare's arguments", "search": "a search's arguments"}
LEASE_OPTIONS = {
    "compare": ("--out", "--data_path", "--time_limit", "--checkpoint_dir"),
    "search": (
        "--storage_path", "--name", "--trial_store", "--resume", "--data_path",
        "--checkpoint_dir", "--gpus_per_trial",
    ),
}  # fmt: skip
# What a finished search item leaves in its folder (the first one says it finished).
SEARCH_OUTPUTS = ("trials.csv", "trials.md", "best.yaml", "recbole_freq_search.json")
# A search item's trial store, in its folder: the records and unfinished trials' states.
STORE = "store"


def load_queue(root: Path, path: str = QUEUE) -> list[dict]:
    """The queue's items, in priority order, each checked: ``name``, ``folder`` (under
    ``benchmarks/results/``), ``fills`` (which table cells its runs fill) and either
    ``compare`` (the ``--compare`` arguments: entries, then options, no ``--out``,
    ``--data_path`` or ``--time_limit``: the lease sets those) or ``search`` (a search's
    arguments, ``--hyper_file`` and the rest; the lease sets where it writes, its trial
    store ``<folder>/store`` and its GPUs, so each lease continues the last one's trials)."""
    try:
        queue = json.loads((root / path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise LeaseError(f"cannot read the queue {root / path}: {error}") from None
    items = queue.get("items") if isinstance(queue, dict) else None
    if not isinstance(items, list) or not items:
        raise LeaseError(f"{root / path} holds no 'items' list")
    names = set()
    for number, item in enumerate(items, 1):
        where = f"{path}, item {number}"
        if not isinstance(item, dict) or set(item) - {*ITEM_KEYS, *KINDS}:
            raise LeaseError(f"{where}: keys are name, folder, fills, compare or search (and note)")
        for key in ("name", "folder", "fills"):
            if not isinstance(item.get(key), str) or not item[key]:
                raise LeaseError(f"{where}: {key} must be a non-empty string")
        kinds = [kind for kind in KINDS if kind in item]
        if len(kinds) != 1:
            raise LeaseError(f"{where}: an item has either compare or search")
        item["kind"] = kinds[0]
        arguments = item[item["kind"]]
        if (
            not isinstance(arguments, list)
            or not arguments
            or not all(isinstance(a, str) for a in arguments)
        ):
            raise LeaseError(f"{where}: {item['kind']} must be the list of {KINDS[item['kind']]}")
        for option in LEASE_OPTIONS[item["kind"]]:
            if any(arg == option or arg.startswith(option + "=") for arg in arguments):
                raise LeaseError(f"{where}: {option} is the lease's to set")
        folder = Path(item["folder"])
        if (
            folder.is_absolute()
            or ".." in folder.parts
            or folder.parts[:2] != ("benchmarks", "results")
        ):
            raise LeaseError(f"{where}: folder must be a folder under {RESULTS}/")
        if item["name"] in names:
            raise LeaseError(f"{where}: a second item named {item['name']!r}")
        names.add(item["name"])
        item["runs"] = (
            expected_runs(arguments, where) if item["kind"] == "compare" else SEARCH_OUTPUTS[:1]
        )
    return items


def expected_runs(compare: list[str], where: str) -> list[str]:
    """The run files the item's command stores: ``<entry>-seed<N>.json`` for each entry
    and seed (``--seeds`` a comma list, as the lease's items give it)."""
    entries = [entry for entry in compare[0].split(",") if entry]
    seeds = None
    for index, arg in enumerate(compare):
        if arg == "--seeds" and index + 1 < len(compare):
            seeds = compare[index + 1]
        elif arg.startswith("--seeds="):
            seeds = arg.split("=", 1)[1]
    try:
        numbers = [int(seed) for seed in (seeds or "").split(",")]
    except ValueError:
        numbers = []
    if not entries or not numbers:
        raise LeaseError(f"{where}: compare needs its entries first and --seeds as a comma list")
    return [f"{entry}-seed{seed}.json" for entry in entries for seed in numbers]


def held_items(root: Path) -> set[str]:
    try:
        return set(json.loads((root / HELD_LIST).read_text())["items"])
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def item_states(root: Path, item: dict) -> list[Path]:
    """The resume states an item continues from: its runs' (``partial/``) or its search's
    unfinished trials' (``store/``)."""
    folder = (
        root / item["folder"] / ("partial" if item.get("kind", "compare") == "compare" else STORE)
    )
    return sorted(folder.glob("*.resume.pth")) if folder.is_dir() else []


def progress(root: Path, item: dict) -> dict:
    """Where an item stands: its runs stored (a search: its ranking written), and its
    resume states."""
    folder = root / item["folder"]
    if item.get("kind", "compare") == "compare":
        folder = folder / "runs"
    stored = [name for name in item["runs"] if (folder / name).is_file()]
    states = [path.name for path in item_states(root, item)]
    return {"stored": len(stored), "total": len(item["runs"]), "states": states}


# ---------------------------------------------------------------------------- the code

BUNDLE_REF = "refs/heads/lease-code"


def _git(root: Path, *args: str) -> str:
    # Neither hooks nor a file-system monitor run (as recbole_freq's code_identity).
    command = ["git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-C",
               str(root), *args]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LeaseError(f"git {' '.join(args)}: {(done.stderr or done.stdout).strip()}")
    return done.stdout.strip()


def code_bundle(root: Path, since: str, to: Path) -> str:
    """The commits from ``since`` to HEAD as a git bundle at ``to``; '' where HEAD is
    ``since`` (the lent machine has the code)."""
    head = _git(root, "rev-parse", "HEAD")
    if head == _git(root, "rev-parse", f"{since}^{{commit}}"):
        return ""
    _git(root, "update-ref", BUNDLE_REF, head)
    try:
        to.parent.mkdir(parents=True, exist_ok=True)
        _git(root, "bundle", "create", str(to), BUNDLE_REF, f"^{since}")
    finally:
        _git(root, "update-ref", "-d", BUNDLE_REF)
    return head


def apply_code_bundle(root: Path, bundle: Path) -> str:
    """HEAD and the index of the checkout at ``root`` moved to the bundle's commit (the
    working tree, already that commit's, untouched); that commit."""
    _git(root, "fetch", "-q", str(bundle), BUNDLE_REF)
    _git(root, "reset", "-q", "FETCH_HEAD")
    return _git(root, "rev-parse", "HEAD")


# ---------------------------------------------------------------------------- run


def snapshot(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under ``benchmarks/results/``."""
    from dataset_prep.atomic import file_sha256

    found = {}
    for path in sorted((root / RESULTS).rglob("*")):
        if path.is_file() and not path.is_symlink() and not path.name.endswith(".tmp"):
            found[path.relative_to(root).as_posix()] = file_sha256(path)
    return found


def compare_command(python: str, root: Path, item: dict, seconds: int, args) -> list[str]:
    folder = root / item["folder"]
    return [
        python, str(ROOT / "run_recbole_freq.py"), "--compare", *item["compare"],
        "--out", str(folder), f"--data_path={args.data_path}",
        f"--checkpoint_dir={args.checkpoint_dir}", "--show_progress=False",
        "--parallel", str(args.parallel), "--threads_per_run", str(args.threads_per_run),
        "--time_limit", str(seconds),
        *args.extra,
    ]  # fmt: skip


def search_command(python: str, root: Path, item: dict, args) -> tuple[list[str], Path]:
    """A search item's command and the folder its outputs go to: a new search each lease
    (Ray's state stays on the lent machine), continuing from the item's trial store."""
    storage = Path(args.checkpoint_dir).resolve() / "searches"
    name = f"{item['name']}-{time.strftime('%Y%m%d-%H%M%S')}"
    gpus = ["--gpus_per_trial", str(args.gpus_per_trial)] if args.gpus_per_trial else []
    command = [
        python, str(ROOT / "run_recbole_freq.py"), *item["search"],
        "--storage_path", str(storage), "--name", name,
        "--trial_store", str(root / item["folder"] / STORE),
        f"--data_path={args.data_path}", f"--checkpoint_dir={args.checkpoint_dir}",
        "--show_progress=False", *gpus, *args.extra,
    ]  # fmt: skip
    return command, storage / name


def keep_search_outputs(root: Path, item: dict, experiment: Path) -> None:
    """A finished search's ranking, best settings and search settings, into its folder."""
    for name in SEARCH_OUTPUTS:
        if (experiment / name).is_file():
            target = root / item["folder"] / name
            temporary = target.with_name(f".{name}.lease.tmp")
            shutil.copyfile(experiment / name, temporary)
            os.replace(temporary, target)


def run_suite(root: Path, args, deadline: float, log) -> dict:
    """The GPU suite, within ``--suite_minutes`` and the lease."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if args.suite == "no" or (args.suite == "auto" and not has_cuda):
        return {"ran": False, "why": "no CUDA device" if not has_cuda else "--suite no"}
    seconds = int(min(args.suite_minutes * 60, deadline - time.monotonic() - args.reserve))
    if seconds < 30:
        return {"ran": False, "why": "too little of the lease left"}
    out = root / RESULTS / f"gpu-suite-{time.strftime('%Y-%m-%d-%H%M')}"
    log(f"GPU suite into {out} ({seconds} s at most)")
    # Its own process group: at its time the benches it started stop with it, instead of
    # holding the GPU through the queue.
    suite = subprocess.Popen(
        ["bash", str(ROOT / "benchmarks" / "gpu_suite.sh"), str(out), args.data_path],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = suite.communicate(timeout=seconds)
        return {"ran": True, "exit": suite.returncode, "folder": str(out.relative_to(root)),
                "last": output.strip().splitlines()[-1:]}  # fmt: skip
    except subprocess.TimeoutExpired:
        os.killpg(suite.pid, signal.SIGKILL)
        suite.communicate()
        return {"ran": True, "exit": "stopped at its time", "folder": str(out.relative_to(root))}


def run_queue(root: Path, items: list[dict], args, deadline: float, log) -> dict:
    """Every unfinished item, ``--at_once`` side by side, until the lease's end."""
    held = held_items(root)
    waiting = [
        item for item in items
        if progress(root, item)["stored"] < len(item["runs"]) and item["name"] not in held
    ]  # fmt: skip
    outcome = {item["name"]: "held back (prepare)" for item in items if item["name"] in held}
    running: dict[str, tuple[subprocess.Popen, object, tuple]] = {}
    python = args.python or sys.executable
    Path(args.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    stop_at = deadline - args.reserve
    try:
        while waiting or running:
            while waiting and len(running) < args.at_once:
                left = int(stop_at - time.monotonic())
                if left < args.least_seconds:
                    break
                item = waiting.pop(0)
                (root / item["folder"]).mkdir(parents=True, exist_ok=True)
                logfile = open(root / item["folder"] / "lease.log", "a")
                experiment = None
                if item["kind"] == "search":
                    command, experiment = search_command(python, root, item, args)
                else:
                    command = compare_command(python, root, item, left, args)
                log(f"start {item['name']} ({left} s left)")
                env = dict(
                    os.environ, OMP_NUM_THREADS=str(args.threads_per_run), PYTHONUNBUFFERED="1"
                )
                running[item["name"]] = (
                    subprocess.Popen(
                        command, stdout=logfile, stderr=subprocess.STDOUT, env=env, cwd=root
                    ),
                    logfile,
                    (item, experiment),
                )
            if not running:
                break
            time.sleep(1)
            for name, (process, logfile, (item, experiment)) in list(running.items()):
                if process.poll() is not None:
                    logfile.close()
                    del running[name]
                    if experiment is not None and process.returncode == 0:
                        keep_search_outputs(root, item, experiment)
                    done = "all runs stored" if experiment is None else "search finished"
                    outcome[name] = {0: done, 3: "stopped at the lease's end"}.get(
                        process.returncode, f"exit {process.returncode} (see its lease.log)"
                    )
                    log(f"end {name}: {outcome[name]}")
            if time.monotonic() > deadline - args.grace - PACK_SECONDS:
                break  # a run still going now could not stop and be packed in time
    finally:
        for process, _, _ in running.values():  # past the lease's end: SIGTERM
            process.send_signal(signal.SIGTERM)
        for name, (process, logfile, _) in running.items():
            try:
                process.wait(timeout=args.grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            logfile.close()
            outcome[name] = "stopped by the lease (SIGTERM)"
            log(f"end {name}: {outcome[name]}")
    for item in waiting:
        outcome.setdefault(item["name"], "not started (the lease's time was used)")
    return outcome


def pack(root: Path, before: dict, after: dict, out: Path, status: str, items: list[dict]) -> dict:
    """Write what changed into ``out`` as the manifest, the status and the archive's parts,
    within what a lent machine gives back.  Resume states come last, in queue order, and
    the ones that do not fit are listed as left out."""
    changed = [path for path, digest in after.items() if before.get(path) != digest]
    removed = [path for path in before if path not in after]
    order = {item["folder"]: number for number, item in enumerate(items)}

    def rank(path: str):
        is_state = path.endswith(".resume.pth")
        folder = next((f for f in order if path.startswith(f + "/")), None)
        return (is_state, order.get(folder, len(order)), path)

    budget = min(TOTAL_BYTES - 2 * 2**20, (FILES_BACK - 2) * FILE_BYTES)  # 2 MiB: manifest, status
    chosen, left_out, size = [], [], 0
    for path in sorted(changed, key=rank):
        cost = (root / path).stat().st_size + 1024  # a tar header and padding
        if size + cost > budget:
            left_out.append(path)
            continue
        chosen.append(path)
        size += cost
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in chosen:
            archive.add(root / path, arcname=path, recursive=False)
    data = buffer.getvalue()
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for number, start in enumerate(range(0, len(data), FILE_BYTES)):
        chunk = data[start : start + FILE_BYTES]
        name = PART.format(number)
        (out / name).write_bytes(chunk)
        parts.append({"name": name, "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {
        "format": 1,
        "parts": parts,
        "files": chosen,
        "removed": removed,
        "left_out": left_out,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    (out / STATUS).write_text(status)
    return manifest


def status_table(
    root: Path, items: list[dict], before: dict | None = None, outcome=None, suite=None,
    queue: str = QUEUE,
) -> str:  # fmt: skip
    rows = [
        "| item | fills | runs stored (a search: its ranking) | resume states | this lease |",
        "|---|---|---:|---|---|",
    ]
    for item in items:
        now = progress(root, item)
        stored = f"{now['stored']} of {now['total']}"
        if before is not None:
            stored = f"{before[item['name']]['stored']} -> {stored}"
        rows.append(
            f"| {item['name']} | {item['fills']} | {stored} | {len(now['states'])} | "
            f"{(outcome or {}).get(item['name'], '')} |"
        )
    text = [
        f"# Lease status ({time.strftime('%Y-%m-%d %H:%M')}, queue {queue})",
        "",
        *rows,
        "",
    ]
    if suite is not None:
        text += [f"GPU suite: {json.dumps(suite)}", ""]
    return "\n".join(text)


def run(args) -> int:
    start = time.monotonic()
    deadline = start + args.minutes * 60
    root = Path(args.root).resolve()
    items = load_queue(root, args.queue)
    log = lambda line: print(f"[{time.monotonic() - start:6.0f} s] {line}", flush=True)  # noqa: E731
    if args.code_bundle:
        log(f"code: {apply_code_bundle(root, Path(args.code_bundle))} (from {args.code_bundle})")
    before = snapshot(root)
    progress_before = {item["name"]: progress(root, item) for item in items}
    suite = run_suite(root, args, deadline, log)
    outcome = run_queue(root, items, args, deadline, log)
    after = snapshot(root)
    status = status_table(root, items, progress_before, outcome, suite, args.queue)
    manifest = pack(root, before, after, Path(args.out), status, items)
    log(
        f"{len(manifest['files'])} files in {len(manifest['parts'])} part(s), "
        f"{len(manifest['removed'])} removed, {len(manifest['left_out'])} left out -> {args.out}"
    )
    print(status)
    return 0


# ---------------------------------------------------------------------------- bring back


def bring_back(args) -> int:
    """Write what a lease packed into this checkout."""
    here = Path(args.files_at)
    root = Path(args.root).resolve()
    try:
        manifest = json.loads((here / MANIFEST).read_text())
        parts = manifest["parts"]
        files, removed = manifest["files"], manifest["removed"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise LeaseError(f"{here / MANIFEST} is not a lease's manifest: {error}") from None
    data = b""
    for part in parts:
        name = str(part["name"])
        if "/" in name or not name.startswith("lease-files.tar."):
            raise LeaseError(f"the manifest names {name!r}, not one of the lease's parts")
        chunk = (here / name).read_bytes()
        if hashlib.sha256(chunk).hexdigest() != part["sha256"]:
            raise LeaseError(f"{here / name} is not the part the lease wrote (sha256 differs)")
        data += chunk
    written = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for member in archive.getmembers():
            target = _checked_target(root, member.name)
            if not member.isfile() or member.name not in files:
                raise LeaseError(
                    f"the archive holds {member.name!r}, not a file the manifest lists"
                )
            content = archive.extractfile(member).read()
            temporary = target.with_name(f".{target.name}.lease.tmp")
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_bytes(content)
            os.replace(temporary, target)
            written += 1
    gone = 0
    for path in removed:
        target = _checked_target(root, path)
        if (
            target.parent.name in ("partial", STORE)
            and target.name.endswith(".resume.pth")
            and target.is_file()
        ):
            target.unlink()  # its run (or search trial) was finished by the lease
            gone += 1
    restored = restore_held(root)
    if any("/runs/" in name for name in files) and (root / "benchmarks" / "coverage.py").is_file():
        # New run files change which published cells are covered: the index says so.
        subprocess.run(
            [sys.executable, str(root / "benchmarks" / "coverage.py"), "--write"], check=False
        )
    print(
        f"brought back {written} files, removed {gone} resume states of stored runs, "
        f"{restored} held states moved back; left out by the lease: {len(manifest.get('left_out', []))}"
    )
    for path in manifest.get("left_out", []):
        print(f"  left out (its run continues from the state here): {path}")
    if (here / STATUS).is_file():
        shutil.copyfile(here / STATUS, root / RESULTS / STATUS)
    return 0


def _checked_target(root: Path, name: str) -> Path:
    path = Path(name)
    if path.is_absolute() or ".." in path.parts or path.parts[:2] != ("benchmarks", "results"):
        raise LeaseError(f"the lease's archive names {name!r}, outside {RESULTS}/")
    target = root / path
    for parent in [target, *target.parents]:
        if parent == root:
            break
        if parent.is_symlink():
            raise LeaseError(f"{parent} is a symbolic link: nothing is written through it")
    return target


# ---------------------------------------------------------------------------- prepare


def travelling_bytes(root: Path) -> int:
    """What a lent machine is sent: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    return sum(
        (root / os.fsdecode(name)).stat().st_size
        for name in listed
        if name and (root / os.fsdecode(name)).is_file()
    )


def prepare(args) -> int:
    root = Path(args.root).resolve()
    items = load_queue(root, args.queue)
    limit = int(args.tree_mib * 2**20) - DATA_ROOM
    size = travelling_bytes(root)
    outside = (0, 0)
    if size > limit:
        outside = hold_results_outside(root, [item["folder"] for item in items])
        size -= outside[1]
    held = []
    for item in reversed(items):  # the lowest priority first
        if size <= limit:
            break
        states = item_states(root, item)
        if not states:
            continue
        for state in states:
            target = root / HELD_FOLDER / state.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            size -= state.stat().st_size
            os.replace(state, target)
        held.append(item["name"])
    if held:
        (root / HELD_LIST).write_text(json.dumps({"items": held}, indent=2))
    print(
        f"the tree that travels: {size / 2**20:.1f} MiB (limit {limit / 2**20:.0f} MiB with room "
        f"for the data); held back: {outside[0]} result files outside the queue's folders "
        f"({outside[1] / 2**20:.1f} MiB); the states of {', '.join(held) or 'no item'}"
    )
    return 0 if size <= limit else 1


def hold_results_outside(root: Path, folders: list[str]) -> tuple[int, int]:
    """Every file under ``benchmarks/results/`` outside the queue's ``folders`` (stored
    results the lease neither continues nor reads) moved into ``.lease-held/``: (files,
    bytes).  They go first: holding them back costs the lease nothing."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", RESULTS],
        cwd=root, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    count = size = 0
    for name in filter(None, (os.fsdecode(raw) for raw in listed)):
        if any(name == folder or name.startswith(folder + "/") for folder in folders):
            continue
        path = root / name
        if not path.is_file():
            continue
        target = root / HELD_FOLDER / name
        target.parent.mkdir(parents=True, exist_ok=True)
        size += path.stat().st_size
        os.replace(path, target)
        count += 1
    return count, size


def restore_held(root: Path) -> int:
    folder = root / HELD_FOLDER
    moved = 0
    if folder.is_dir():
        for state in sorted(path for path in folder.rglob("*") if path.is_file()):
            target = root / state.relative_to(folder)
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(state, target)
                moved += 1
        shutil.rmtree(folder, ignore_errors=True)
    (root / HELD_LIST).unlink(missing_ok=True)
    return moved


def status(args) -> int:
    root = Path(args.root).resolve()
    print(status_table(root, load_queue(root, args.queue), queue=args.queue))
    return 0


# ---------------------------------------------------------------------------- command line


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--root", default=str(ROOT), help="the checkout (default: this one)")
    parser.add_argument("--queue", default=QUEUE, help="the queue file, relative to --root")
    commands = parser.add_subparsers(dest="command", required=True)
    lease = commands.add_parser(
        "run", help="the suite, then the queue, within --minutes", allow_abbrev=False
    )
    lease.add_argument("--minutes", type=float, required=True, help="the lease's length from now")
    lease.add_argument("--data_path", required=True, help="the prepared datasets")
    lease.add_argument("--out", required=True, help="where the files to bring back go ($OUT)")
    lease.add_argument(
        "--checkpoint_dir", default="/tmp/lease-saved", help="best weights (not brought back)"
    )
    lease.add_argument(
        "--code_bundle", default=None, help="commits to apply first (the code_bundle command)"
    )
    lease.add_argument("--suite", choices=["auto", "yes", "no"], default="auto")
    lease.add_argument("--suite_minutes", type=float, default=3.0)
    lease.add_argument(
        "--at_once", type=int, default=None, help="items side by side (CUDA 3, else 1)"
    )
    lease.add_argument(
        "--parallel", default="1", help="runs each item packs (--compare --parallel)"
    )
    lease.add_argument("--threads_per_run", type=int, default=1)
    lease.add_argument(
        "--gpus_per_trial",
        type=float,
        default=None,
        help="GPU share of a search item's trial (CUDA 0.25, else 0: on the CPU)",
    )
    lease.add_argument(
        "--reserve",
        type=float,
        default=45.0,
        help="--time_limit is the lease less this: runs stop by themselves before the SIGTERM",
    )
    lease.add_argument(
        "--grace", type=float, default=20.0,
        help="seconds a run gets to stop after SIGTERM, sent this long before the lease ends "
        f"(and {PACK_SECONDS} s more, for packing)",
    )  # fmt: skip
    lease.add_argument("--least_seconds", type=int, default=10, help="no item starts with less")
    lease.add_argument("--python", default=None, help="the Python of the runs (default: this one)")
    back = commands.add_parser("bring_back", help="write a lease's files into this checkout")
    back.add_argument("files_at", help="the folder the lease's OUT files were copied to")
    held = commands.add_parser("prepare", help="hold back resume states until the tree travels")
    held.add_argument("--tree_mib", type=float, default=TREE_BYTES / 2**20, help="the tree's limit")
    commands.add_parser("status", help="the queue's progress")
    bundle = commands.add_parser("code_bundle", help="the commits since START, for a lease")
    bundle.add_argument("--since", required=True, help="the commit the lent machine has")
    bundle.add_argument("--to", required=True, help="the bundle to write (a carried folder)")
    # Anything else (--epochs=3 ...) is a --compare setting given to every item.
    args, args.extra = parser.parse_known_args(argv)
    if args.extra and args.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(args.extra)}")
    try:
        if args.command == "run":
            try:
                import torch

                cuda = torch.cuda.is_available()
            except ImportError:
                cuda = False
            if args.at_once is None:
                args.at_once = 3 if cuda else 1
            if args.gpus_per_trial is None:
                args.gpus_per_trial = 0.25 if cuda else 0.0
            return run(args)
        if args.command == "code_bundle":
            head = code_bundle(Path(args.root).resolve(), args.since, Path(args.to))
            print(f"{args.to}: {head}" if head else "HEAD is the commit given: no bundle")
            return 0
        return {"bring_back": bring_back, "prepare": prepare, "status": status}[args.command](args)
    except LeaseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
