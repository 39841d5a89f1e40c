"""The parameter service of ``sync="async"`` (``nbdist.launch.params``), a real process on
loopback spoken to over real sockets: each change is applied once and only once, divided by the
world size, exactly; staleness is counted and bounded; a stranger without the key is hung up
on; a checkpoint's model is taken only when newer; it leaves when its last client does."""

from __future__ import annotations

import json
import socket
import time

import numpy as np
import pytest

from nbdist.launch import params as service
from nbdist.worker.train.asynchronous import Link, start_service

WORLD, STALE = 2, 1


@pytest.fixture
def running():
    proc, port, key = start_service("127.0.0.1", WORLD, STALE)
    yield proc, port, key
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def _model(link: Link, init: np.ndarray) -> None:
    link.ask(service.Frame(service.INIT, extra=init.itemsize, payload=init))


def _pull(link: Link) -> tuple[int, np.ndarray]:
    f = link.ask(service.Frame(service.PULL))
    return f.version, np.frombuffer(f.payload, dtype=np.float32)


def _push(link: Link, seq: int, base: int, delta: np.ndarray) -> service.Frame:
    return link.ask(service.Frame(service.PUSH, link.rank, seq, base, payload=delta))


def test_each_change_is_applied_once_and_only_once(running):
    _, port, key = running
    a, b = Link("127.0.0.1", port, key, 0), Link("127.0.0.1", port, key, 1)
    init = np.arange(6, dtype=np.float32) / 7
    _model(a, init)
    _model(b, np.zeros(6, dtype=np.float32))  # a second INIT is ignored: the ranks start equal
    d1, d2 = np.full(6, 0.3, np.float32), np.linspace(-1, 1, 6, dtype=np.float32)
    r1 = _push(a, 1, 0, d1)
    assert (r1.rank, r1.version, r1.extra) == (service.APPLIED, 1, 0)
    r2 = _push(b, 1, 0, d2)  # started from version 0; one update applied since: staleness 1
    assert (r2.rank, r2.version, r2.extra) == (service.APPLIED, 2, 1)
    again = _push(a, 1, 1, d1)  # the same seq again (a retry): never applied twice
    assert (again.rank, again.version) == (service.REPEATED, 2)
    expected = init.copy()
    expected += d1 * np.float32(1 / WORLD)
    expected += d2 * np.float32(1 / WORLD)
    version, model = _pull(b)
    assert version == 2 and np.array_equal(model, expected)  # bit for bit
    assert np.array_equal(np.frombuffer(r2.payload, np.float32), expected)  # the reply's model
    stats = json.loads(bytes(a.ask(service.Frame(service.STATS)).payload))
    assert stats["applied"] == 2 and stats["repeated"] == 1 and stats["staleness_max"] == 1


def test_a_rank_whose_connection_closed_no_longer_shares_the_steps(running):
    _, port, key = running
    a, b = Link("127.0.0.1", port, key, 0), Link("127.0.0.1", port, key, 1)
    _model(a, np.zeros(2, np.float32))
    _push(a, 1, 0, np.ones(2, np.float32))  # two ranks: half of it
    b.close()  # rank 1 died: rank 0 trains on alone, its changes taken whole
    deadline = time.monotonic() + 10
    while json.loads(bytes(a.ask(service.Frame(service.STATS)).payload))["ranks"] != 1:
        assert time.monotonic() < deadline, "the service did not see rank 1 leave"
        time.sleep(0.02)  # polling interval, with a deadline
    assert _push(a, 2, 1, np.ones(2, np.float32)).rank == service.APPLIED
    assert np.array_equal(_pull(a)[1], np.full(2, 1.5, np.float32))


def test_a_change_staler_than_the_bound_is_dropped(running):
    _, port, key = running
    a = Link("127.0.0.1", port, key, 0)
    _model(a, np.zeros(4, np.float32))
    for seq in (1, 2, 3):
        _push(a, seq, seq - 1, np.ones(4, np.float32))
    late = _push(a, 4, 1, np.full(4, 100, np.float32))  # 2 updates since version 1 > STALE
    assert (late.rank, late.extra, late.version) == (service.DROPPED, 2, 3)
    version, model = _pull(a)
    assert version == 3 and np.array_equal(model, np.full(4, 1.5, np.float32))
    stats = json.loads(bytes(a.ask(service.Frame(service.STATS)).payload))
    assert stats["dropped"] == 1 and stats["staleness_max"] <= STALE


def test_a_checkpoint_model_is_taken_only_when_newer(running):
    _, port, key = running
    a = Link("127.0.0.1", port, key, 0)
    _model(a, np.zeros(3, np.float32))
    _push(a, 1, 0, np.ones(3, np.float32))
    older = a.ask(service.Frame(service.SEED, version=1, payload=np.full(3, 9, np.float32)))
    assert older.rank == 0 and np.array_equal(np.frombuffer(older.payload, np.float32), [0.5] * 3)
    newer = a.ask(service.Frame(service.SEED, version=7, payload=np.full(3, 9, np.float32)))
    assert newer.rank == 1 and newer.version == 7
    assert _pull(a) == (7, pytest.approx(np.full(3, 9, np.float32)))


def test_a_stranger_is_hung_up_on_and_the_service_leaves_with_its_last_client(running):
    proc, port, key = running
    a = Link("127.0.0.1", port, key, 0)
    with pytest.raises(ConnectionError):
        Link("127.0.0.1", port, b"x" * service.KEY_BYTES, 1)
    with socket.create_connection(("127.0.0.1", port)) as s:  # not even a frame
        s.sendall(b"GET / HTTP/1.0\r\n\r\n".ljust(service.HEADER.size + 8, b" "))
        s.settimeout(10)
        try:
            assert s.recv(1) == b""  # hung up on...
        except ConnectionResetError:
            pass  # ...or reset, the junk it sent unread
    assert proc.poll() is None  # strangers come and go: the service stays for its client
    a.close()
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # polling for the exit, with a deadline
    assert proc.poll() == 0
