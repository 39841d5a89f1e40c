"""The parameter service of ``sync="async"`` under a hostile neighbour: any local user reaches its
port. A real service on loopback and a stranger's real socket: nothing is allocated on a
stranger's word, a handshake has a deadline, handshakes under way are capped (and their
threads), only clients that showed the key count, and a rank's frame too large for the model is
refused in one line."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from processes import wait_until

from nbdist.launch import params as service
from nbdist.worker.train.asynchronous import Link

MIB = 1 << 20


@contextlib.contextmanager
def serving(*options: str):
    """A real service for a world of 2 (its handshake's deadline among ``options``): its
    process, port and key."""
    key = os.urandom(service.KEY_BYTES)
    proc = subprocess.Popen(
        [sys.executable, "-m", "nbdist.launch.params", "--host", "127.0.0.1", "--world", "2",
         "--max-staleness", "4", *options],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    proc.stdin.write(key.hex().encode() + b"\n")
    proc.stdin.close()
    line = proc.stdout.readline()
    proc.stdout.close()
    try:
        assert line.strip().isdigit(), f"the service did not start (exit {proc.wait(10)})"
        yield proc, int(line), key
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _status(pid: int, field: str) -> int:
    """A number from ``/proc/PID/status`` (``VmHWM``: the peak resident memory, in kB)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _hung_up(sock: socket.socket, timeout: float) -> bool:
    """Whether the service closed ``sock`` within ``timeout`` s (whatever it had sent)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def _header(kind: int, size: int) -> bytes:
    return service.HEADER.pack(service.MAGIC, kind, 0, 0, 0, 0, size)


def test_a_header_announcing_400_mib_before_the_key_takes_no_memory():
    """One 40-byte header announcing 400 MiB took the service from 34 to 435 MiB: a hello is
    the key's size, and anything else is hung up on before a byte of it is read."""
    with serving() as (proc, port, _):
        before = _status(proc.pid, "VmRSS")
        for kind in (service.HELLO, service.PUSH):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(_header(kind, 400 * MIB))
                assert _hung_up(s, 3.0), "a stranger's 400 MiB header was not hung up on"
        peak = _status(proc.pid, "VmHWM")
        assert peak - before < 32 * 1024, f"peak {peak} kB, {before} kB before the stranger"
        assert proc.poll() is None


class Dribbler:
    """A stranger sending a valid hello's header, one byte every ``every`` seconds, on a
    thread of its own; ``dropped`` is set once the service hangs up."""

    def __init__(self, port: int, every: float):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.every = every
        self.dropped = threading.Event()
        self.sent = 0
        threading.Thread(target=self._dribble, daemon=True).start()

    def _dribble(self) -> None:
        data = _header(service.HELLO, service.KEY_BYTES) + b"x" * service.KEY_BYTES
        try:
            for byte in data:
                self.sock.sendall(bytes([byte]))
                self.sent += 1
                if _hung_up(self.sock, self.every):  # the pace of the attack, not a sync
                    break
        except OSError:
            pass
        self.dropped.set()

    def close(self) -> None:
        self.sock.close()


def test_a_stranger_dribbling_a_byte_at_a_time_is_dropped_at_the_handshake_deadline():
    """The handshake's timeout was per ``recv``: a byte every 3 s held a connection for ever."""
    with serving("--hello-wait", "1.5") as (proc, port, _):
        t0 = time.monotonic()
        loris = Dribbler(port, every=0.25)
        try:
            assert loris.dropped.wait(8), f"still held after {loris.sent} bytes"
            took = time.monotonic() - t0
            assert 1.0 < took < 5.0, f"dropped after {took:.2f} s, not at the 1.5 s deadline"
            assert loris.sent < service.HEADER.size + service.KEY_BYTES
        finally:
            loris.close()
        assert proc.poll() is None


def test_handshakes_under_way_are_capped_and_a_rank_still_gets_in():
    """Many strangers connect and say nothing: at most ``HANDSHAKES_MAX`` hold a thread and a
    descriptor at once (the others wait in the listen queue); a rank is served as they time
    out."""
    many = service.HANDSHAKES_MAX + 20
    with serving("--hello-wait", "1") as (proc, port, key):
        strangers = [socket.create_connection(("127.0.0.1", port)) for _ in range(many)]
        try:
            wait_until(lambda: _status(proc.pid, "Threads") >= service.HANDSHAKES_MAX, 10,
                       what="the service to take the first strangers")  # fmt: skip
            rank = Link("127.0.0.1", port, key, 0)  # behind every stranger in the queue
            threads = _status(proc.pid, "Threads")
            fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
            # main, accept, the rank's, and the last strangers' handshakes at most
            assert threads <= service.HANDSHAKES_MAX + 3, threads
            assert fds <= service.HANDSHAKES_MAX + 16, fds
            rank.ask(service.Frame(service.INIT, extra=4, payload=np.zeros(3, np.float32)))
            assert rank.ask(service.Frame(service.PULL)).version == 0
            rank.close()
        finally:
            for s in strangers:
                s.close()


def test_a_stranger_who_connects_and_leaves_before_rank_0_does_not_end_the_service():
    """Only a client that showed the key counts: a stranger's coming and going before rank 0
    arrives ended the service (its 'last client' had left)."""
    with serving() as (proc, port, key):
        socket.create_connection(("127.0.0.1", port)).close()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(_header(service.HELLO, service.KEY_BYTES) + b"x" * service.KEY_BYTES)
            assert _hung_up(s, 5.0)  # the wrong key: hung up on, the stranger gone
        with pytest.raises(AssertionError):  # it stays up: the deadline passes, it runs
            wait_until(lambda: proc.poll() is not None, 1.0, what="the service to stay up")
        rank = Link("127.0.0.1", port, key, 0)
        rank.ask(service.Frame(service.INIT, extra=4, payload=np.ones(2, np.float32)))
        assert rank.ask(service.Frame(service.PULL)).version == 0
        rank.close()
        wait_until(lambda: proc.poll() is not None, 10, what="the service to leave with rank 0")
        assert proc.returncode == 0


def test_a_stranger_mid_handshake_does_not_keep_the_service_after_every_rank_left():
    with serving("--hello-wait", "60") as (proc, port, key):
        rank = Link("127.0.0.1", port, key, 0)
        loris = Dribbler(port, every=0.25)
        try:
            wait_until(lambda: loris.sent > 2, 10, what="the stranger to start its handshake")
            rank.ask(service.Frame(service.INIT, extra=4, payload=np.ones(2, np.float32)))
            assert not loris.dropped.is_set()  # mid-handshake as the last rank leaves
            rank.close()
            wait_until(lambda: proc.poll() is not None, 5, what="the service to leave")
            assert proc.returncode == 0
        finally:
            loris.close()


def _refused(link: Link, header: bytes) -> str:
    """What the service answers ``header`` (a rank's request, its payload unsent) with."""
    link.sock.settimeout(10)
    link.sock.sendall(header)
    with pytest.raises(service.Refused) as refused:
        service.receive(link.sock)
    return str(refused.value)


def test_a_ranks_frame_too_large_for_the_model_is_refused_in_one_line():
    """After the key too: a size the model cannot have is one line, never a MemoryError (nor
    a 400 MiB allocation); the service goes on serving the other ranks."""
    with serving() as (proc, port, key):
        keeper = Link("127.0.0.1", port, key, 1)  # a rank that stays: the service with it
        keeper.ask(service.Frame(service.INIT, extra=4, payload=np.zeros(4, np.float32)))
        before = _status(proc.pid, "VmRSS")
        assert _refused(Link("127.0.0.1", port, key, 0), _header(service.PUSH, 400 * MIB)) == (
            "the parameter service refused a PUSH of 419430400 bytes: the model has 16"
        )
        assert _status(proc.pid, "VmHWM") - before < 32 * 1024
        wrong = Link("127.0.0.1", port, key, 0)  # a whole model of the wrong size, sent
        wrong.sock.settimeout(10)
        with pytest.raises(service.Refused) as refused:  # the line, not a reset
            wrong.ask(service.Frame(service.SEED, version=9, payload=np.zeros(4 * MIB)))
        assert str(refused.value) == (
            "the parameter service refused a SEED of 33554432 bytes: the model has 16"
        )
        assert keeper.ask(service.Frame(service.PULL)).version == 0
        keeper.close()
    with serving() as (proc, port, key):
        keeper = Link("127.0.0.1", port, key, 1)
        huge = service.HEADER.pack(service.MAGIC, service.INIT, 0, 0, 0, 4, 1 << 62)
        line = _refused(Link("127.0.0.1", port, key, 0), huge)
        assert line.startswith("the parameter service refused an INIT of 4611686018427387904 ")
        assert "\n" not in line and proc.poll() is None
        keeper.close()
