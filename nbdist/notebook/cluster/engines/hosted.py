"""``HostedEngines``: engines that a cluster host holds (the sidebar's "Start cluster"), used
from this kernel (an ``EngineSet`` that owns nothing: ``stop`` only disconnects).

The host (``nbdist.host``) is asked for more engines, and tells of engine deaths, over
its control socket (owner-only, beside its record): one JSON line a request.

One notebook at a time: two kernels driving the same engines would deadlock each other's
collectives. ``start`` takes the cluster's lease (``Lease``) and ``stop`` gives it back; the
operating system gives it back when the kernel exits, however it exits.

A host that dies without a word (SIGKILL, the OOM killer) cannot remove its record, socket and
lease file: the attached kernel, which sees its control connection end, closes its end of both
and removes the host's files (``host_gone`` is then set).
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import socket
import threading
import time
from pathlib import Path

import ipyparallel as ipp
import psutil

from ....config import ClusterConfig
from ....errors import NbdistError, UsageError
from ....records import registry
from ....records.host import HostRecord
from .base import EngineExit, OnThisMachine
from .processes import Pids, close_quietly


def ask(path: str, request: dict, timeout: float) -> dict:
    """One request to a cluster host's control socket; its JSON reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall((json.dumps(request) + "\n").encode())
        reply = json.loads(s.makefile("r").readline() or "{}")
    if "error" in reply:
        raise NbdistError(f"the cluster host refused {request['op']}: {reply['error']}")
    return reply


class Lease:
    """This kernel's exclusive use of the cluster a host holds: an ``flock`` on a file beside the
    host's record, naming the kernel's pid, held until ``release`` or the kernel's exit."""

    def __init__(self, record: HostRecord):
        path = registry.lease_path(record.pid)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited by child processes
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise UsageError(
                f"cluster {record.cluster_id} is in use by another notebook (kernel pid "
                f"{holder}): run %nbdist stop there, or shut that kernel down, then attach"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd: int | None = fd

    def release(self) -> None:
        """Give the cluster back (the next notebook may attach)."""
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the lock
            self._fd = None


class HostedEngines(OnThisMachine):
    """The engines of the cluster ``record`` describes; the host keeps ownership."""

    cfg: ClusterConfig
    cluster_id: str
    log_dir: Path
    owns_engines = False  # the host's: %nbdist stop only disconnects
    exits: queue.Queue[EngineExit]
    client: ipp.Client | None

    def __init__(self, record: HostRecord):
        if record.cluster_id is None:
            raise ValueError("HostedEngines needs the record of a running cluster")
        self.record = record
        self.cfg = ClusterConfig(
            n=record.n, threads_per_engine=record.threads, ip=record.ip, backend=record.backend
        )
        self.cluster_id = record.cluster_id
        self.log_dir = Path(record.log_dir)
        self.host_pid = record.pid
        self.engine_pids = Pids(s.pid for s in record.slots)
        self.exits = queue.Queue()
        self.client = None
        self.host_gone = threading.Event()  # the host died: its socket, lease and files dropped
        self._watch: socket.socket | None = None
        self._lease: Lease | None = None
        self._closing = threading.Lock()  # stop and the watch's end close the same descriptors

    def start(self) -> ipp.Client:
        """Take the cluster's lease, connect to the controller and the host; the client once it
        sees every rank's engine. Raises a one-line UsageError when another notebook holds the
        cluster, OSError or TimeoutError when the host or its engines cannot be reached."""
        self._lease = Lease(self.record)
        self._watch = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._watch.connect(self.record.socket)
            self._watch.sendall(b'{"op": "watch"}\n')
            threading.Thread(
                target=self._read_exits, name="nbdist-attach-exits", daemon=True
            ).start()
            self.client = ipp.Client(
                profile_dir=self.record.profile_dir, cluster_id=self.cluster_id
            )
            self.client.wait_for_engines(len(self.record.slots), timeout=self.cfg.start_timeout)
        except BaseException:
            self.stop()
            raise
        return self.client

    def _read_exits(self) -> None:
        try:
            for line in self._watch.makefile("r"):
                msg = json.loads(line)
                self.exits.put(EngineExit(int(msg["exit"]), int(msg["status"])))
        except (OSError, ValueError):
            pass  # the host or this kernel closed the connection
        if not registry.host_alive(self.host_pid):  # killed: it left all behind
            self._disconnect()
            registry.remove(self.host_pid)
            self.host_gone.set()

    def _disconnect(self) -> None:
        """Close the control connection and give the lease back (once, from either thread)."""
        with self._closing:
            if self._watch is not None:
                try:  # a close alone waits for the reader's file: the host would never know
                    self._watch.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # never connected, or the host is gone
                self._watch.close()
            if self._lease is not None:
                self._lease.release()
                self._lease = None

    def add_engines(self, n: int, known: set[int]) -> list[int]:
        """Ask the host for ``n`` more engines; return their ids once this client sees them."""
        timeout = self.cfg.start_timeout
        reply = ask(self.record.socket, {"op": "spawn", "n": n}, timeout)
        self.engine_pids.update(reply["pids"])
        ids = [i for i in reply["ids"] if i not in known]
        deadline = time.monotonic() + timeout
        while not set(ids) <= set(self.client.ids):
            if time.monotonic() > deadline:
                raise NbdistError(
                    f"engines {ids} did not reach this notebook; their logs: {self.log_dir}"
                )
            time.sleep(0.02)
        return ids

    def processes(self) -> list[psutil.Process]:
        """The engine processes (the host, its controller and fork server are not ours)."""
        return [p for pid in self.engine_pids if (p := self.engine_pids.process(pid))]

    def stop(self, timeout: float = 5.0) -> None:
        """Disconnect and give the lease back; the engines keep running for the host."""
        close_quietly(self.client)
        self.client = None
        self._disconnect()
