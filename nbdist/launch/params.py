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

Any local user can reach its port, so nothing is spent on a stranger's word: a hello's payload
is the key's size (a header announcing more is hung up on before a byte of it is read), the
whole handshake has a deadline (``--hello-wait``), at most ``HANDSHAKES_MAX`` handshakes run at
once (more connections wait in the listen queue, without a thread), and only a client that
showed the key counts as one (a stranger neither ends the service nor keeps it). A rank's frame
of a size the model cannot have is refused in one line (``ERROR``, raised as ``Refused``), and
its connection closed.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, replace

import numpy as np

#: magic, kind, rank (or a reply's outcome), seq, version, extra, payload length
HEADER = struct.Struct("<4sB3xIqqqQ")
MAGIC = b"NBPS"
HELLO, INIT, PUSH, PULL, SEED, STATS, REPLY, ERROR = range(1, 9)
NAMES = {INIT: "INIT", PUSH: "PUSH", PULL: "PULL", SEED: "SEED", STATS: "STATS"}
#: A ``PUSH`` reply's outcome (in its ``rank`` field).
DROPPED, APPLIED, REPEATED = 0, 1, 2
KEY_BYTES = 32
#: Seconds to wait for the first client before giving up.
FIRST_WAIT = 120.0
#: Seconds a new connection has to show the key, all of its handshake together.
HELLO_WAIT = 5.0
#: Handshakes under way at once; more connections wait in the listen queue until one ends.
HANDSHAKES_MAX = 16
#: Clients that showed the key, per rank of the world (a rank holds one; room for a retry).
CLIENTS_PER_RANK = 4
#: Bytes of an ``ERROR`` frame's line, at most.
ERROR_MAX = 1000
#: Seconds a refused request's payload is read (and dropped) for, after the refusal.
DRAIN_WAIT = 2.0
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


class Refused(ConnectionError):
    """The service refused a request (one line: what, and why) and closed the connection."""


def _exactly(sock: socket.socket, view: memoryview, deadline: float | None = None) -> None:
    """Fill ``view`` from ``sock``, by ``deadline`` (``time.monotonic``) if one is given."""
    got = 0
    while got < len(view):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the handshake's deadline passed")
            sock.settimeout(left)
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the other side closed the connection")
        got += n


def _header(sock: socket.socket, deadline: float | None = None) -> tuple[Frame, int]:
    """The next frame's header: the frame without its payload, and the payload's length."""
    head = bytearray(HEADER.size)
    _exactly(sock, memoryview(head), deadline)
    magic, kind, rank, seq, version, extra, n = HEADER.unpack(head)
    if magic != MAGIC:
        raise ConnectionError("not a parameter-service frame")
    return Frame(kind, rank, seq, version, extra), n


def _payload(sock: socket.socket, f: Frame, n: int, into: memoryview | None = None,
             deadline: float | None = None) -> Frame:  # fmt: skip
    """``f`` with its ``n`` bytes of payload, read into ``into`` when it fits exactly."""
    view = into if into is not None and into.nbytes == n else memoryview(bytearray(n))
    _exactly(sock, view.cast("B"), deadline)
    return replace(f, payload=view)


def receive(sock: socket.socket, into: memoryview | None = None) -> Frame:
    """The next frame from ``sock``; its payload read into ``into`` when it fits exactly (a
    model received without a copy), else into new bytes. The service's refusal raises
    ``Refused`` with its line."""
    f, n = _header(sock)
    if f.kind == ERROR:
        text = bytes(_payload(sock, f, n).payload) if n <= ERROR_MAX else b"(too long to read)"
        raise Refused(text.decode(errors="replace"))
    return _payload(sock, f, n, into)


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

    def refusal(self, kind: int, extra: int, n: int) -> str | None:
        """Why a request of ``kind`` with ``n`` bytes of payload cannot be right for this model
        (one line), or None: nothing is read, let alone allocated, before this says so."""
        with self.lock:
            held = None if self.flat is None else self.flat.nbytes
        if kind not in NAMES:
            return f"an unknown request (kind {kind})"
        what = f"{'an' if kind == INIT else 'a'} {NAMES[kind]} of {n} bytes"
        if kind == STATS or (kind == PULL and held is not None):
            return f"{what}: it carries none" if n else None
        if held is None and kind != INIT:
            return f"{what}: no model is held yet (INIT first)"
        if held is not None:
            return None if n == held else f"{what}: the model has {held}"
        if extra not in DTYPES or n % extra:
            return f"{what} in items of {extra} bytes: they are 4 or 8 bytes"
        if n > _memory():
            return f"{what}: more than this machine's memory ({_memory()} bytes)"
        return None

    def snapshot(self) -> tuple[int, bytes]:
        with self.lock:
            return self.version, self.flat.tobytes()

    def stats(self) -> bytes:
        with self.lock:
            out = dict(self.counts, version=self.version, staleness_max=self.staleness_max,
                       ranks=self.world - len(self.left))  # fmt: skip
            return json.dumps(out).encode()


