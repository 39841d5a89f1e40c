"""Shared fixtures: real clusters, real kernels, and a check that no process outlives the tests.

The helpers the tests import stand in modules of their own beside this file (a folder's own
conftest.py would hide this one's names from ``from conftest import ...``): ``processes``
(``wait_until``, ``kill_when``, ``assert_gone``), ``kernels`` (``start_kernel``,
``shutdown_kernel``), ``clusters`` (``cluster_with``, ``REGRESSION``, ``watched``), ``paths``
(``ROOT``, ``ARTIFACTS``, ``data_dir_env``), ``labels``; ``lab``, ``netns`` and ``slurm`` start
a JupyterLab, hosts and a Slurm for the tests that need them.
"""

from __future__ import annotations

import background
import psutil
import pytest
from clusters import cluster_with
from front_end import FrontEnd
from kernels import shutdown_kernel, start_kernel
from paths import ROOT, data_dir_env
from processes import wait_until

#: Jupyter server fixtures (jp_fetch, jp_serverapp) for the server and sidebar tests.
pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture(scope="session", autouse=True)
def nbdist_data_dir(tmp_path_factory):
    """Every test run keeps its records in a fresh directory, never the user's."""
    with data_dir_env(tmp_path_factory.mktemp("nbdist-data")) as path:
        yield path


@pytest.fixture
def no_front_end(monkeypatch):
    """``IPython.display.display`` with no front end to show things: dashboards are built and
    updated (their widgets too) and their display handles take the final picture. The
    ``front_end.FrontEnd`` it returns keeps what was shown (``shown``) and what its handle was
    sent (``handle.updates``)."""
    front = FrontEnd()
    monkeypatch.setattr("IPython.display.display", front)
    return front


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """This test's own nbdist data directory (run store, cluster records, profile)."""
    path = tmp_path / "nbdist-data"
    monkeypatch.setenv("NBDIST_DATA_DIR", str(path))
    return path


@pytest.fixture(scope="session", autouse=True)
def no_stray_processes():
    """After the whole suite, no process started by a test is still running."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield

    def strays():
        return [
            p
            for p in me.children(recursive=True)
            if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE
        ]

    try:
        wait_until(lambda: not strays(), 15, what="test processes to exit")
    except AssertionError:
        left = [(p.pid, " ".join(p.cmdline())[:80]) for p in strays()]
        for p in strays():
            p.kill()
        raise AssertionError(f"processes left behind by the tests: {left}") from None


@pytest.hookimpl(trylast=True)  # after -k and -m deselected what they do not want
def pytest_collection_modifyitems(session, config, items):
    """Tests that declare ``BESIDE = [command...]`` in their module (the benchmarks' smoke run)
    go last, and their command starts now, beside the suite at a small CPU weight
    (``tests/background.py``): by the time the test runs it has used the cores the other tests
    left idle, and the test only collects its outcome. Without such a cgroup here, the test
    runs its command itself, in turn."""
    beside = [item for item in items if getattr(item.module, "BESIDE", None)]
    for item in beside:
        items.remove(item)
        items.append(item)
        if item.module.__name__ not in background.RUNNING:
            started = background.start(item.module.BESIDE, ROOT, item.module.__name__)
            if started is not None:
                background.RUNNING[item.module.__name__] = started


def pytest_sessionfinish(session, exitstatus):
    """A command started beside the suite whose test never ran (the run stopped early: ``-x``,
    an interrupt) is killed with everything it started."""
    for started in background.RUNNING.values():
        started.kill()


@pytest.fixture(scope="module")
def cluster():
    """A real 2-engine nbdist cluster (Python API), stopped after the module's tests."""
    yield from cluster_with(2)


@pytest.fixture(scope="module")
def kernel():
    """A real IPython kernel with ``%load_ext nbdist`` done; shut down (and checked) after."""
    k = start_kernel()
    yield k
    shutdown_kernel(k)
