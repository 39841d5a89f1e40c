"""``HostedEngines``: engines that a cluster host holds (the sidebar's "Start cluster"), used
from this kernel (an ``EngineSet`` that owns nothing: ``stop`` only disconnects).

The host (``nbdist.server.host``) is asked for more engines, and tells of engine deaths, over
its control socket (owner-only, beside its record): one JSON line a request.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from pathlib import Path

import ipyparallel as ipp
import psutil

from ...config import ClusterConfig
from ...errors import NbdistError
from ...protocol import HostRecord
from .base import EngineExit, OnThisMachine
from .processes import close_quietly


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
        self.engine_pids: set[int] = {s.pid for s in record.slots}
        self.exits = queue.Queue()
        self.client = None
        self._watch: socket.socket | None = None

    def start(self) -> ipp.Client:
        """Connect to the controller and the host; the client once it sees every rank's engine.
        Raises OSError or TimeoutError when the host or its engines cannot be reached."""
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
        procs = []
        for pid in self.engine_pids:
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        return procs

    def stop(self, timeout: float = 5.0) -> None:
        """Disconnect; the engines keep running for the host."""
        close_quietly(self.client)
        self.client = None
        if self._watch is not None:
            try:
                self._watch.close()
            except OSError:
                pass
