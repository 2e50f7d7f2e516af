"""scripts/install_ml_env.sh refuses up front, naming the folder and the fix, when the disk is too
small for the ML virtualenv: a full disk otherwise fails pip minutes later with an error that reads
like a missing wheel (CI once lost a run that way)."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_disk(tmp_path):
    """A real 64 MiB filesystem (tmpfs), so the script's own `df` reads it."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64M", "tmpfs", str(mount_point)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:  # CI runs as root; a developer's unprivileged shell cannot mount
        pytest.skip(f"mounting a tmpfs needs root: {mounted.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


def test_too_small_a_disk_is_refused_before_pip_runs(small_disk):
    venv = small_disk / "venv-ml"
    env = {**os.environ, "ENTROLOOP_ML_VENV": str(venv)}
    run = subprocess.run(["bash", str(ROOT / "scripts/install_ml_env.sh")], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"GiB free under {small_disk}" in run.stderr
    assert "needs about 8 GiB" in run.stderr
    assert "ENTROLOOP_ML_VENV" in run.stderr  # the fix is named
    assert not (venv / "bin" / "pip").exists()  # refused before any venv or download
