"""The parameter service of ``sync="async"``: one global model that ranks update without waiting.

Rank 0's engine starts it, on rank 0's host, as ``python -m nbdist.launch.params`` in a session
of its own, so that it outlives rank 0 (a rank that dies leaves the others training). It listens
on the address the ranks reach rank 0 by (loopback, on a local cluster) and answers only a
client that first shows the 32-byte key read from its stdin; it prints its port on stdout. It
holds the model as one flat vector (``float32``, or ``float64`` for a model in doubles) and
answers, one request at a time per connection, any number of connections:

- ``INIT``: the first model it holds (later ones are ignored: the ranks start equal);
- ``PUSH``: a rank's parameter change since the global version it last took (``version``).
  Staleness is the number of updates applied since that version. At most ``max_staleness``: the
  change, divided by the number of ranks (less those whose connection closed: a rank that died
  no longer shares the steps), is added to the model and the version goes up by one. A
  staler change is dropped (counted). A ``seq`` a rank has pushed before is never applied again;
  the reply says which of the three happened (``APPLIED``, ``DROPPED``, ``REPEATED``) and
  carries the model as it now is;
- ``PULL``: the model and its version;
- ``SEED``: a checkpoint's model and version, taken when newer than what it holds (a restored run
  starts from the newest checkpointed model, whichever rank restores first);
- ``STATS``: its counters, as JSON text.

Everything travels as ``Frame``s: a fixed header (``HEADER``) and raw bytes; nothing is unpickled.
It exits when the last client has disconnected (ranks close their connection when their engine
ends, or dies), when none came within ``FIRST_WAIT`` seconds, or with the kernel.
"""

from __future__ import annotations

import argparse
import hmac
import json
import socket
import struct
import sys
import threading
from dataclasses import dataclass

import numpy as np

#: magic, kind, rank (or a reply's outcome), seq, version, extra, payload length
HEADER = struct.Struct("<4sB3xIqqqQ")
MAGIC = b"NBPS"
HELLO, INIT, PUSH, PULL, SEED, STATS, REPLY = range(1, 8)
#: A ``PUSH`` reply's outcome (in its ``rank`` field).
DROPPED, APPLIED, REPEATED = 0, 1, 2
KEY_BYTES = 32
#: Seconds to wait for the first client before giving up.
FIRST_WAIT = 120.0
#: Seconds a new connection has to show the key.
HELLO_WAIT = 5.0
DTYPES = {4: np.float32, 8: np.float64}  # a flat vector's dtype, by its item size (``extra``)


@dataclass(frozen=True)
class Frame:
    """One message either way: what it is, and its raw payload."""

    kind: int
    rank: int = 0
    seq: int = 0
    version: int = 0
    extra: int = 0
    payload: bytes | memoryview = b""


def send(sock: socket.socket, f: Frame) -> None:
    """Write ``f`` (its header, then its payload) to ``sock``."""
    n = memoryview(f.payload).nbytes
    sock.sendall(HEADER.pack(MAGIC, f.kind, f.rank, f.seq, f.version, f.extra, n))
    if n:
        sock.sendall(f.payload)


