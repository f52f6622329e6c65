"""A regular (non-editable) install ships the property files and both packages, and a
fresh environment with the wheel runs the plugin from outside the repository."""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import REPO_ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built once (as ``pip wheel .`` builds it)."""
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(REPO_ROOT)],
        capture_output=True, text=True, timeout=300, cwd=out,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    (built,) = out.glob("recbole_freq-*.whl")
    return built


def test_building_from_the_checkout_leaves_only_what_readme_names_and_git_ignores(wheel):
    """README: pip builds inside the checkout, leaving build/ and recbole_freq.egg-info/,
    which git ignores."""
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert (REPO_ROOT / "build").is_dir() and (REPO_ROOT / "recbole_freq.egg-info").is_dir()
    ignored = subprocess.run(
        ["git", "check-ignore", "build", "recbole_freq.egg-info"],
        capture_output=True, text=True, cwd=REPO_ROOT,
    )  # fmt: skip
    assert ignored.returncode == 0 and ignored.stdout.split() == ["build", "recbole_freq.egg-info"]


def test_wheel_install_finds_property_files(tmp_path, wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in (
        "recbole_freq/properties/overall.yaml",
        "recbole_freq/properties/default_job.yaml",
        "recbole_freq/properties/model/BSARec.yaml",
        "recbole_freq/properties/model/FBSARec.yaml",
        "recbole_freq/properties/dataset/amazon-beauty.yaml",
        "recbole_freq/properties/paper/BSARec/lastfm.yaml",
        "dataset_prep/__main__.py",
        "recbole_freq/__main__.py",
        "recbole_freq/cli/__init__.py",
        "recbole_freq/jobs/tune/search.py",
        "recbole_freq/model/encoder.py",
    ):
        assert expected in names
    # Every module of both packages (a subpackage left out of setup.cfg would be missing).
    sources = {
        path.relative_to(REPO_ROOT).as_posix()
        for package in ("recbole_freq", "dataset_prep")
        for path in (REPO_ROOT / package).rglob("*.py")
    }
    assert sorted(sources - names) == []
    assert any(name.endswith(".dist-info/LICENSE") or "/licenses/LICENSE" in name for name in names)

    target = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    probe = (
        "import recbole_freq, recbole_freq.config.configurator as c;"
        "p = c.property_files('BSARec', 'lastfm', paper=True); print(recbole_freq.__file__); print(p)"
    )
    env = dict(os.environ, PYTHONPATH=str(target))
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert str(target) in result.stdout and "paper/BSARec/lastfm.yaml" in result.stdout
    assert str(REPO_ROOT / "properties") not in result.stdout


# What the fresh environment must not see of this one: RecBole (installed in a second step,
# as the README says) and the editable install of this checkout.
NOT_SHARED = ("recbole", "__editable__", "_recbole_freq", "dataset_prep")


def fresh_environment(root: Path, wheel: Path) -> tuple[Path, Path]:
    """A new virtual environment holding the wheel, whose other packages are this
    environment's (linked, not downloaded: the machines here have no network), RecBole
    left out.  Returns ``(its python, the folder of its shared packages)``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    shared = root / "shared-packages"
    shared.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.lower().startswith(NOT_SHARED) and not entry.name.endswith(".pth"):
            (shared / entry.name).symlink_to(entry)
    (site / "shared-packages.pth").write_text(f"{shared}\n")
    install = subprocess.run(
        [python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    return python, shared


def test_a_fresh_environment_names_the_recbole_command_then_runs_from_outside_the_repository(
    tmp_path, wheel, tiny_data
):
    python, shared = fresh_environment(tmp_path, wheel)
    command = python.parent / "recbole-freq"
    outside = tmp_path / "work"
    outside.mkdir()

    def run(*args):
        return subprocess.run(
            [str(a) for a in args], capture_output=True, text=True, timeout=300, cwd=outside,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )  # fmt: skip

    job = [command, "--model=SASRec", "--dataset=wide", f"--data_path={tiny_data}"]
    job += ["--config_files", "protocol/uni100", "--epochs=1", "--hidden_size=16"]
    job += ["--inner_size=32", "--show_progress=False", "--state=WARNING"]

    # pip leaves RecBole out: one line naming the command that installs it.
    missing = run(*job)
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.strip().splitlines() == [
        "error: recbole-freq needs RecBole 1.2.1 (it is not installed); pip leaves it out "
        "because its metadata pins ray<=2.6.3, which cannot run on numpy 2. Install it with: "
        "pip install --no-deps recbole==1.2.1"
    ]

    # That command, done here by linking this environment's RecBole 1.2.1.
    purelib = Path(sysconfig.get_paths()["purelib"])
    for entry in purelib.glob("recbole*"):
        if entry.name == "recbole" or entry.name.startswith("recbole-1.2.1"):
            (shared / entry.name).symlink_to(entry)
    where = run(python, "-c", "import recbole_freq; print(recbole_freq.__file__)")
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(str(tmp_path / "venv")), where.stdout

    done = run(*job)
    assert done.returncode == 0, done.stderr
    assert "recbole-freq  SASRec on wide" in done.stdout and "checkpoint:" in done.stdout
    assert list((outside / "saved").glob("SASRec-wide-*.pth"))
    # python -m recbole_freq is the same command; its --help names the built-in files.
    helped = run(python, "-m", "recbole_freq", "--help")
    assert helped.returncode == 0 and "protocol/uni100" in helped.stdout


def copy_of_the_checkout(where: Path) -> Path:
    """The package, its property files and the entry point, as another checkout has them."""
    for part in ("recbole_freq", "properties"):
        shutil.copytree(
            REPO_ROOT / part, where / part, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(REPO_ROOT / "run_recbole_freq.py", where / "run_recbole_freq.py")
    return where


def test_another_checkout_reads_its_own_property_files(tmp_path):
    """A second checkout (a git worktree of another commit) run beside this one, which is
    installed in editable mode: it reads its own files, not the installed checkout's
    (whose package ``recbole_freq.properties`` the editable install maps)."""
    other = copy_of_the_checkout(tmp_path / "worktree")
    overall = other / "properties" / "overall.yaml"
    overall.write_text(overall.read_text() + "\nworktree_marker: 7\n")
    probe = (
        "from recbole_freq.utils.property_files import properties_dir, read_config_file;"
        "d = properties_dir(); print(d); print(read_config_file(d / 'overall.yaml').get('worktree_marker'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=other,
        env={**os.environ, "PYTHONPATH": str(other)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(other / "properties"), "7"]


def test_a_checkout_that_was_not_installed_finds_its_property_files(tmp_path):
    """``PYTHONPATH=<checkout>`` without an install (a machine with no package index): the
    package ``recbole_freq.properties`` does not exist there, so the files are read from
    the tree's ``properties/``.  ``python -S`` keeps the editable install's finder (a
    ``.pth`` file) from supplying the package."""
    checkout = copy_of_the_checkout(tmp_path / "checkout")
    site_packages = sysconfig.get_paths()["purelib"]
    probe = (
        "from recbole_freq.utils.property_files import properties_dir, find_config_file;"
        "print(properties_dir()); print(find_config_file('protocol/uni100'))"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", probe], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), site_packages])},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        str(checkout / "properties"),
        str(checkout / "properties" / "protocol" / "uni100.yaml"),
    ]


def test_the_jobs_default_output_folders_are_ignored_by_git(tmp_path):
    """Issue 69: a newcomer's comparisons/, analysis/, ray_results/ and the README's
    table2/ showed up as untracked files of the checkout."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        import pytest

        pytest.skip("not a git checkout")
    names = ["comparisons/lastfm/runs/x.json", "analysis/a/analysis.json",
             "ray_results/s/best.yaml", "table2/grid.md"]  # fmt: skip
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *names], cwd=root, capture_output=True, text=True
    ).stdout.split()
    assert sorted(ignored) == sorted(names)
