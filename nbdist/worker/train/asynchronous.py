"""Asynchronous data parallel (``sync="async"``): ranks train on, and never wait for each other.

``prepare(model, opt, sync="async", sync_every=H, max_staleness=S)`` trains as local SGD does
(``sync``: the warm-up, then no gradient all-reduce), but a sync involves one rank and the
parameter service only (``nbdist.launch.params``, started by rank 0 at ``prepare`` on rank 0's
host, in a process of its own so that it outlives any rank). Every H optimizer steps a rank:

1. sends its change since the global model it last took (``local - base``) on a thread of its
   own, and trains on at once. If its previous change is still on its way (a slow link), it
   sends nothing this time: a slow rank contributes less often, and never makes anyone wait;
2. at the first optimizer step after the reply arrived, takes the global model back, keeping
   what it learnt since it sent: ``local = global + (local - base)``, ``base = global``.

The service adds each change once (``seq`` numbers make a repeat harmless), divided by the number
of ranks (a rank that died stops counting), and counts staleness: the updates applied between
the version a change started from and its own. A change staler than ``max_staleness`` (default
``4 x world size``) is dropped, and its rank simply takes the global model back. Each rank
reports a ``sync`` event now and then: its changes applied, dropped and skipped, and the largest
staleness so far.

Between cells every rank holds the global model: at a cell's end each rank sends what it has not
sent (waiting for the service only), and at the next cell's start each takes the latest global
model. A rank that dies leaves the others training: the kernel reports it in one line and lets
the cell end on the others (``GOES_ON_KEY``). Checkpoints are every rank's own, written without
waiting for the others (``checkpoint.save``): the optimizer's state carries the global model
and its version, and a restore gives the service back the newest model any rank checkpointed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ...errors import UsageError
from ...launch import params as service
from ...telemetry.events import GOES_ON_KEY
from .. import context
from ..reporting.calls import event

#: Seconds between two ``sync`` events of one rank at least.
EVENT_INTERVAL = 2.0
#: Seconds to wait for the service: to start, and to answer a blocking request.
SERVICE_WAIT = 60.0


def check_options(max_staleness: int | None, *, sync: str, compress: str | None, mesh: Any,
                  model: Any) -> int | None:  # fmt: skip
    """``max_staleness`` checked (None: the default, set once the world size is known), or one
    line naming what does not go with ``sync="async"``."""
    if sync != "async":
        if max_staleness is not None:
            raise UsageError(f"max_staleness= is sync='async''s: use it there, not {sync!r}")
        return None
    if max_staleness is not None and (
        not isinstance(max_staleness, int) or isinstance(max_staleness, bool) or max_staleness < 0
    ):
        raise UsageError(f"max_staleness must be a whole number >= 0, not {max_staleness!r}")
    if compress is not None:
        raise UsageError(
            f"sync='async' sends each rank's change to the global model in full: drop "
            f"compress={compress!r} (or use sync='local_sgd')"
        )
    if mesh is not None:
        raise UsageError("sync='async' updates whole models: prepare without mesh=")
    from ..state import engine

    if model in engine.pipeline_parts:
        raise UsageError(
            "sync='async' updates whole models; a pipeline's stage is part of one: use sync='ddp'"
        )
    return max_staleness


def start_service(host: str, world: int, staleness: int) -> tuple[subprocess.Popen, int, bytes]:
    """The parameter service (``nbdist.launch.params``), started on this host and listening on
    ``host``: its process (reaped by a thread when it ends), port and key."""
    key = os.urandom(service.KEY_BYTES)
    proc = subprocess.Popen(
        [sys.executable, "-m", "nbdist.launch.params", "--host", host, "--world", str(world),
         "--max-staleness", str(staleness)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    proc.stdin.write(key.hex().encode() + b"\n")
    proc.stdin.close()
    line = proc.stdout.readline()  # its port; nothing (it failed) ends the read as well
    proc.stdout.close()
    threading.Thread(target=proc.wait, daemon=True).start()  # reaped when it ends: no zombie
    if not line.strip().isdigit():
        raise RuntimeError(f"the parameter service did not start (exit code {proc.poll()})")
    return proc, int(line), key


def _announce() -> None:
    """Tell the kernel, under the running cell, that this rank trains on if another is lost
    (main thread; sent whether the cell is watched or not). Nothing off an engine."""
    from IPython import get_ipython

    shell = get_ipython()
    pub = getattr(shell, "__dict__", {}).get("_data_pub") if shell is not None else None
    if pub is not None and pub.session is not None:
        pub.publish_data({GOES_ON_KEY: True})


class Link:
    """One connection to the service, introduced by its key; one request at a time."""

    def __init__(self, host: str, port: int, key: bytes, rank: int):
        self.sock = socket.create_connection((host, port), timeout=SERVICE_WAIT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rank = rank
        self.ask(service.Frame(service.HELLO, rank, payload=key))

    def ask(self, frame: service.Frame, into: np.ndarray | None = None) -> service.Frame:
        service.send(self.sock, frame)
        return service.receive(self.sock, None if into is None else memoryview(into))

    def close(self) -> None:
        self.sock.close()


class Exchange:
    """One rank's side of asynchronous training, for a fixed list of tensors (see the module)."""

    def __init__(self, tensors: list[torch.Tensor], every: int, max_staleness: int | None):
        self.tensors = tensors
        self.every = every
        self.rank, world = dist.get_rank(), dist.get_world_size()
        self.max_staleness = 4 * world if max_staleness is None else max_staleness
        wide = any(t.dtype == torch.float64 for t in tensors)
        self.wire = torch.float64 if wide else torch.float32
        base = self.flat()
        self.process = None
        address = torch.zeros(2 + service.KEY_BYTES, dtype=torch.uint8)
        host = context.current().master_addr
        failed = None
        if self.rank == 0:  # a failure is told to every rank (port 0), not left to hang them
            try:
                self.process, port, key = start_service(host, world, self.max_staleness)
                self.link = Link(host, port, key, self.rank)
                self.link.ask(service.Frame(service.INIT, extra=base.element_size(),
                                            payload=base.numpy()))  # fmt: skip
                address[:2] = torch.tensor([port >> 8, port & 255], dtype=torch.uint8)
                address[2:] = torch.frombuffer(bytearray(key), dtype=torch.uint8)
            except (OSError, RuntimeError) as exc:
                failed = f"{type(exc).__name__}: {exc}"
        moved = address.to(context.current().device)
        dist.broadcast(moved, src=0)  # the one collective: every rank learns where it is
        address = moved.cpu()
        port = int(address[0]) << 8 | int(address[1])
        if port == 0:
            raise UsageError(
                f"sync='async': rank 0 could not start the parameter service on {host} "
                f"({failed or 'see rank 0'}): is python -m nbdist.launch.params runnable there?"
            )
        if self.rank != 0:
            self.link = Link(host, port, bytes(address[2:].tolist()), self.rank)
        self.base = base  # the global model this rank last took, as its change starts from it
        self.version = 0  # ...and that model's version
        self.seq = 0  # changes sent
        self.incoming = np.empty(base.numel(), dtype=base.numpy().dtype)  # replies land here
        self.flight: threading.Thread | None = None  # a change on its way
        self.reply: service.Frame | None = None
        self.error: BaseException | None = None
        self.counts = {"applied": 0, "dropped": 0, "skipped": 0}
        self.staleness = (0, 0)  # the last applied change's, the largest so far
        self.last_event = -float("inf")
        self.gone: str | None = None  # why the service cannot be reached, once it cannot
        _announce()
        self.told = True  # the kernel knows, for the cell under way, that this rank goes on

    # -- the flat model ---------------------------------------------------------------------
    def flat(self) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1).to(self.wire).cpu() for t in self.tensors])

    def _take(self, frame: service.Frame) -> None:
        """Take the global model in ``frame`` back, keeping what was learnt since ``base``."""
        g = torch.from_numpy(self.incoming)
        now = self.flat()
        mine = now.sub_(self.base).add_(g)  # global + (local - base)
        at = 0
        with torch.no_grad():
            for t in self.tensors:
                n = t.numel()
                t.copy_(mine[at : at + n].view_as(t))
                at += n
        self.base = g.clone()
        self.version = frame.version

    # -- training ---------------------------------------------------------------------------
    def after_step(self, local_steps: int) -> None:
        """After every optimizer step past the warm-up: take a reply that arrived; every
        ``every``-th, send this rank's change unless one is still on its way."""
        if self.gone is not None:
            raise UsageError(self.gone)
        if not self.told:  # trained in this cell: the kernel is told now
            self.told = True
            _announce()
        if self.flight is not None and not self.flight.is_alive():
            self._land()
        if local_steps <= 0 or local_steps % self.every:
            return
        if self.flight is not None:
            self.counts["skipped"] += 1
            return
        self._send(wait=False)

    def _send(self, wait: bool) -> None:
        now = self.flat()
        delta = now - self.base
        self.base = now  # this change is accounted for; what follows starts from here
        self.seq += 1
        frame = service.Frame(service.PUSH, self.rank, self.seq, self.version,
                              payload=delta.numpy())  # fmt: skip

        def go() -> None:
            try:
                self.reply = self.link.ask(frame, self.incoming)
            except BaseException as exc:  # noqa: B036 - told on the training thread
                self.error = exc

        self.flight = threading.Thread(target=go, name="nbdist-async", daemon=True)
        self.flight.start()
        if wait:
            self._land()

    def _land(self) -> None:
        self.flight.join()
        self.flight = None
        if self.error is not None:
            self.lose(self.error)
            raise UsageError(self.gone) from None
        reply, self.reply = self.reply, None
        outcome = reply.rank
        if outcome == service.APPLIED:
            self.counts["applied"] += 1
            self.staleness = (reply.extra, max(self.staleness[1], reply.extra))
        elif outcome == service.DROPPED:
            self.counts["dropped"] += 1
        self._take(reply)
        self._report()

    def settle(self) -> None:
        """Wait for a change on its way, send what is left, take the global model back (a
        cell's end, a checkpoint): this rank then holds the global model."""
        if self.flight is not None:
            self._land()
        if not torch.equal(self.flat(), self.base):  # a cell that trained: its last change
            self._send(wait=True)

    def pull(self) -> None:
        """Take the latest global model (a cell's start)."""
        if self.flight is not None:
            self._land()
        self._take(self.link.ask(service.Frame(service.PULL), self.incoming))

    # -- checkpoints ------------------------------------------------------------------------
    def state(self) -> dict:
        """What a checkpoint keeps (after ``settle``: this rank holds the global model)."""
        self.settle()
        return {"version": self.version, "seq": self.seq, "global": self.base.clone(),
                "counts": dict(self.counts)}  # fmt: skip

    def load(self, saved: dict) -> None:
        """Back to a checkpoint: this rank holds its model again, and the service takes it if
        newer than what it holds (``meet`` then gives every rank the newest)."""
        if self.flight is not None:
            self._land()
        self.seq = max(self.seq, int(saved["seq"]))
        self.counts.update(saved.get("counts", {}))
        self.base, self.version = saved["global"].to(self.wire).clone(), int(saved["version"])
        frame = service.Frame(service.SEED, self.rank, version=self.version,
                              payload=self.base.numpy())  # fmt: skip
        self.link.ask(frame)

    def stats(self) -> dict:
        """The service's counters (tests, benchmarks)."""
        import json

        if self.flight is not None:
            self._land()
        return json.loads(bytes(self.link.ask(service.Frame(service.STATS)).payload))

    # -- the kernel's view ------------------------------------------------------------------
    def lose(self, exc: BaseException) -> None:
        """The service cannot be reached (``exc``): this exchange is done for."""
        self.error, self.flight = None, None
        if isinstance(exc, service.Refused):  # its own line says what and why
            self.gone = f"sync='async': {exc}: prepare the model and its optimizer again"
            return
        self.gone = (
            f"sync='async': the parameter service cannot be reached ({type(exc).__name__}: "
            f"{exc}): prepare the model and its optimizer again"
        )

    def begin_cell(self, named: bool) -> None:
        """A cell starts: take the latest global model; tell the kernel that this rank trains
        on if another dies now if the model is ``named`` (a name of the person's holds it),
        else at its first step in the cell (see ``begin_cell`` below)."""
        self.told = named
        if named:
            _announce()
        self.pull()

    def _report(self) -> None:
        now = time.monotonic()
        if now - self.last_event < EVENT_INTERVAL:
            return
        self.last_event = now
        c, (last, worst) = self.counts, self.staleness
        event(
            "sync",
            f"async rank {self.rank}: {c['applied']} changes applied (staleness {last}, at most "
            f"{worst}), {c['dropped']} dropped as staler than {self.max_staleness}, "
            f"{c['skipped']} skipped while one was on its way",
            version=self.version,
            staleness=last,
            staleness_max=worst,
            **c,
        )

    def close(self) -> None:
        if self.flight is not None:
            self.flight.join()
        self.link.close()


