"""Checkpoints on real clusters: a disk that fills up, for the tests of what a full disk does to a
checkpoint being written."""

from __future__ import annotations

import subprocess

import pytest


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs (root only), unmounted afterwards."""
    where = tmp_path / "small"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(where)], check=True)