def _exactly(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the other side closed the connection")
        got += n


def receive(sock: socket.socket, into: memoryview | None = None) -> Frame:
    """The next frame from ``sock``; its payload read into ``into`` when it fits exactly (a
    model received without a copy), else into new bytes."""
    head = bytearray(HEADER.size)
    _exactly(sock, memoryview(head))
    magic, kind, rank, seq, version, extra, n = HEADER.unpack(head)
    if magic != MAGIC:
        raise ConnectionError("not a parameter-service frame")
    view = into if into is not None and into.nbytes == n else memoryview(bytearray(n))
    _exactly(sock, view.cast("B"))
    return Frame(kind, rank, seq, version, extra, view)


class Model:
    """The global model and its counters; every method holds the lock."""

    def __init__(self, world: int, max_staleness: int):
        self.world = world
        self.left: set[int] = set()  # ranks whose connection closed: dead, or done
        self.max_staleness = max_staleness
        self.flat: np.ndarray | None = None
        self.version = 0
        self.last_seq: dict[int, int] = {}  # rank -> the last seq it pushed that was handled
        self.counts = {"applied": 0, "dropped": 0, "repeated": 0, "seeded": 0}
        self.staleness_max = 0
        self.lock = threading.Lock()

    def init(self, payload: memoryview, itemsize: int) -> None:
        with self.lock:
            if self.flat is None:
                self.flat = np.frombuffer(payload, dtype=DTYPES[itemsize]).copy()

    def push(self, rank: int, seq: int, base: int, payload: memoryview) -> tuple[int, int, bytes]:
        """Apply one change at most once: (outcome, its staleness, the model as it now is)."""
        with self.lock:
            staleness = self.version - base
            if seq <= self.last_seq.get(rank, -1):
                outcome = REPEATED
            elif staleness > self.max_staleness:
                outcome = DROPPED
            else:
                delta = np.frombuffer(payload, dtype=self.flat.dtype)
                scale = 1.0 / max(1, self.world - len(self.left))
                self.flat += delta * self.flat.dtype.type(scale)
                self.version += 1
                self.staleness_max = max(self.staleness_max, staleness)
                outcome = APPLIED
            self.last_seq[rank] = max(seq, self.last_seq.get(rank, -1))
            self.counts[("dropped", "applied", "repeated")[outcome]] += 1
            return outcome, staleness, self.flat.tobytes()

    def leave(self, rank: int) -> None:
        """``rank``'s connection closed: its changes no longer share the model's steps."""
        with self.lock:
            self.left.add(rank)

    def seed(self, version: int, payload: memoryview) -> bool:
        with self.lock:
            if version <= self.version:
                return False
            self.flat = np.frombuffer(payload, dtype=self.flat.dtype).copy()
            self.version = version
            self.counts["seeded"] += 1
            return True

    def snapshot(self) -> tuple[int, bytes]:
        with self.lock:
            return self.version, self.flat.tobytes()

    def stats(self) -> bytes:
        with self.lock:
            out = dict(self.counts, version=self.version, staleness_max=self.staleness_max,
                       ranks=self.world - len(self.left))  # fmt: skip
            return json.dumps(out).encode()


def _serve(conn: socket.socket, model: Model, key: bytes) -> None:
    """One client, request after request, until it leaves; a stranger is hung up on."""
    conn.settimeout(HELLO_WAIT)
    hello = receive(conn)
    if hello.kind != HELLO or not hmac.compare_digest(bytes(hello.payload), key):
        return
    conn.settimeout(None)
    send(conn, Frame(REPLY, version=model.version))
    try:
        _requests(conn, model)
    finally:
        model.leave(hello.rank)


def _requests(conn: socket.socket, model: Model) -> None:
    while True:
        f = receive(conn)
        if f.kind == INIT:
            model.init(f.payload, f.extra)
            send(conn, Frame(REPLY, version=model.version))
        elif f.kind == PUSH:
            outcome, staleness, flat = model.push(f.rank, f.seq, f.version, f.payload)
            send(conn, Frame(REPLY, outcome, f.seq, model.version, staleness, flat))
        elif f.kind == PULL:
            version, flat = model.snapshot()
            send(conn, Frame(REPLY, version=version, payload=flat))
        elif f.kind == SEED:
            taken = model.seed(f.version, f.payload)
            version, flat = model.snapshot()
            send(conn, Frame(REPLY, int(taken), version=version, payload=flat))
        elif f.kind == STATS:
            send(conn, Frame(REPLY, payload=model.stats()))
        else:
            return


class Service:
    """The listening socket and its clients; ``run`` returns when the last one has left."""

    def __init__(self, host: str, world: int, max_staleness: int, key: bytes):
        self.model = Model(world, max_staleness)
        self.key = key
        self.listener = socket.create_server((host, 0))
        self.port = self.listener.getsockname()[1]
        self.clients = 0
        self.seen = False
        self.changed = threading.Condition()

    def _client(self, conn: socket.socket) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _serve(conn, self.model, self.key)
        except (ConnectionError, OSError, ValueError, KeyError):
            pass  # a client gone (its engine died) or speaking nonsense: hung up on
        finally:
            conn.close()
            with self.changed:
                self.clients -= 1
                self.changed.notify_all()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.changed:
                self.clients += 1
                self.seen = True
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def run(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()
        with self.changed:
            self.changed.wait_for(lambda: self.seen, timeout=FIRST_WAIT)
            self.changed.wait_for(lambda: self.clients == 0)
        self.listener.close()


def main(argv: list[str] | None = None) -> None:
    from . import lifeline

    p = argparse.ArgumentParser(prog="python -m nbdist.launch.params")
    p.add_argument("--host", required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--max-staleness", type=int, required=True)
    args = p.parse_args(argv)
    key = bytes.fromhex(sys.stdin.readline().strip())
    lifeline.exit_with_parent()
    service = Service(args.host, args.world, args.max_staleness, key)
    print(service.port, flush=True)
    sys.stdout.close()
    service.run()


if __name__ == "__main__":
    main()
