"""The kernel's end of the engine fork server (``nbdist.launch.forkserver``), and the spare one
started at ``%load_ext nbdist``.

Why a spare: the fork server's imports (torch, ipyparallel's engine) are most of a local start,
about 3 s of CPU. ``%load_ext nbdist`` starts one (``prewarm``), which imports while the person
reads and types; the next local start claims it (``take``) and forks engines at once, in well
under half the time. It is used only if it still fits: alive, and started with the kernel's
environment and working directory as they are now (engines inherit both from it, and a
``CUDA_VISIBLE_DEVICES`` or ``OMP_NUM_THREADS`` set in a cell must reach them); otherwise it
is closed and a fresh server is started, as without a spare. What it costs: one idle process
(about 300 MB) and 3 s of CPU once, in a kernel that loaded nbdist. A remote start closes it at
once (``discard``); unclaimed, it leaves by itself after ``SPARE_IDLE`` seconds, and with its
kernel at any time. ``NBDIST_PREWARM=0`` turns it off (``config.prewarm``).
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import psutil
from ipyparallel.cluster.launcher import LocalControllerLauncher, ProcessStateError
from traitlets import Any

from .... import config
from ....errors import NbdistError
from .base import EngineExit
from .processes import tie_to_this_process

#: Seconds an unclaimed spare waits for a start before it leaves (its memory back).
SPARE_IDLE = 600.0


class ForkServer:
    """A fork server process, not yet tied to a cluster until ``claim``."""

    def __init__(self, idle: float = SPARE_IDLE) -> None:
        tie_to_this_process()  # the server leaves with this kernel (``launch.lifeline``)
        self._env, self._cwd = dict(os.environ), os.getcwd()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nbdist.launch.forkserver", f"{idle:g}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # the notebook's interrupt is not for the engines
        )
        self.exits: queue.Queue[EngineExit] = queue.Queue()
        self.ended: dict[int, int] = {}  # pid -> exit status: how add_engines learns of a death
        self.controller_pid: int | None = None  # its end is not an engine's death
        self.cancelled: set[int] = set()  # forked for a request that timed out: killed, no engine
        self._ids = itertools.count(1)
        self._waiting: dict[int, queue.Queue[int]] = {}  # request id -> where its pid goes
        self._gone = False  # the server has ended: no answer will come
        self._lock = threading.Lock()  # the two above, between the reader and the requests
        self._ready = threading.Event()
        threading.Thread(target=self._read, name="nbdist-forkserver", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # to the server's end
            word, *rest = line.split() or [""]
            if word == "ready":
                self._ready.set()
            elif word == "pid":  # said before any exit of that process: an old pid's is stale
                self.ended.pop(int(rest[0]), None)
                self._answered(int(rest[0]), int(rest[1]))
            elif word == "exit":
                pid = int(rest[0])
                self.ended[pid] = int(rest[1])
                if pid != self.controller_pid and pid not in self.cancelled:
                    self.exits.put(EngineExit(pid, int(rest[1])))
                self.cancelled.discard(pid)
        self._ready.set()  # the server is gone: wake anyone waiting
        with self._lock:  # and a fork asked for will not come
            self._gone = True
            for waiting in self._waiting.values():
                waiting.put(-1)
        self.proc.wait()  # and reaped, whoever holds it (a spare that left unclaimed too)

    def _answered(self, pid: int, ident: int) -> None:
        """The server forked ``pid`` for request ``ident``: its answer, unless that request
        timed out (the server kills that one: ``cancel``)."""
        with self._lock:
            waiting = self._waiting.pop(ident, None)
            if waiting is None:
                self.cancelled.add(pid)
            else:
                waiting.put(pid)

    def ready(self) -> bool:
        """Whether the server has done its imports (and is running): it forks at once."""
        return self._ready.is_set() and self.proc.poll() is None

    def fits(self) -> bool:
        """Whether engines forked now would start as from a fresh server: it is running, and
        this process's environment and working directory are those it was started with."""
        return self.proc.poll() is None and self._env == os.environ and self._cwd == os.getcwd()

    def claim(self, profile: Path, cluster_id: str, log_dir: Path) -> None:
        """Tie the server to a cluster: the engines it forks join ``cluster_id``."""
        try:
            self._send("cluster " + json.dumps([str(profile), cluster_id, str(log_dir)]))
        except OSError:  # the server is gone already: the first spawn says so
            pass

    def spawn(self, timeout: float) -> int:
        """Fork one engine, once the server has done its imports; its pid."""
        if not self._ready.wait(timeout) or self.proc.poll() is not None:
            raise NbdistError("the engine fork server did not start (see the engine logs)")
        return self._fork("spawn", timeout)

    def fork_controller(self, spec: dict, timeout: float) -> int:
        """Fork the cluster's controller (``spec``: see ``ForkedController``) as soon as the
        server has imported what it runs, before torch; its pid."""
        self.controller_pid = self._fork("controller " + json.dumps(spec), timeout)
        return self.controller_pid

    def _fork(self, request: str, timeout: float) -> int:
        """Send ``request`` under a fresh id and wait for its own answer: a late one (this
        request timed out) is never taken for another's, and its process is killed."""
        ident, answer = next(self._ids), queue.Queue(1)
        word, _, rest = request.partition(" ")
        with self._lock:
            gone = self._gone
            self._waiting[ident] = answer
        try:
            if not gone:
                self._send(f"{word} {ident} {rest}".rstrip())
            pid = -1 if gone else answer.get(timeout=timeout)
        except OSError:
            pid = -1
        except queue.Empty:
            with self._lock:
                unanswered = self._waiting.pop(ident, None) is not None
            if unanswered:
                self._cancel(ident)
                raise NbdistError(
                    f"the engine fork server did not fork within {timeout:g} s (busy, or stuck: "
                    "see the engine logs)"
                ) from None
            pid = answer.get()  # answered between the timeout and the lock: in time after all
        finally:
            with self._lock:
                self._waiting.pop(ident, None)
        if pid < 0:
            raise NbdistError("the engine fork server stopped (see the engine logs)")
        return pid

    def _cancel(self, ident: int) -> None:
        try:
            self._send(f"cancel {ident}")
        except OSError:  # the server is gone, and what it forked with it
            pass

    def warm(self) -> None:
        """Ask the server to import what a first training cell imports (it does between
        spawns), so that a replacement engine forked later has it."""
        try:
            self._send("warm")
        except OSError:  # the server is gone: spawns will say so
            pass

    def _send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        """Ask the server to leave: it reaps its engines (told to leave) and goes; its last
        words still reach ``exits``. Whoever stops it waits for it (``wait``)."""
        if self.proc.poll() is None:
            try:
                self._send("exit")
            except OSError:
                self.proc.kill()
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def wait(self, timeout: float | None = None) -> None:
        """The server has gone (reaped by the stop): let Popen know, and close its output."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()  # the reader has read to its end


class ForkedController(LocalControllerLauncher):
    """ipyparallel's launcher of a local controller, the process forked by the fork server
    (whose imports it shares) instead of started afresh: ipyparallel's own imports are 1.2-1.5 s
    of a fresh controller's start. A server still importing forks it as soon as it has those
    imports, before torch's. It is watched, signalled and stopped as ipyparallel does the one
    it starts (by pid, with psutil); the fork server reaps it."""

    server = Any(help="the ForkServer that forks the controller")

    def start(self) -> None:
        if self.state != "before":
            raise ProcessStateError(f"the controller was started already ({self.state})")
        spec = {
            "args": self.find_args()[len(self.controller_cmd) :],
            "env": self.get_env(),
            "cwd": os.path.abspath(self.work_dir),
            "log": self.output_file,
        }
        self.pid = self.server.fork_controller(spec, timeout=60.0)
        self.process = psutil.Process(self.pid)
        self.notify_start(self.pid)
        self._start_waiting()


_spare: ForkServer | None = None
_lock = threading.Lock()


def prewarm() -> None:
    """Start a spare fork server now, unless one is running or ``NBDIST_PREWARM=0``."""
    global _spare
    with _lock:
        if config.prewarm() and (_spare is None or _spare.proc.poll() is not None):
            _spare = ForkServer()


def spare_ready(timeout: float) -> bool:
    """Wait up to ``timeout`` s for the spare to finish its imports; False if there is none
    (benchmarks time a start made once it is ready, as after a person's pause)."""
    server = _spare
    return server is not None and server._ready.wait(timeout) and server.ready()


def take(profile: Path, cluster_id: str, log_dir: Path) -> ForkServer:
    """A fork server for a new local cluster: the spare if it still fits (see ``fits``), else
    a fresh one; either way claimed for ``cluster_id``."""
    global _spare
    with _lock:
        server, _spare = _spare, None
    if server is None or not server.fits():
        if server is not None:
            _close(server)
        server = ForkServer()
    server.claim(profile, cluster_id, log_dir)
    return server


def discard() -> None:
    """Close the spare, if any: the cluster being started is not local."""
    global _spare
    with _lock:
        server, _spare = _spare, None
    if server is not None:
        _close(server)


def _close(server: ForkServer) -> None:
    """A spare never claimed has forked nothing: killed at once, even in the middle of its
    imports (asked to leave, it would hear only after them); its reader reaps it."""
    server.proc.kill()
    try:
        server.proc.stdin.close()
    except OSError:
        pass
