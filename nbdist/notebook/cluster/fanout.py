"""Call one function on many engines and wait for all of them: the kernel's one way to do it.

Every request that goes from the kernel to several engines (setting engines up, forming the
group, sending shards, asking who holds which rank) goes through here, so waiting has one
deadline for all and failures read the same everywhere: one line per distinct error, the ranks
that share it grouped ("ranks 0, 2: ValueError: ..."). Only ``%%distributed`` cells, which
stream output while they run, are watched by the supervisor instead; they are sent with
``submit`` too.

The functions sent are ``nbdist.worker.api``'s, the engines' whole interface.

Between cells, calls go to ranks (``on_ranks``): a rank whose engine is gone (its process
ended, or the controller dropped it) is not asked, and every caller (pull, gather, scatter,
``%nbdist stacks``, ``%nbdist debug``, ``%nbdist status``) says the same one line about it
(``lost``): what happened to its engine, and that the next cell gives the rank a fresh one.
What ipyparallel's client would keep of every call for good (its id in the history, the
records of a call whose engine died) is dropped (``forget``): a kernel that runs thousands of
cells keeps none of it. What it keeps of a call's printed output is bounded (``streams``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ...errors import NbdistError
from .streams import bounded

K = TypeVar("K", bound=Hashable)

#: What a rank whose engine is gone means for the person, said after what happened to it.
LOST_FIX = (
    "the next %%distributed cell gives the rank a fresh engine, without the names earlier "
    "cells defined there (a cell run with --restarts replays them)"
)


_LOOK = 0.05  # seconds between looks for engine deaths while ranks are asked something
#: Ids of calls whose engine died: their records are dropped once the client stops waiting.
_abandoned: set[str] = set()


class EngineGone(NbdistError):
    """A call could not reach its engine: the controller no longer has it."""


@dataclass
class Results:
    """What came back: a value for each target that answered, a one-line failure for the rest
    (``lost``: the targets whose engine is gone, among the failures)."""

    values: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)
    lost: set = field(default_factory=set)

    def ordered(self) -> list:
        """The values in key order (rank order when keyed by rank)."""
        return [self.values[k] for k in sorted(self.values)]

    def check(self, what: str, error: type[Exception] = NbdistError, noun: str = "rank") -> None:
        """Raise ``error`` naming ``what`` and each distinct failure with its targets."""
        if self.failures:
            raise error(f"{what} failed on {describe_failures(self.failures, noun)}")


def describe_failures(failures: Mapping, noun: str = "rank") -> str:
    """``rank 1: X; ranks 0, 2: Y``: identical messages grouped, in key order."""
    groups: dict[str, list] = {}
    for key, msg in sorted(failures.items()):
        groups.setdefault(msg, []).append(key)
    return "; ".join(f"{targets_text(keys, noun)}: {msg}" for msg, keys in groups.items())


def targets_text(keys: list, noun: str = "rank") -> str:
    """``rank 3`` or ``ranks 0, 2``."""
    return (noun if len(keys) == 1 else noun + "s") + " " + ", ".join(map(str, keys))


def one_line(exc: BaseException) -> str:
    """An engine's exception as one line: ``ename: first line of evalue``."""
    ename = getattr(exc, "ename", None) or type(exc).__name__
    evalue = str(getattr(exc, "evalue", exc) or "")
    return f"{ename}: {evalue.splitlines()[0]}" if evalue.strip() else ename


class Unsent:
    """Stands for a call never sent, its engine already gone from the controller: ready at
    once, and its result is ``EngineGone`` (a ``Reply`` as the callers use one)."""

    msg_ids: tuple = ()

    def __init__(self, engine_id: int) -> None:
        self.engine_id = engine_id
        self.metadata: dict = {}  # its own: observers read (and pop from) what a rank sent

    def ready(self) -> bool:
        return True

    def wait(self, timeout: float | None = None) -> None:
        pass

    def wait_for_output(self, timeout: float = 0) -> None:
        pass

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        fn(self)

    def get(self, timeout: float | None = None) -> Any:
        raise EngineGone(f"engine {self.engine_id} is gone: the controller no longer has it")


