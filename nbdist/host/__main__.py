"""The cluster host: a small process that holds a local cluster started from the sidebar.

The Jupyter server must neither import torch nor wait for engines, so it starts this process::

    python -m nbdist.host --n N

which runs ``nbdist.start(n=N)``, writes its record (see ``registry``), and keeps the cluster
alive until it gets SIGTERM (the sidebar's stop button) or the process that started it (the
Jupyter server) goes away; then it stops every engine and the controller, removes its record
and exits 0. Notebooks use the cluster through ``nbdist.attach()``, which talks to this process
over a Unix socket beside the record (owner-only, like the record): one JSON line a request.

``{"op": "spawn", "n": N}``: start N more engines; the reply ``{"ids": [...], "pids": [...]}``
(refused when the cluster would have more live engines than ``limits.max_engines()``).
``{"op": "watch"}``: the host writes ``{"exit": PID, "status": S}`` for each engine that ends,
until the kernel closes the connection (or dies): then the host drops it.

A host killed without a word (SIGKILL, the OOM killer) leaves its record, socket and lease file:
each host removes those of hosts that are gone when it starts (and an attached kernel removes
its own host's, ``engines.hosted``), so they never pile up.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, replace

import psutil

from .. import config
from ..errors import UsageError
from ..records import limits, registry
from ..records.host import HostRecord, SlotRecord
from ..records.profile import profile_dir


class _Control:
    """The host's end of the control socket."""

    def __init__(self, cluster, record: _Record, path: str):
        self.cluster = cluster
        self.record = record
        self.path = path
        self._spawning = threading.Lock()  # one spawn at a time: the client is not shared
        self._lock = threading.Lock()  # the watchers (not held while engines start: deaths flow)
        self._watchers: list[socket.socket] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self._sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self._sock.listen(8)
        threading.Thread(target=self._accept, name="nbdist-host-accept", daemon=True).start()
        threading.Thread(target=self._forward_exits, name="nbdist-host-exits", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            line = conn.makefile("r").readline()
            req = json.loads(line or "{}")
            op = req.get("op")
            if op == "watch":
                self._watch(conn)
                return
            if op == "spawn":
                reply = self._spawn(req.get("n", 1))
            else:
                reply = {"error": f"unknown request {op!r}"}
        except Exception as exc:  # a bad request must not take the host down
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            conn.sendall((json.dumps(reply) + "\n").encode())
        finally:
            conn.close()

    def _watch(self, conn: socket.socket) -> None:
        """Keep ``conn`` for ``_forward_exits`` while its kernel holds it: a watcher says
        nothing more, so its end (EOF, or a reset: the kernel died) is what is read here."""
        with self._lock:
            self._watchers.append(conn)
        try:
            while conn.recv(512):
                pass
        except OSError:
            pass
        finally:
            with self._lock:
                if conn in self._watchers:
                    self._watchers.remove(conn)
            conn.close()

    def _spawn(self, count: object) -> dict:
        try:
            n = limits.parse_count(count)
        except UsageError as e:
            return {"error": str(e)}
        with self._spawning:
            engines = self.cluster.engines
            live = sum(psutil.pid_exists(pid) for pid in engines.engine_pids)
            if live + n > limits.max_engines():
                return {
                    "error": f"{n} more engines would make {live + n}, more than this machine's "
                    f"limit of {limits.max_engines()} (its CPUs x {config.ENGINES_PER_CPU})"
                }
            before = set(engines.engine_pids)
            ids = engines.add_engines(n, known=set(engines.client.ids))
            pids = sorted(engines.engine_pids - before)
        self.record.add_engines({"pid": p, "rank": None} for p in pids)
        return {"ids": ids, "pids": pids}

    def _forward_exits(self) -> None:
        q = self.cluster.engines.exits
        while True:
            ex = q.get()
            line = (json.dumps({"exit": ex.pid, "status": ex.status}) + "\n").encode()
            with self._lock:
                for w in list(self._watchers):
                    try:
                        w.sendall(line)
                    except OSError:
                        self._watchers.remove(w)

    def close(self) -> None:
        self._sock.close()
        with self._lock:
            for w in self._watchers:
                try:  # wakes its _watch thread, which closes it
                    w.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._watchers.clear()


class _Record:
    """This host's record (``records.host.HostRecord``), written again at every change."""

    def __init__(self, pid: int, n: int):
        self._lock = threading.Lock()  # the control thread adds engines while main may update
        self.value = HostRecord(pid=pid, n=n, state="starting", started=time.time())
        registry.write(self.value)

    def update(self, **fields) -> None:
        """Change these fields of the record, and write it."""
        with self._lock:
            self.value = replace(self.value, **fields)
            registry.write(self.value)

    def add_engines(self, engines: Iterable[dict]) -> None:
        """Add engines started since (``{"pid": PID, "rank": RANK or None}`` each)."""
        with self._lock:
            self.value = replace(self.value, engines=(*self.value.engines, *engines))
            registry.write(self.value)


def _forget_dead_hosts() -> None:
    """Remove the record, socket and lease of every host that is gone (it could not)."""
    for rec in registry.read_all():
        if not registry.host_alive(rec.pid):
            registry.remove(rec.pid)


def _watch_parent(stop: threading.Event, period: float = 0.5) -> None:
    """Stop when the process that started us (the Jupyter server) is gone."""
    parent = os.getppid()

    def watch() -> None:
        while not stop.is_set():
            if os.getppid() != parent:
                stop.set()
            time.sleep(period)

    threading.Thread(target=watch, name="nbdist-host-parent", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """Start the cluster, hold it until told to stop, then stop it; the exit status says how."""
    p = argparse.ArgumentParser(prog="python -m nbdist.host")
    p.add_argument("--n", type=int, required=True, help="number of engines")
    args = p.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    _watch_parent(stop)
    pid = os.getpid()
    record = _Record(pid, args.n)
    control = cluster = None
    try:
        _forget_dead_hosts()
        from ..notebook import session  # torch comes in here, in this process only

        t0 = time.perf_counter()
        cluster = session.start(n=args.n)
        control = _Control(cluster, record, str(registry.socket_path(pid)))
        cfg = cluster.cfg
        record.update(
            state="running",
            cluster_id=cluster.engines.cluster_id,
            ready_seconds=round(time.perf_counter() - t0, 3),
            slots=tuple(SlotRecord(**asdict(s)) for s in cluster.slots),
            engines=tuple({"pid": s.pid, "rank": s.rank} for s in cluster.slots),
            backend=cluster.backend,
            master_port=cluster.master_port,
            attempt=cluster.attempt,
            ip=cfg.ip,
            threads=cfg.threads,
            inventory=dict(cluster.inventory),
            profile_dir=str(profile_dir()),
            log_dir=str(cluster.engines.log_dir),
            socket=str(registry.socket_path(pid)),
        )
        print(f"nbdist host {pid}: cluster {cluster.engines.cluster_id} ready", flush=True)
        while not stop.wait(0.5):
            pass
        return 0
    except Exception as exc:
        print(f"nbdist host {pid}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if registry.record_path(pid).exists():
            record.update(state="stopping")
        if control is not None:
            control.close()
        if cluster is not None:
            cluster.stop()
        registry.remove(pid)


if __name__ == "__main__":
    sys.exit(main())
