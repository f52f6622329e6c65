"""The lease script (benchmarks/lease.py) tried as a lease on this CPU: it stops the
queue's runs at the lease's end with their resume states, packs what changed within what
a lent machine gives back, ``bring_back`` writes it into the checkout, and the next lease
continues the runs from those states."""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recbole_freq.quick_start.resume import load_resume_state

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "lease.py"
spec = importlib.util.spec_from_file_location("lease", SCRIPT)
lease = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lease)

FOLDER = "benchmarks/results/dry"


def make_checkout(root: Path) -> None:
    (root / FOLDER).mkdir(parents=True)
    queue = {
        "items": [
            {
                "name": "dry",
                "folder": FOLDER,
                "fills": "nothing: a dry lease",
                "compare": ["SASRec", "--dataset=tiny", "--seeds", "1"],
            }
        ]
    }
    (root / "benchmarks" / "lease_queue.json").write_text(json.dumps(queue))


def lease_run(root, out, small_config, tmp_path):
    settings = {
        key: value
        for key, value in small_config.items()
        if key not in ("data_path", "checkpoint_dir", "seed", "show_progress")
    }
    settings.update(epochs=2000, stopping_step=2000)  # never finished within a lease
    # 54 s, 39 s of them the run's: time to start and train an epoch on a loaded machine
    # (the suite's other worker, a training run beside it)
    argv = [sys.executable, str(SCRIPT), "--root", str(root), "run", "--minutes", "0.9"]
    argv += ["--data_path", small_config["data_path"], "--out", str(out), "--suite", "no"]
    argv += ["--reserve", "15", "--grace", "3", "--least_seconds", "3"]
    argv += ["--checkpoint_dir", str(tmp_path / "saved")]
    argv += [f"--{key}={value}" for key, value in settings.items()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_dry_lease_stops_brings_back_and_the_next_one_continues(small_config, tmp_path):
    lent, home = tmp_path / "lent", tmp_path / "home"
    make_checkout(lent)
    shutil.copytree(lent, home)
    state_name = "SASRec-seed1.resume.pth"

    printed = lease_run(lent, tmp_path / "out1", small_config, tmp_path)
    # Stopped by its --time_limit, or by the lease's SIGTERM 14 s before the end where
    # the machine is slow: either keeps the epochs done.
    assert "| dry | nothing: a dry lease | 0 -> 0 of 1 | 1 | stopped " in printed
    out = tmp_path / "out1"
    manifest = json.loads((out / lease.MANIFEST).read_text())
    assert f"{FOLDER}/partial/{state_name}" in manifest["files"] and not manifest["left_out"]
    back = sorted(p.name for p in out.iterdir())
    assert len(back) <= lease.FILES_BACK and all(
        p.stat().st_size <= lease.FILE_BYTES for p in out.iterdir()
    )
    assert back[:2] == ["lease-files.tar.000", "lease-manifest.json"]

    assert lease.main(["--root", str(home), "bring_back", str(out)]) == 0
    first = load_resume_state(home / FOLDER / "partial" / state_name)
    assert (home / FOLDER / "partial" / state_name).read_bytes() == (
        lent / FOLDER / "partial" / state_name
    ).read_bytes()
    assert first["next_epoch"] >= 1

    lease_run(home, tmp_path / "out2", small_config, tmp_path)
    log = (home / FOLDER / "lease.log").read_text()
    assert f"continues at epoch {first['next_epoch']}," in log
    second = load_resume_state(home / FOLDER / "partial" / state_name)
    assert second["next_epoch"] > first["next_epoch"]
    assert second["history"][: len(first["history"])] == first["history"]


def test_a_search_item_continues_from_its_trial_store_and_keeps_its_ranking(small_config, tmp_path):
    """A search in the queue: the lease runs it with the item's trial store (whose records
    and states it brings back, so that a search a lease stopped goes on from them, in the
    next lease or on this CPU: the store's replay is tested in test_tune); a finished one
    leaves its ranking and best settings in the item's folder."""
    folder = "benchmarks/results/dry-search"
    root = tmp_path / "lent"
    (root / folder).mkdir(parents=True)
    hyper = tmp_path / "space.hyper"
    hyper.write_text("alpha choice [0.3,0.7]\n")
    search = ["--model=BSARec", "--dataset=tiny", "--hyper_file", str(hyper), "--num_cpus=1"]
    search += ["--scheduler=none", "--max_concurrent=1", "--verbose=0"]
    item = {"name": "dry-search", "folder": folder, "fills": "nothing", "search": search}
    (root / "benchmarks" / "lease_queue.json").write_text(json.dumps({"items": [item]}))
    settings = {
        key: value
        for key, value in small_config.items()
        if key not in ("data_path", "checkpoint_dir", "show_progress")
    }
    settings["epochs"] = 2
    store = root / folder / lease.STORE
    # Minutes to spare: the lease ends when its only item does (about a minute alone).
    argv = [sys.executable, str(SCRIPT), "--root", str(root), "run", "--minutes", "8"]
    argv += ["--data_path", small_config["data_path"], "--out", str(tmp_path / "out")]
    argv += ["--suite", "no", "--grace", "3", "--checkpoint_dir", str(tmp_path / "saved")]
    argv += [f"--{key}={value}" for key, value in settings.items()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| dry-search | nothing | 0 -> 1 of 1 | 0 | search finished |" in done.stdout
    ranking = (root / folder / "trials.csv").read_text().splitlines()
    assert len(ranking) == 3 and all(",completed," in row for row in ranking[1:])
    assert (root / folder / "best.yaml").is_file()
    records = sorted(store.glob("*.trial.json"))
    assert len(records) == 2 and not list(store.glob("*.resume.pth"))
    assert all(json.loads(r.read_text())["final"]["epochs_run"] == 2 for r in records)
    manifest = json.loads((tmp_path / "out" / lease.MANIFEST).read_text())
    assert f"{folder}/trials.csv" in manifest["files"]
    assert all(f"{folder}/store/{r.name}" in manifest["files"] for r in records)


@pytest.mark.parametrize(
    "item, message",
    [
        ({"compare": ["SASRec", "--seeds", "1", "--out", "x"]}, "--out is the lease's to set"),
        ({"folder": "../elsewhere"}, "folder must be a folder under benchmarks/results/"),
        ({"compare": ["SASRec", "--dataset=tiny"]}, "--seeds as a comma list"),
    ],
)
def test_a_queue_item_the_lease_cannot_run_is_one_line(tmp_path, capsys, item, message):
    make_checkout(tmp_path)
    queue = json.loads((tmp_path / "benchmarks" / "lease_queue.json").read_text())
    queue["items"][0].update(item)
    (tmp_path / "benchmarks" / "lease_queue.json").write_text(json.dumps(queue))
    assert lease.main(["--root", str(tmp_path), "status"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_the_repositorys_queue_is_valid():
    items = lease.load_queue(lease.ROOT)
    assert items[0]["name"] == "polyrec-readings-beauty"


def test_bring_back_refuses_an_archive_that_writes_outside_the_results(tmp_path):
    import hashlib
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        data = b"x"
        member = tarfile.TarInfo("benchmarks/results/../../evil.txt")
        member.size = len(data)
        archive.addfile(member, io.BytesIO(data))
    part = buffer.getvalue()
    (tmp_path / "back").mkdir()
    (tmp_path / "back" / "lease-files.tar.000").write_bytes(part)
    manifest = {
        "parts": [{"name": "lease-files.tar.000", "sha256": hashlib.sha256(part).hexdigest()}],
        "files": ["benchmarks/results/../../evil.txt"],
        "removed": [],
    }
    (tmp_path / "back" / lease.MANIFEST).write_text(json.dumps(manifest))
    (tmp_path / "home").mkdir()
    assert lease.main(["--root", str(tmp_path / "home"), "bring_back", str(tmp_path / "back")]) == 2
    assert not (tmp_path / "evil.txt").exists()


def test_prepare_holds_back_the_lowest_priority_states_and_bring_back_returns_them(tmp_path):
    root = tmp_path / "checkout"
    make_checkout(root)
    queue = json.loads((root / "benchmarks" / "lease_queue.json").read_text())
    first = dict(queue["items"][0], name="first", folder="benchmarks/results/first")
    queue["items"].insert(0, first)
    (root / "benchmarks" / "lease_queue.json").write_text(json.dumps(queue))
    states = {}
    for folder in ("first", "dry"):
        state = root / "benchmarks" / "results" / folder / "partial" / "SASRec-seed1.resume.pth"
        state.parent.mkdir(parents=True)
        state.write_bytes(folder.encode() * 2**20)  # 3-5 MiB
        states[folder] = state
    # Results no queue item continues or reads: held back first, at no cost to the lease.
    other = root / "benchmarks" / "results" / "other" / "runs" / "SASRec-seed1.json"
    other.parent.mkdir(parents=True)
    other.write_bytes(b"o" * 2**20)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    # 8 MiB stay free for the data: a 14-MiB limit holds the first item's state alone.
    assert lease.main(["--root", str(root), "prepare", "--tree_mib", "14"]) == 0
    assert states["first"].is_file() and not states["dry"].exists() and not other.exists()
    assert (states["first"].parent.parent / "partial").is_dir()
    assert json.loads((root / lease.HELD_LIST).read_text()) == {"items": ["dry"]}
    assert lease.restore_held(root) == 2
    assert states["dry"].read_bytes() == b"dry" * 2**20 and not (root / lease.HELD_LIST).exists()
    assert other.read_bytes() == b"o" * 2**20


def test_prepare_keeps_everything_where_the_tree_fits(tmp_path):
    root = tmp_path / "checkout"
    make_checkout(root)
    other = root / "benchmarks" / "results" / "other" / "runs" / "SASRec-seed1.json"
    other.parent.mkdir(parents=True)
    other.write_bytes(b"o" * 1024)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    assert lease.main(["--root", str(root), "prepare"]) == 0
    assert other.is_file() and not (root / lease.HELD_FOLDER).exists()


def test_the_commits_since_the_lent_machines_travel_as_a_bundle_and_are_applied(tmp_path):
    """``code_bundle --since START`` here; ``run --code_bundle`` there, on a checkout whose
    .git is START and whose files are HEAD's: HEAD and a clean status, so runs record the
    commit they run."""

    def git(root, *args):
        return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c",
                               "user.email=t@t", *args], check=True, capture_output=True,
                              text=True).stdout.strip()  # fmt: skip

    home = tmp_path / "home"
    (home / "recbole_freq").mkdir(parents=True)
    (home / "recbole_freq" / "code.py").write_text("x = 1\n")
    git(home, "init", "-q")
    git(home, "add", ".")
    git(home, "commit", "-q", "-m", "start")
    start = git(home, "rev-parse", "HEAD")
    assert lease.code_bundle(home, start, tmp_path / "none.bundle") == ""
    (home / "recbole_freq" / "code.py").write_text("x = 2\n")
    git(home, "commit", "-q", "-am", "later")
    head = git(home, "rev-parse", "HEAD")
    bundle = tmp_path / "carried" / "code.bundle"
    assert lease.main(["--root", str(home), "code_bundle", "--since", start, "--to",
                       str(bundle)]) == 0  # fmt: skip
    assert "lease-code" not in git(home, "branch", "--list")

    lent = tmp_path / "lent"
    git(tmp_path, "clone", "-q", str(home), str(lent))
    git(lent, "reset", "-q", "--hard", start)  # the lent machine's .git
    (lent / "recbole_freq" / "code.py").write_text("x = 2\n")  # the tree sent: HEAD's
    assert git(lent, "status", "--porcelain", "--untracked-files=no")
    git(lent, "remote", "remove", "origin")
    git(lent, "reflog", "expire", "--expire=now", "--all")
    git(lent, "gc", "-q", "--prune=now")  # HEAD's commit only in the bundle
    with pytest.raises(subprocess.CalledProcessError):
        git(lent, "cat-file", "-e", head)
    assert lease.apply_code_bundle(lent, bundle) == head
    assert git(lent, "status", "--porcelain", "--untracked-files=no") == ""
    with pytest.raises(lease.LeaseError, match="git fetch"):
        lease.apply_code_bundle(lent, tmp_path / "missing.bundle")
