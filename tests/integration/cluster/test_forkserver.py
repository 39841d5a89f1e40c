"""The fork server: single-threaded when it forks, and the first to know of an engine's death."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import psutil
from kernels import shutdown_kernel, start_kernel
from processes import assert_gone, wait_until

import nbdist
from nbdist.errors import UsageError
from nbdist.launch.lifeline import identity
from nbdist.notebook.cluster.engines import forks


def test_the_fork_server_has_one_thread_and_reports_a_death_at_once():
    """A fork from a multi-threaded process can deadlock the child on a lock another thread
    held (Python 3.12 warns): the server runs one thread, and its loop still learns of a dead
    engine from SIGCHLD within milliseconds."""
    c = nbdist.start(n=1)
    pids = [p.pid for p in c.engines.processes()]
    try:
        server = psutil.Process(c.engines.server_pid)
        assert server.num_threads() == 1, [t.id for t in server.threads()]
        victim = c.slots[0].pid
        t0 = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        death = c.engines.exits.get(timeout=5)
        assert (death.pid, death.status) == (victim, -signal.SIGKILL)
        assert time.monotonic() - t0 < 1.0
        assert server.num_threads() == 1
        # a replacement is forked from the same server, and works
        c.replace([0])
        assert c.run("nbdist.rank()") == 0
    finally:
        c.stop()
    assert_gone(pids)


def test_every_death_is_reported_when_engines_die_as_fast_as_they_start(tmp_path):
    """Engines killed the moment they are forked, many at once: SIGCHLDs that arrive together
    merge into one, so the server's loop must collect every child that ended. Each death is
    reported exactly once, with its status; none is lost, none is left a zombie."""
    profile, log = tmp_path / "profile", tmp_path / "log"
    (profile / "security").mkdir(parents=True)
    log.mkdir()
    env = dict(os.environ, NBDIST_PARENT_PID=identity())
    server = subprocess.Popen(
        [sys.executable, "-m", "nbdist.launch.forkserver", "60"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in server.stdout], daemon=True).start()
    pids: list[int] = []
    exits: dict[int, list[int]] = {}

    def take(word: str) -> list[str]:
        while True:
            got = lines.get(timeout=60).split()
            if got[0] == "exit":
                exits.setdefault(int(got[1]), []).append(int(got[2]))
            if got[0] == word:
                return got

    try:
        server.stdin.write("cluster " + json.dumps([str(profile), "nbdist-none", str(log)]) + "\n")
        take("ready")
        for batch in (1, 8, 3, 16, 2, 10):  # 40 engines, forked in bursts
            server.stdin.write("spawn\n" * batch)
            server.stdin.flush()
            fresh = [int(take("pid")[1]) for _ in range(batch)]
            for pid in fresh:
                os.kill(pid, signal.SIGKILL)
            pids += fresh

        def all_reported() -> bool:
            while not lines.empty():
                take_now = lines.get_nowait().split()
                if take_now[0] == "exit":
                    exits.setdefault(int(take_now[1]), []).append(int(take_now[2]))
            return set(exits) >= set(pids)

        wait_until(all_reported, 30, what="a death report for every engine")
        assert {pid: exits[pid] for pid in pids} == {pid: [-signal.SIGKILL] for pid in pids}
        assert not psutil.Process(server.pid).children()  # no zombies
    finally:
        if server.poll() is None:
            server.stdin.write("exit\n")
            server.stdin.flush()
        server.wait(timeout=30)
        for stream in (server.stdin, server.stdout):
            stream.close()
    assert_gone(pids + [server.pid])


def test_a_new_engine_registers_without_waiting_for_a_heartbeat():
    """The controller beats every 30 s here, past the 20 s the engines get to register:
    ipyparallel's own monitor registers an engine only at the beat after its heart first
    answered, so this start (and the replacement after it) would time out.
    ``nbdist.launch.heart`` pings a heart as it subscribes and registers it at its answer."""
    c = nbdist.start(n=1, heartbeat_ms=30_000, start_timeout=20)
    pids = [p.pid for p in c.engines.processes()]
    try:
        c.replace([0])  # a fresh engine, registered within start_timeout as well
        assert c.run("nbdist.rank()") == 0
    finally:
        c.stop()
    assert_gone(pids)


# -- the spare started at %load_ext --------------------------------------------------------------

_ALL_REDUCE = (
    "%%distributed\nimport torch\nt = torch.ones(1)\ntorch.distributed.all_reduce(t)\nt.item()"
)
_WHO = "%%distributed --ranks 0\nimport os\nprint(os.getppid(), os.environ.get('NBDIST_TEST_MARK'))"


def _spare_of(k) -> int:
    """The fork server ``%load_ext nbdist`` started in kernel ``k``, once it is there."""

    def found():
        for pid in k.descendants():
            try:
                if "nbdist forkserver" in " ".join(psutil.Process(pid).cmdline()):
                    return pid
            except psutil.NoSuchProcess:
                pass
        return None

    return wait_until(found, 30, what="the spare fork server of %load_ext")


def test_the_spare_of_load_ext_forks_the_next_local_starts_controller_and_engines():
    k = start_kernel()
    try:
        spare = _spare_of(k)
        k.ok("from nbdist.notebook.cluster.engines import forks\nassert forks.spare_ready(60)")
        k.ok("%nbdist start -n 2")
        ppid, mark = k.ok(_WHO).stdout.split()[-2:]
        assert (int(ppid), mark) == (spare, "None")
        # the controller too: the spare's children are it and the two engines, nothing else
        controller = k.ok("import nbdist\nnbdist.current().engines._ipp.controller.pid").result
        children = {p.pid for p in psutil.Process(spare).children()}
        assert int(controller) in children and len(children) == 3, (controller, children)
        assert k.ok(_ALL_REDUCE).result == "2.0"
        k.ok("%nbdist stop")
        assert_gone([spare])
    finally:
        shutdown_kernel(k)


def test_a_spare_older_than_an_environment_change_is_closed_and_a_fresh_server_used():
    """Engines inherit the server's environment: one set in a cell after %load_ext (a
    CUDA_VISIBLE_DEVICES, an OMP_NUM_THREADS) must reach them, so that spare is not used."""
    k = start_kernel()
    try:
        spare = _spare_of(k)
        k.ok("import os; os.environ['NBDIST_TEST_MARK'] = 'set-later'")
        k.ok("%nbdist start -n 2")
        assert_gone([spare])
        ppid, mark = k.ok(_WHO).stdout.split()[-2:]
        assert int(ppid) != spare and mark == "set-later"
        k.ok("%nbdist stop")
    finally:
        shutdown_kernel(k)


def test_a_spare_nobody_claims_leaves_after_its_idle_time_and_is_reaped():
    server = forks.ForkServer(idle=1.0)
    pid = server.proc.pid
    # its imports first (a few seconds), then one idle second; reaped by its reader, unasked
    wait_until(lambda: not psutil.pid_exists(pid), 60, what="the unclaimed spare to leave")
    assert server.proc.returncode == 0
    server.wait()


def test_nbdist_prewarm_turns_the_spare_off_and_a_bad_value_is_one_line(monkeypatch):
    monkeypatch.setattr(forks, "_spare", None)
    monkeypatch.setenv("NBDIST_PREWARM", "0")
    forks.prewarm()
    assert forks._spare is None
    monkeypatch.setenv("NBDIST_PREWARM", "maybe")
    try:
        forks.prewarm()
    except UsageError as exc:
        assert str(exc) == (
            "NBDIST_PREWARM='maybe' is not understood: set it to 1 (a spare engine server at "
            "%load_ext, the default) or 0 (none)"
        )
    else:
        raise AssertionError("NBDIST_PREWARM=maybe was accepted")
    assert forks._spare is None


def test_a_server_whose_kernel_dies_during_its_imports_leaves_before_they_end():
    """A spare server imports torch for seconds (more on a busy machine) before its loop watches
    the kernel: a watcher thread covers those seconds, so it leaves at once, not once ready."""
    kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    server = None
    try:
        env = dict(os.environ, NBDIST_PARENT_PID=identity(kernel.pid))
        server = subprocess.Popen(
            [sys.executable, "-m", "nbdist.launch.forkserver", "600"],
            stdin=subprocess.PIPE,  # kept open: a closed stdin says the kernel is gone
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

        def importing_torch() -> bool:
            with open(f"/proc/{server.pid}/maps") as f:
                return "libtorch" in f.read()

        wait_until(importing_torch, 60, interval=0.01, what="the server to import torch")
        kernel.kill()
        kernel.wait()
        server.wait(timeout=60)
        said = server.stdout.read()
        assert "ready" not in said, "it finished its imports before it saw the kernel was gone"
    finally:
        kernel.kill()
        if server is not None:
            server.kill()
            server.wait()
