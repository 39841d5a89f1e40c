"""Shared fixtures: real clusters, real kernels, and a check that no process outlives the tests."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import background
import numpy as np
import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Jupyter server fixtures (jp_fetch, jp_serverapp) for the server and sidebar tests.
pytest_plugins = ["pytest_jupyter.jupyter_server"]

# An imbalanced label set: 1000 rows, classes of 700, 200, 77, 20 and 3 rows.
IMBALANCED = np.repeat(np.arange(5), [700, 200, 77, 20, 3])


def within_one_per_class(labels: np.ndarray, parts: list[np.ndarray], world: int) -> None:
    """Each part holds each class's rows within one of count / world."""
    for c, count in zip(*np.unique(labels, return_counts=True), strict=True):
        got = [int((p == c).sum()) for p in parts]
        assert all(abs(g - count / world) < 1 for g in got), (c, count, got)


def wait_until(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it is truthy; fail the test with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def kill_when(flag, pid: int, timeout: float = 60.0) -> threading.Event:
    """From a thread: SIGKILL ``pid`` once the file ``flag`` exists (a rank reached the step to
    die at, and wrote it); the event is set once the signal is sent."""
    killed = threading.Event()

    def _kill() -> None:
        wait_until(flag.exists, timeout, what="the rank to reach the step to die at")
        os.kill(pid, signal.SIGKILL)
        killed.set()

    threading.Thread(target=_kill, daemon=True).start()
    return killed


def assert_gone(procs, timeout: float = 10.0) -> None:
    """Every process in ``procs`` (pids, or psutil.Process objects, which also tell a reused pid
    from the process first seen) has exited; zombies count as gone."""
    procs = [p if isinstance(p, psutil.Process) else _process(p) for p in procs]
    procs = [p for p in procs if p is not None]

    def alive(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def gone():
        return not any(alive(p) for p in procs)

    try:
        wait_until(gone, timeout, what="processes to exit")
    except AssertionError:
        left = [(p.pid, " ".join(p.cmdline())[:100]) for p in procs if alive(p)]
        raise AssertionError(f"still running after {timeout} s: {left}") from None


def watched(cluster, source: str, opts=None, **kw):
    """The watch ``%%distributed`` gives ``source`` on ``cluster`` (the run store, the board,
    what ``opts`` asks for; ``kw``: ``assemble``'s, such as ``cfg``, ``store_at``, ``extra``):
    hand it to ``cluster.run(..., watch=)``, which closes it at the run's end."""
    from nbdist.config import CellOptions
    from nbdist.notebook.run.observers.assembly import assemble

    ranks = [s.rank for s in cluster.slots]
    return assemble(source, opts or CellOptions(), ranks, **kw)


def board_of(watch):
    """The live dashboard's observer of a watched run (``.dashboard``, ``.latencies``)."""
    from nbdist.notebook.run.observers.dashboard import Board

    return watch.find(Board)


def store_of(watch):
    """The run store a watched run is kept in."""
    from nbdist.notebook.run.observers.store import RunRecord

    return watch.find(RunRecord).writer.store


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


@pytest.fixture(scope="session", autouse=True)
def nbdist_data_dir(tmp_path_factory):
    """Every test run keeps its records in a fresh directory, never the user's."""
    with data_dir_env(tmp_path_factory.mktemp("nbdist-data")) as path:
        yield path


@pytest.fixture
def no_front_end(monkeypatch):
    """``IPython.display.display`` with no front end to show things: dashboards are built and
    updated (their widgets too) and their display handles take the final picture."""

    class _Handle:
        def update(self, *args, **kwargs):
            pass

    monkeypatch.setattr("IPython.display.display", lambda *a, **k: _Handle())


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """This test's own nbdist data directory (run store, cluster records, profile)."""
    path = tmp_path / "nbdist-data"
    monkeypatch.setenv("NBDIST_DATA_DIR", str(path))
    return path


@contextlib.contextmanager
def data_dir_env(path):
    """``NBDIST_DATA_DIR`` set to ``path`` (for this process and what it starts), then restored."""
    old = os.environ.get("NBDIST_DATA_DIR")
    os.environ["NBDIST_DATA_DIR"] = str(path)
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop("NBDIST_DATA_DIR", None)
        else:
            os.environ["NBDIST_DATA_DIR"] = old


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
    import nbdist

    c = nbdist.start(n=2)
    pids = [p.pid for p in c.engines.processes()]
    yield c
    c.stop()
    assert_gone(pids)


# -- a real IPython kernel, driven as a notebook front end drives it ---------------------------


@dataclass
class CellResult:
    stdout: str = ""
    stderr: str = ""
    result: str | None = None  # text/plain of the cell's value
    error: dict | None = None  # {"ename", "evalue", "traceback"}
    displays: list = field(default_factory=list)
    seconds: float = 0.0
    # displays updated in place: display id -> each text/plain it showed, in order
    in_place: dict = field(default_factory=dict)


class Kernel:
    """A live kernel with nbdist loaded; ``run`` executes a cell and returns what it showed."""

    def __init__(self, km, kc):
        self.km, self.kc = km, kc

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def run(self, code: str, timeout: float = 120, interrupt_after: float | None = None):
        """Execute ``code`` and wait for it (optionally pressing interrupt after some seconds)."""
        return self.collect(self.submit(code), timeout, interrupt_after)

    def submit(self, code: str) -> tuple[str, float]:
        """Send a cell without waiting; ``collect`` its result later."""
        return self.kc.execute(code), time.monotonic()

    def collect(self, sent: tuple[str, float], timeout: float = 120, interrupt_after=None):
        msg_id, t0 = sent
        res = CellResult()
        interrupted = False
        deadline = t0 + timeout
        while True:
            if interrupt_after is not None and not interrupted:
                if time.monotonic() - t0 > interrupt_after:
                    self.km.interrupt_kernel()
                    interrupted = True
            try:
                msg = self.kc.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise AssertionError(f"cell {msg_id} did not finish in {timeout} s") from None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    res.stdout += content["text"]
                else:
                    res.stderr += content["text"]
            elif kind == "execute_result":
                res.result = content["data"].get("text/plain")
            elif kind in ("display_data", "update_display_data"):
                if kind == "display_data":
                    res.displays.append(content["data"])
                shown_id = content.get("transient", {}).get("display_id")
                if shown_id is not None and "text/plain" in content["data"]:
                    res.in_place.setdefault(shown_id, []).append(content["data"]["text/plain"])
            elif kind == "error":
                res.error = content
            elif kind == "status" and content["execution_state"] == "idle":
                break
        res.seconds = time.monotonic() - t0
        return res

    def ok(self, code: str, timeout: float = 120) -> CellResult:
        """Run a cell that must succeed."""
        res = self.run(code, timeout)
        assert res.error is None, "\n".join(res.error["traceback"])
        return res

    def descendants(self) -> list[int]:
        try:
            return [p.pid for p in psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


def start_kernel() -> Kernel:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env=dict(os.environ))
    k = Kernel(km, kc)
    k.ok("%load_ext nbdist")
    return k


def shutdown_kernel(k: Kernel) -> None:
    pids = k.descendants() + [k.pid]
    k.kc.stop_channels()
    k.km.shutdown_kernel(now=False)
    assert_gone(pids, timeout=15)


@pytest.fixture(scope="module")
def kernel():
    """A real IPython kernel with ``%load_ext nbdist`` done; shut down (and checked) after."""
    k = start_kernel()
    yield k
    shutdown_kernel(k)


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


#: A small regression task for tests of how ranks sync, run on every rank: ``make_net()`` the same
#: small MLP on every rank, ``batches(steps, rank)`` each rank's own batches of 8 samples, one
#: per step, of ``y = sum(x) + noise``.
REGRESSION = """
import torch, torch.nn as nn, torch.nn.functional as F

def make_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

def batches(steps, rank, b=8):
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(steps, b, 8, generator=g)
    return x, x.sum(-1, keepdim=True) + 0.1 * torch.randn(steps, b, 1, generator=g)
"""


def cluster_with(n: int, source: str):
    """A real cluster of ``n`` engines with ``source`` run on every rank (a generator, for a
    fixture or ``contextlib.closing``: yields it, then stops it and checks that its engines are
    gone)."""
    import nbdist

    c = nbdist.start(n=n)
    pids = [p.pid for p in c.engines.processes()]
    try:
        c.run(source)
        yield c
    finally:  # also when the generator is closed early (a test that failed)
        c.stop()
        assert_gone(pids)
