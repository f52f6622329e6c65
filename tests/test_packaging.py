"""A regular (non-editable) install ships the property files and both packages."""

import os
import subprocess
import sys
import zipfile

from conftest import REPO_ROOT


def test_wheel_install_finds_property_files(tmp_path):
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "wheel"),
            str(REPO_ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "wheel").glob("recbole_freq-*.whl")
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
        "recbole_freq/tune/search.py",
        "recbole_freq/model/encoder.py",
    ):
        assert expected in names

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
        "import recbole_freq, recbole_freq.config as c;"
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