class Reply:
    """One engine's answer to one call, as an ipyparallel AsyncResult for a single message is
    used here (``ready``, ``wait``, ``get``, ``wait_for_output``, ``add_done_callback``,
    ``metadata``, ``msg_ids``), over the client's own future for the message. Why not the
    AsyncResult: each makes three Events and three combined futures, about 0.25 ms of the
    kernel's thread per rank per cell (a 16-rank cell's round trip was 1.2x ipyparallel's, which
    makes one AsyncResult for all engines). The client still drops its records of the message
    once its reply and output are in."""

    def __init__(self, future: Any, engine_id: int) -> None:
        self._future = future  # its result: the value, or the engine's error as a value
        self.msg_ids = (future.msg_id,)
        self.engine_id = engine_id
        #: What the engine has sent so far (output, data), filled in by the client's I/O
        #: thread as it arrives; plain values, its dates never parsed (ipyparallel's
        #: ``AsyncResult.metadata`` parses them with dateutil at each first look).
        self.metadata: dict = future.output.metadata

    def ready(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> bool:
        return self._future.wait(timeout)

    def wait_for_output(self, timeout: float | None = None) -> bool:
        """Wait until the engine's last output for the call is in (it may trail the reply)."""
        return bool(futures.wait([self._future.output], timeout).done)

    def get(self, timeout: float | None = None) -> Any:
        """The value; the engine's error (``RemoteError``, ``EngineError``) raised."""
        if not self._future.wait(timeout):
            raise TimeoutError(f"no reply from engine {self.engine_id} yet")
        value = self._future.result()
        if isinstance(value, BaseException):
            raise value
        return value

    def add_done_callback(self, fn: Callable[[Reply], object]) -> None:
        """``fn(self)`` once the reply is in (on the client's I/O thread)."""
        self._future.add_done_callback(lambda _: fn(self))


def _send_all(client, fn: Callable, calls: Mapping[K, tuple[int, Any]]) -> dict[K, Any]:
    """Send ``fn(*args)`` to each target, as ``DirectView.apply_async`` to each engine would,
    without its cost: no view is made per call, the function is pickled once for all targets,
    and an argument already ``PrePickled`` once however many targets share it.
    A ``Reply`` by key; an ``Unsent`` for an engine the controller no longer has.
    """
    from ipyparallel.serialize import PrePickled

    forget(client)
    engines = getattr(client, "_engines", None)  # engine id -> its zmq identity, as known now
    if engines is None:  # not ipyparallel's client (a test's): through its views
        return {key: _by_view(client, eid, fn, args) for key, (eid, args) in calls.items()}
    f = PrePickled(fn)
    hook = bounded(client)  # each request's record keeps its streams bounded (``streams``)
    out = {}
    for key, (eid, args) in calls.items():
        ident = engines.get(eid)
        if ident is None:  # "No such engine": the controller dropped it
            out[key] = Unsent(eid)
            continue
        packed = [a if isinstance(a, PrePickled) else PrePickled(a) for a in args]
        future = client.send_apply_request(
            client._mux_stream,
            f,
            packed,
            {},
            ident=ident.encode("utf8"),
            metadata={"label": None},
            message_future_hook=hook,
        )
        out[key] = Reply(future, eid)
    return out


def _by_view(client, eid: int, fn: Callable, args: Any) -> Any:
    try:
        view = client[eid]
    except IndexError:  # "No such engine"
        return Unsent(eid)
    return view.apply_async(fn, *args)


def submit(client, targets: Mapping[K, int], fn: Callable, *args: Any) -> dict[K, Any]:
    """Send ``fn(*args)`` to each engine id in ``targets`` (key -> engine id), without waiting;
    a ``Reply`` by key (an ``Unsent`` for an engine already gone). The
    arguments are pickled once for all targets."""
    from ipyparallel.serialize import PrePickled

    packed = [PrePickled(a) for a in args]
    return _send_all(client, fn, {key: (eid, packed) for key, eid in targets.items()})


def submit_each(client, fn: Callable, calls: Mapping[K, tuple[int, tuple]]) -> dict[K, Any]:
    """Like ``submit``, with arguments of its own for each target: ``{key: (engine_id, args)}``."""
    return _send_all(client, fn, calls)


def died(exc: BaseException) -> bool:
    """Whether a call failed because its engine went away (not by an error of its own)."""
    name = getattr(exc, "ename", None) or type(exc).__name__
    return isinstance(exc, EngineGone) or name in ("EngineError", "EngineGone")


def wait(
    pending: Mapping[K, Any], timeout: float, client: Any = None, deadline: float | None = None
) -> Results:
    """Wait for every reply until one shared deadline (``timeout`` seconds from now, or
    ``deadline`` on ``time.monotonic``'s clock); collect values and failures. With ``client``,
    what it keeps of calls whose engine died is dropped (``forget``)."""
    deadline = time.monotonic() + timeout if deadline is None else deadline
    out = Results()
    for key, ar in pending.items():
        ar.wait(max(0.0, deadline - time.monotonic()))
        if not ar.ready():
            out.failures[key] = f"no answer within {timeout:.0f} s (is a cell still running there?)"
            continue
        try:
            out.values[key] = ar.get(0)
        except Exception as exc:  # RemoteError, EngineError: the engine's own words, one line
            out.failures[key] = one_line(exc)
            if died(exc):
                out.lost.add(key)
    if client is not None:
        forget(client, [pending[k] for k in out.lost])
    return out


def call(client, targets: Mapping[K, int], fn: Callable, *args: Any, timeout: float) -> Results:
    """``fn(*args)`` on every target at once; wait for all of them (see ``wait``)."""
    return wait(submit(client, targets, fn, *args), timeout, client)


def forget(client, dead: Iterable[Any] = ()) -> None:
    """Drop what ipyparallel's client would keep for good: every finished call's id in its
    ``history`` (one per call, for the client's life), and the records of calls whose engine
    died (``dead``: their replies; no output will ever end them, so the client never lets
    them go), once it no longer waits for them. Cheap: every call here does it."""
    busy = getattr(client, "outstanding", None)
    if busy is None:  # not ipyparallel's client (a test's): nothing kept
        return
    _abandoned.update(m for ar in dead for m in getattr(ar, "msg_ids", ()))
    done = [m for m in _abandoned if m not in busy]
    if done:
        client.purge_local_results(jobs=done)
        _abandoned.difference_update(done)
    if len(client.history) > len(busy):
        client.history[:] = [m for m in client.history if m in busy]


# -- ranks, between cells -------------------------------------------------------------------


def lost(cluster: Any, ranks: Iterable[int] | None = None) -> dict[int, str]:
    """The ranks of ``cluster`` (a ``ranks.Ranks``; all by default) whose engine is gone, each
    with what happened to it: its process ended (how, as the engine set tells it), or the
    controller dropped it. ``%nbdist status`` calls these ranks lost."""
    exited = cluster.drain_exits()
    alive = set(cluster.client.ids) if cluster.client is not None else set()
    out = {}
    for r in range(len(cluster.slots)) if ranks is None else ranks:
        slot = cluster.slots[r]
        ex = exited.get(slot.pid)
        if ex is not None:
            out[r] = f"its engine process {ex.describe()} (pid {slot.pid})"
        elif slot.engine_id not in alive:
            out[r] = f"its engine (pid {slot.pid}) left the controller"
    return out


def on_ranks(
    cluster: Any,
    fn: Callable,
    *args: Any,
    timeout: float,
    ranks: Iterable[int] | None = None,
) -> Results:
    """``fn(*args)`` on the engines of ``ranks`` (every rank of ``cluster`` by default), keyed
    by rank. A rank whose engine is gone is not asked; its failure, like that of one whose
    engine dies during the call, is one line: what happened to the engine, and what to do."""
    ranks = list(range(len(cluster.slots)) if ranks is None else ranks)
    gone = lost(cluster, ranks)
    targets = {r: cluster.slots[r].engine_id for r in ranks if r not in gone}
    pending = submit(cluster.client, targets, fn, *args)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # an engine that dies meanwhile ends its wait at once
        waiting = [r for r, ar in pending.items() if not ar.ready() and r not in gone]
        if not waiting:
            break
        gone |= lost(cluster, waiting)
        pending[waiting[0]].wait(_LOOK)
    asked = {r: ar for r, ar in pending.items() if r not in gone}
    out = wait(asked, timeout, cluster.client, deadline)
    forget(cluster.client, [ar for r, ar in pending.items() if r not in asked])  # given up
    if out.lost:  # died during the call: the engine set may know how by now
        now = lost(cluster, sorted(out.lost))
        gone |= {r: now.get(r, "its engine died during the call") for r in out.lost}
    for r, why in gone.items():
        out.values.pop(r, None)
        out.failures[r] = f"{why}; {LOST_FIX}"
        out.lost.add(r)
    return out
