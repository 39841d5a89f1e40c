"""The sidebar's browser tests: a real JupyterLab in a process of its own (``tests/lab.py``)
sharing the module's nbdist data folder with the kernels the tests start, and the shadows of
pytest-jupyter's autouse fixtures, which these tests (no in-process server) must not run.

The lab reads this checkout's ``jupyter-config/`` too (``JUPYTER_CONFIG_PATH``), as an install
of nbdist puts it in the environment's ``etc/jupyter``: what it configures (ipyparallel's own
cluster panel disabled) is what a person who installed this checkout gets."""

from __future__ import annotations

import asyncio

import pytest
from lab import running_lab
from paths import ROOT, data_dir_env

#: The project's Jupyter configuration, as an install puts it in ``etc/jupyter``.
JUPYTER_CONFIG = ROOT / "jupyter-config"


@pytest.fixture
def jp_asyncio_loop():
    """Shadows pytest-jupyter's autouse fixture (loaded by tests/conftest.py), which would take
    Playwright's running loop for its own and close it: here it gets a loop of its own."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def jp_server_cleanup():
    """Shadows pytest-jupyter's autouse cleanup: no in-process server here (the lab runs in a
    process of its own), and Playwright's loop runs on this thread."""
    yield


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """This module's nbdist data directory: the lab's, and that of the kernel the test starts."""
    with data_dir_env(tmp_path_factory.mktemp("nbdist-data")) as path:
        yield path


@pytest.fixture(scope="module")
def lab(tmp_path_factory, data):
    """A real ``jupyter lab`` (tests/lab.py) sharing ``data``."""
    base = tmp_path_factory.mktemp("lab")
    with running_lab(base, base / "root", env={"JUPYTER_CONFIG_PATH": str(JUPYTER_CONFIG)}) as lab:
        yield lab