def _live() -> list[tuple[Any, Exchange]]:
    """Each model trained with ``sync="async"`` whose service can be reached, and its exchange."""
    from ..state import engine

    out = []
    for model, plan in list(engine.training_plans.items()):
        exchange = getattr(getattr(plan, "sync", None), "exchange", None)
        if exchange is not None and exchange.gone is None:
            out.append((model, exchange))
    return out


def _exchanges() -> list[Exchange]:
    return [e for _, e in _live()]


def _each(step: str, arg: Callable[[Any], Any] | None = None) -> None:
    """``step`` of every live exchange (given ``arg(model)``, when given); one whose service is
    gone says so in one line and is left out from now on (its next ``opt.step()`` says so
    again)."""
    for model, exchange in _live():
        try:
            getattr(exchange, step)(*(() if arg is None else (arg(model),)))
        except (OSError, UsageError) as exc:
            if exchange.gone is None:
                exchange.lose(exc)
            print(f"nbdist: {exchange.gone}", file=sys.stderr, flush=True)


def begin_cell() -> None:
    """A cell starts: every async rank takes the latest global model. A model a name of the
    person's holds tells the kernel at once that its rank trains on if another is lost; any
    other (held inside something, or an old one a later ``prepare()`` left to the garbage
    collector) tells it at its first step: a cell that trains another model (DDP) is not taken
    to outlive a lost rank."""
    from ..state import namespace

    named = {id(v) for v in namespace().values()}
    _each("begin_cell", lambda model: id(model) in named)


def end_cell() -> None:
    """A cell ends: every async rank sends what it has not sent and takes the global model."""
    _each("settle")


def meet() -> None:
    """After every rank restored its own checkpoint (``checkpoint.save.restore``, on every rank
    at once): all take the newest global model any of them gave the service back."""
    if not _exchanges():
        return
    dist.barrier()
    for exchange in _exchanges():
        exchange.pull()
