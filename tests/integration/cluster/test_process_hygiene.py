"""Signals reach only the process first seen under a pid, and a process ties itself only to the
kernel that started it: never to a later process given the kernel's pid, nor to a pid that a
scheduler carried to another machine.

Pid reuse is made to happen, not waited for: as root, ``/proc/sys/kernel/ns_last_pid`` sets the
pid the next process gets (skipped where that is not allowed).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from processes import assert_gone, wait_until

from nbdist.launch import lifeline as _lifeline
from nbdist.notebook.cluster.engines.processes import Pids, signal_own, tree

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "600"])


def ended(p: subprocess.Popen) -> int:
    """End ``p`` (ours, by its Popen) and collect it; its pid is free for reuse."""
    p.kill()
    return p.wait(timeout=10)


def reuse(pid: int, after: float) -> subprocess.Popen:
    """A new process with the pid ``pid`` (whose process has ended and been collected), started
    a few clock ticks after ``after`` (``time.monotonic()`` once the first one had started), as
    a real reuse is: the pid numbers go round before one comes back."""
    wait_until(lambda: time.monotonic() > after + 0.05, 5, interval=0.01, what="a clock tick")
    for _ in range(50):  # another process on the machine may take the pid first: try again
        try:
            with open(NS_LAST_PID, "w") as f:
                f.write(str(pid - 1))
        except OSError as e:
            pytest.skip(f"cannot choose the next pid here ({e.strerror})")
        p = sleeper()
        if p.pid == pid:
            return p
        ended(p)
    pytest.skip(f"pid {pid} was never given to our new process")


def test_pids_remember_the_process_first_seen():
    a, b = sleeper(), sleeper()
    try:
        pids = Pids([a.pid])
        pids.add(b.pid)
        assert pids == {a.pid, b.pid} and isinstance(pids, set)
        assert pids.process(a.pid).create_time() == psutil.Process(a.pid).create_time()
        pids.difference_update([a.pid])
        assert pids == {b.pid} and pids.process(a.pid) is None
        pids.discard(b.pid)
        assert not pids and pids.process(b.pid) is None
        pids.add(a.pid)
        pids.clear()
        assert pids.process(a.pid) is None
    finally:
        ended(a)
        ended(b)


def test_a_signal_never_reaches_a_process_that_reused_an_engines_pid():
    engine = sleeper()
    born = time.monotonic()
    own = Pids([engine.pid])
    ended(engine)
    stranger = reuse(engine.pid, born)
    try:
        signal_own([engine.pid], own, signal.SIGKILL)  # what retire() and the supervisor do
        assert [p.pid for p in tree(own)] == []  # the stranger is not counted as ours
        stranger.terminate()
        assert stranger.wait(timeout=10) == -signal.SIGTERM  # ours came first: not sent
        fresh = sleeper()
        own.add(fresh.pid)
        signal_own([fresh.pid], own, signal.SIGKILL)  # a process of ours still gets it
        assert fresh.wait(timeout=10) == -signal.SIGKILL
    finally:
        if stranger.poll() is None:
            ended(stranger)


def test_the_same_holds_when_both_start_within_one_clock_tick():
    """psutil tells processes apart by start time, to the clock tick; a pidfd tells them apart
    always (Linux 5.3+), which is what Pids uses where it can."""
    if not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfd on this system")
    engine = sleeper()
    own = Pids([engine.pid])
    ended(engine)
    stranger = reuse(engine.pid, 0.0)  # at once: likely within the same tick
    try:
        signal_own([engine.pid], own, signal.SIGKILL)
        assert tree(own) == [] and own.process(engine.pid) is None
        stranger.terminate()
        assert stranger.wait(timeout=10) == -signal.SIGTERM
    finally:
        if stranger.poll() is None:
            ended(stranger)


LIFELINE = "import time, nbdist.launch.lifeline as l; l.exit_with_parent(0.05); time.sleep(600)"


def with_lifeline(parent: str) -> subprocess.Popen:
    env = dict(os.environ, NBDIST_PARENT_PID=parent)
    return subprocess.Popen([sys.executable, "-c", LIFELINE], env=env)


def test_a_process_whose_kernel_is_gone_leaves_even_when_the_pid_is_taken():
    """A controller or engine that starts after its kernel died, when the kernel's pid already
    names another process, leaves at once instead of living as long as that stranger."""
    kernel = sleeper()
    born = time.monotonic()
    named = _lifeline.identity(kernel.pid)
    ended(kernel)
    stranger = reuse(kernel.pid, born)
    child = with_lifeline(named)
    try:
        wait_until(lambda: child.poll() is not None, 30, what="the orphan to leave")
        assert stranger.poll() is None
    finally:
        ended(stranger)
        if child.poll() is None:
            ended(child)
    assert_gone([child.pid])


def test_a_process_leaves_with_its_kernel():
    kernel = sleeper()
    child = with_lifeline(_lifeline.identity(kernel.pid))
    try:
        wait_until(lambda: child.poll() is None and _has_watcher(child.pid), 30, what="start")
        ended(kernel)
        wait_until(lambda: child.poll() is not None, 30, what="the child to follow its kernel")
    finally:
        if child.poll() is None:
            ended(child)


def _has_watcher(pid: int) -> bool:
    try:
        return psutil.Process(pid).num_threads() >= 2  # the lifeline's watcher thread
    except psutil.NoSuchProcess:
        return False


def test_a_kernel_named_on_another_machine_ties_nothing(monkeypatch):
    """Slurm and mpiexec carry the environment to other hosts: there the pid means nothing, so
    the process is tied to no kernel (heartbeats cover remote engines)."""
    me = _lifeline.identity()
    pid, _boot, start = me.split()
    monkeypatch.setenv("NBDIST_PARENT_PID", f"{pid} another-machines-boot-id {start}")
    assert _lifeline.parent_check() is None
    monkeypatch.setenv("NBDIST_PARENT_PID", pid)  # the old form: a bare pid
    assert _lifeline.parent_check() is None
    monkeypatch.setenv("NBDIST_PARENT_PID", me)
    kernel = _lifeline.parent_check()
    assert kernel.alive() is True
    assert kernel.fd is not None  # Linux: the end is waited for on a pidfd, with no timer


def test_a_clusters_processes_name_their_kernel_fully(cluster):
    """The controller, the fork server and the engines carry the kernel's identity."""
    expected = _lifeline.identity(os.getpid())
    procs = cluster.engines.processes()
    assert len(procs) >= 3  # controller, fork server, engine (and their helpers)
    for p in procs:
        assert p.environ().get("NBDIST_PARENT_PID") == expected, p.cmdline()


def test_a_stop_leaves_nothing_running_when_it_returns(tmp_path, monkeypatch):
    """Every process is told at once and reaped before ``stop`` returns: no engine, scheduler
    or server left to end later, and none a zombie for init to collect. The bound only catches
    a stop gone badly wrong (it takes a fraction of a second: ``benchmarks/bench_cluster.py``)."""
    from nbdist.config import ClusterConfig
    from nbdist.notebook.session import Cluster

    monkeypatch.setenv("NBDIST_DATA_DIR", str(tmp_path))
    cluster = Cluster(ClusterConfig(n=2))  # beside the module's cluster, not the current one
    cluster.start()
    cluster.run("x = 1")
    procs = cluster.engines.processes()
    assert len(procs) >= 4  # controller and its schedulers, fork server, engines
    t0 = time.monotonic()
    cluster.stop()
    took = time.monotonic() - t0
    left = [p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert left == []
    zombies = [p.pid for p in procs if p.is_running()]  # a zombie still "runs" until collected
    assert zombies == []
    assert took < 3.0, f"stop took {took:.1f} s"