def _memory() -> int:
    """This machine's memory, in bytes: no model is larger."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _handshake(conn: socket.socket, key: bytes, wait: float) -> int | None:
    """The rank of a client that showed ``key`` within ``wait`` s, or None (a stranger): a
    hello of any other size is not read at all."""
    deadline = time.monotonic() + wait
    hello, n = _header(conn, deadline)
    if hello.kind != HELLO or n != len(key):
        return None
    hello = _payload(conn, hello, n, deadline=deadline)
    if not hmac.compare_digest(bytes(hello.payload), key):
        return None
    conn.settimeout(None)
    return hello.rank


def _refuse(conn: socket.socket, why: str, unread: int = 0) -> None:
    """Say ``why`` in one line, then read and drop the ``unread`` bytes of payload that follow
    for up to ``DRAIN_WAIT`` s, in a small buffer: the sender reads the line, not a reset."""
    line = f"the parameter service refused {why}"
    send(conn, Frame(ERROR, payload=line.encode()[:ERROR_MAX]))
    deadline, sink = time.monotonic() + DRAIN_WAIT, memoryview(bytearray(1 << 16))
    while unread > 0 and (left := deadline - time.monotonic()) > 0:
        conn.settimeout(left)
        got = conn.recv_into(sink[: min(unread, len(sink))])
        if got == 0:
            return
        unread -= got


def _requests(conn: socket.socket, model: Model) -> None:
    """Request after request, until the client leaves or sends what cannot be right."""
    while True:
        f, n = _header(conn)
        why = model.refusal(f.kind, f.extra, n)
        if why is None:
            try:
                f = _payload(conn, f, n)
            except MemoryError:
                why = f"a {NAMES[f.kind]} of {n} bytes: no memory for it here"
        if why is not None:
            _refuse(conn, why, n)
            return
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
        else:  # STATS
            send(conn, Frame(REPLY, payload=model.stats()))


class Service:
    """The listening socket and its clients; ``run`` returns when the last one has left."""

    def __init__(self, host: str, world: int, max_staleness: int, key: bytes,
                 hello_wait: float = HELLO_WAIT):  # fmt: skip
        self.model = Model(world, max_staleness)
        self.key = key
        self.hello_wait = hello_wait
        self.listener = socket.create_server((host, 0))
        self.port = self.listener.getsockname()[1]
        self.handshakes = 0  # connections not yet past the key
        self.clients = 0  # connections that showed the key: only these count
        self.clients_max = CLIENTS_PER_RANK * world
        self.seen = False
        self.changed = threading.Condition()

    def _client(self, conn: socket.socket) -> None:
        try:
            rank = self._introduced(conn)
            if rank is not None:
                self._serve(conn, rank)
        except (ConnectionError, OSError, ValueError, KeyError):
            pass  # a client gone (its engine died) or speaking nonsense: hung up on
        finally:
            conn.close()

    def _introduced(self, conn: socket.socket) -> int | None:
        """The rank of a client that showed the key in time (a handshake slot freed either
        way), or None: a stranger, hung up on."""
        try:
            return _handshake(conn, self.key, self.hello_wait)
        finally:
            with self.changed:
                self.handshakes -= 1
                self.changed.notify_all()

    def _serve(self, conn: socket.socket, rank: int) -> None:
        with self.changed:
            full = self.clients >= self.clients_max
            if not full:
                self.clients += 1
                self.seen = True
        if full:
            _refuse(conn, f"a connection: it has {self.clients_max} clients already")
            return
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            send(conn, Frame(REPLY, version=self.model.version))
            _requests(conn, self.model)
        finally:
            self.model.leave(rank)
            with self.changed:
                self.clients -= 1
                self.changed.notify_all()

    def _accept(self) -> None:
        while True:
            with self.changed:  # a full house: the next connection waits in the listen queue
                self.changed.wait_for(lambda: self.handshakes < HANDSHAKES_MAX)
                self.handshakes += 1
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
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
    p.add_argument("--hello-wait", type=float, default=HELLO_WAIT, help="seconds to show the key")
    args = p.parse_args(argv)
    key = bytes.fromhex(sys.stdin.readline().strip())
    lifeline.exit_with_parent()
    service = Service(args.host, args.world, args.max_staleness, key, args.hello_wait)
    print(service.port, flush=True)
    sys.stdout.close()
    service.run()


if __name__ == "__main__":
    main()
