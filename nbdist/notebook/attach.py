"""``nbdist.attach()``: use, from this notebook, a cluster that a cluster host holds.

A cluster started from the sidebar lives in its own process (``nbdist.server.host``): its
engines already have their ranks and their process group. Attaching connects this kernel's
ipyparallel client to that cluster and builds an ordinary ``session.Cluster`` around it, so
``%%distributed`` cells, failure handling and engine replacement work as on a cluster this
kernel started. The host keeps ownership: ``%nbdist stop`` here only disconnects; the sidebar's
stop button (or the host's end) stops the engines.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import threading
import time
from pathlib import Path

import ipyparallel as ipp
import psutil

from .. import config
from ..errors import NbdistError, UsageError
from ..server import registry
from . import placement, session
from .cluster import EngineExit, signal_own


def _ask(path: str, request: dict, timeout: float) -> dict:
    """One request to the host's control socket; its JSON reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall((json.dumps(request) + "\n").encode())
        reply = json.loads(s.makefile("r").readline() or "{}")
    if "error" in reply:
        raise NbdistError(f"the cluster host refused {request['op']}: {reply['error']}")
    return reply


class HostedEngines:
    """EngineCluster's interface for engines a cluster host owns: this kernel only connects."""

    hosted = True

    def __init__(self, record: dict, timeout: float):
        self.cluster_id: str = record["cluster_id"]
        self.log_dir = Path(record["log_dir"])
        self.host_pid: int = record["pid"]
        self._socket = record["socket"]
        self._timeout = timeout
        self.engine_pids: set[int] = {s["pid"] for s in record["slots"]}
        self.exits: queue.Queue[EngineExit] = queue.Queue()
        self._watch = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._watch.connect(self._socket)
        self._watch.sendall(b'{"op": "watch"}\n')
        threading.Thread(target=self._read_exits, name="nbdist-attach-exits", daemon=True).start()
        self.client: ipp.Client | None = ipp.Client(
            profile_dir=record["profile_dir"], cluster_id=self.cluster_id
        )
        try:
            self.client.wait_for_engines(len(record["slots"]), timeout=timeout)
        except BaseException:
            self.stop()
            raise

    def _read_exits(self) -> None:
        try:
            for line in self._watch.makefile("r"):
                msg = json.loads(line)
                self.exits.put(EngineExit(int(msg["exit"]), int(msg["status"])))
        except (OSError, ValueError):
            pass  # the host or this kernel closed the connection

    def add_engines(self, n: int, known: set[int]) -> list[int]:
        """Ask the host for ``n`` more engines; return their ids once this client sees them."""
        reply = _ask(self._socket, {"op": "spawn", "n": n}, self._timeout)
        self.engine_pids.update(reply["pids"])
        ids = [i for i in reply["ids"] if i not in known]
        deadline = time.monotonic() + self._timeout
        while not set(ids) <= set(self.client.ids):
            if time.monotonic() > deadline:
                raise NbdistError(
                    f"engines {ids} did not reach this notebook; their logs: {self.log_dir}"
                )
            time.sleep(0.02)
        return ids

    def signal(self, pids: list[int], sig: int = signal.SIGINT) -> None:
        """Send ``sig`` to these engine processes (the cluster's own only)."""
        signal_own(pids, self.engine_pids, sig)

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
        if self.client is not None:
            try:
                self.client.close()
            except Exception:
                pass
            self.client = None
        try:
            self._watch.close()
        except OSError:
            pass


def _engine_state() -> dict:
    """On an engine: who it is, and which rank it holds in which group (None before any)."""
    import socket

    from nbdist.worker import context, rendezvous

    try:
        info = context.current().as_dict()
    except Exception:
        info = None
    return {"pid": os.getpid(), "host": socket.gethostname(), "info": info,
            "formed": rendezvous.is_formed()}


def _slots_from_engines(client, n: int, timeout: float) -> tuple[list[placement.Slot], int, bool]:
    """The ranks as the engines themselves hold them (an earlier notebook may have replaced
    some): slots, the latest attempt, and whether the group stands on every rank."""
    ars = {eid: client[eid].apply_async(_engine_state) for eid in client.ids}
    held: dict[int, list[tuple[int, dict]]] = {}
    for eid, ar in ars.items():
        try:
            st = ar.get(timeout)
        except Exception:
            continue  # an engine that died a moment ago
        info = st["info"]
        if info is not None and info["world_size"] == n:
            held.setdefault(info["rank"], []).append((eid, st))
    if sorted(held) != list(range(n)) or any(len(v) != 1 for v in held.values()):
        raise NbdistError(
            f"the engines do not hold ranks 0..{n - 1} one each (they hold {sorted(held)}): "
            "stop this cluster from the sidebar and start a new one"
        )
    slots, attempts, formed = [], set(), True
    for rank in range(n):
        eid, st = held[rank][0]
        info = st["info"]
        slots.append(placement.Slot(
            rank=rank, engine_id=eid, host=st["host"], pid=st["pid"],
            local_rank=info["local_rank"], local_world_size=info["local_world_size"],
            group_rank=info["group_rank"], device=info["device"],
        ))
        attempts.add(info["attempt"])
        formed = formed and st["formed"]
    return slots, max(attempts), formed and len(attempts) == 1


def attach(cluster_id: str | None = None) -> session.Cluster:
    """Connect this notebook to the running cluster ``cluster_id`` (default: the newest one
    started from the sidebar) and make it the current cluster."""
    if session.current(required=False) is not None:
        raise UsageError("a cluster is already in use here: %nbdist stop first, then attach")
    t0 = time.perf_counter()
    rec = registry.find(cluster_id)
    cfg = config.ClusterConfig(
        n=rec["n"], threads_per_engine=rec["threads"], ip=rec["ip"], backend=rec["backend"]
    )
    cluster = session.Cluster(cfg)
    try:
        engines = HostedEngines(rec, timeout=cfg.start_timeout)
    except (OSError, TimeoutError) as exc:
        raise NbdistError(f"cannot reach cluster {rec['cluster_id']}: {exc}") from exc
    cluster.engines = engines
    try:
        slots, attempt, formed = _slots_from_engines(engines.client, cfg.n, cfg.start_timeout)
    except BaseException:
        engines.stop()
        raise
    engines.engine_pids = {s.pid for s in slots}
    known = {int(k): v for k, v in rec["inventory"].items()}
    cluster.slots = slots
    cluster.inventory = {
        s.engine_id: known.get(s.engine_id) or {"host": s.host, "pid": s.pid} for s in slots
    }
    cluster.backend = rec["backend"]
    cluster.master_port = rec["master_port"]
    cluster.attempt = attempt  # the next formation takes attempt + 1: rendezvous keys never reused
    # An earlier notebook may have left the group broken: then it is re-formed at the next cell.
    cluster.group_ready = formed
    cluster.ready_seconds = time.perf_counter() - t0
    return session.adopt(cluster)
