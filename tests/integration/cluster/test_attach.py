"""``%nbdist attach``: a notebook kernel uses a cluster that a cluster host (the sidebar's) holds.

A real host process (``python -m nbdist.host``) and a real kernel: attach, run collectives,
lose an engine and get a fresh one from the host, detach (the cluster runs on), attach again,
and stop the host (everything it started goes away).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import psutil
import pytest
from kernels import start_kernel
from processes import assert_gone, wait_until

from nbdist.records import registry

ALL_REDUCE = (
    "%%distributed\nimport torch\nz = torch.ones(1)\ntorch.distributed.all_reduce(z)\nz.item()"
)


@pytest.fixture(scope="module")
def host():
    proc = subprocess.Popen(
        [sys.executable, "-m", "nbdist.host", "--n", "2"], stdin=subprocess.DEVNULL
    )
    try:
        rec = wait_until(
            lambda: next(
                (r for r in registry.live() if r.pid == proc.pid and r.state == "running"), None
            ),
            120,
            what="the cluster host to be ready",
        )
        yield proc, rec
    finally:
        pids = [proc.pid]
        try:
            pids += [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=30)
        assert_gone(pids, timeout=30)


def error_line(res) -> str:
    assert res.error is not None, res.stdout
    return f"{res.error['ename']}: {res.error['evalue']}"


def test_attach_with_no_cluster_says_how_to_start_one(kernel):
    line = error_line(kernel.run("%nbdist attach"))
    assert line.startswith("UsageError: no cluster to attach to: start one from the nbdist sidebar")


def test_attach_runs_cells_on_the_hosts_engines(kernel, host):
    proc, rec = host
    res = kernel.run("%nbdist attach nbdist-nope")
    assert "no running cluster 'nbdist-nope'" in error_line(res)
    assert rec.cluster_id in error_line(res)  # it names the ones that run

    out = kernel.ok("%nbdist attach").stdout
    assert f"attached to {rec.cluster_id}, 2 ranks (gloo)" in out
    assert kernel.ok(ALL_REDUCE).result == "2.0"
    out = kernel.ok("%%distributed --all-output\nimport os\nprint('pid', os.getpid())").stdout
    assert {int(p) for p in re.findall(r"pid (\d+)", out)} == {s.pid for s in rec.slots}
    assert psutil.Process(proc.pid).children(recursive=True)  # the host, not the kernel, owns them
    assert not kernel.descendants()


def test_a_lost_engine_is_replaced_by_the_host(kernel, host):
    proc, rec = host
    victim = rec.slots[1].pid
    sent = kernel.submit("%%distributed\nimport time\ntime.sleep(30)")
    wait_until(lambda: psutil.Process(victim).status() != psutil.STATUS_ZOMBIE, 5)
    os.kill(victim, signal.SIGKILL)
    res = kernel.collect(sent, timeout=60)
    assert "rank 1" in error_line(res) and "killed by SIGKILL" in error_line(res)
    assert kernel.ok(ALL_REDUCE).result == "2.0"  # a fresh rank 1, from the host
    now = json.loads(registry.record_path(proc.pid).read_text())
    fresh = [e["pid"] for e in now["engines"] if e["pid"] not in {s.pid for s in rec.slots}]
    assert len(fresh) == 1 and psutil.pid_exists(fresh[0])


def test_detach_leaves_the_cluster_running_and_attach_again(kernel, host):
    proc, rec = host
    assert "detached; the cluster runs on" in kernel.ok("%nbdist stop").stdout
    assert registry.host_alive(proc.pid)
    assert kernel.ok("%nbdist attach").stdout.startswith("nbdist: attached")
    assert kernel.ok(ALL_REDUCE).result == "2.0"
    kernel.ok("%nbdist stop")


def test_one_notebook_at_a_time(kernel, host):
    """Two notebooks driving the same engines would deadlock each other's collectives: the
    second attach is refused in one line naming the holder, until it detaches or dies."""
    proc, rec = host
    kernel.ok("%nbdist attach")
    other = start_kernel()
    try:
        assert error_line(other.run("%nbdist attach")) == (
            f"UsageError: cluster {rec.cluster_id} is in use by another notebook (kernel pid "
            f"{kernel.pid}): run %nbdist stop there, or shut that kernel down, then attach"
        )
        kernel.ok("%nbdist stop")  # detached: the cluster is free
        assert other.ok("%nbdist attach").stdout.startswith("nbdist: attached")
        assert other.ok(ALL_REDUCE).result == "2.0"
        assert f"(kernel pid {other.pid})" in error_line(kernel.run("%nbdist attach"))
    finally:
        pids = [other.pid, *other.descendants()]
        other.kc.stop_channels()
        other.km.shutdown_kernel(now=True)  # SIGKILL: no exit handler runs
        assert_gone(pids, timeout=15)
    assert kernel.ok("%nbdist attach").stdout.startswith("nbdist: attached")  # freed by its end
    assert kernel.ok(ALL_REDUCE).result == "2.0"
    kernel.ok("%nbdist stop")


def test_the_host_refuses_more_engines_than_the_machine_takes(host):
    """The control socket's spawn is bounded like the sidebar's start: CPUs x 4, at least 8."""
    from nbdist.errors import NbdistError
    from nbdist.notebook.cluster.engines.hosted import ask
    from nbdist.records.limits import max_engines

    proc, rec = host
    high = max_engines()
    before = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    for n, words in [
        (10**6, f"whole number from 1 to {high}"),
        ("²", "not '²'"),
        (0, "not 0"),
        (high - 1, f"{high - 1} more engines would make {high + 1}, more than this machine's "),
    ]:
        with pytest.raises(NbdistError, match="the cluster host refused spawn") as e:
            ask(rec.socket, {"op": "spawn", "n": n}, timeout=30)
        assert words in str(e.value) and "\n" not in str(e.value)
    after = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    assert after <= before  # nothing was started


def test_stopping_the_host_stops_everything(host):
    proc, rec = host
    pids = [proc.pid] + [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert_gone(pids, timeout=30)
    assert not registry.record_path(proc.pid).exists()
    assert not registry.socket_path(proc.pid).exists()
