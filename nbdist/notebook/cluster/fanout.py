"""Call one function on many engines and wait for all of them: the kernel's one way to do it.

Every request that goes from the kernel to several engines (setting engines up, forming the
group, sending shards, asking who holds which rank) goes through here, so waiting has one
deadline for all and failures read the same everywhere: one line per distinct error, the ranks
that share it grouped ("ranks 0, 2: ValueError: ..."). Only ``%%distributed`` cells, which
stream output while they run, are watched by the supervisor instead; they are sent with
``submit`` too.

The functions sent are ``nbdist.worker.api``'s, the engines' whole interface.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ...errors import NbdistError

K = TypeVar("K", bound=Hashable)


@dataclass
class Results:
    """What came back: a value for each target that answered, a one-line failure for the rest."""

    values: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)

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


def submit(client, targets: Mapping[K, int], fn: Callable, *args: Any) -> dict[K, Any]:
    """Send ``fn(*args)`` to each engine id in ``targets`` (key -> engine id), without waiting;
    ipyparallel's AsyncResults by key."""
    return {key: client[eid].apply_async(fn, *args) for key, eid in targets.items()}


def submit_each(client, fn: Callable, calls: Mapping[K, tuple[int, tuple]]) -> dict[K, Any]:
    """Like ``submit``, with arguments of its own for each target: ``{key: (engine_id, args)}``."""
    return {key: client[eid].apply_async(fn, *args) for key, (eid, args) in calls.items()}


def wait(pending: Mapping[K, Any], timeout: float) -> Results:
    """Wait for every AsyncResult until one shared deadline; collect values and failures."""
    deadline = time.monotonic() + timeout
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
    return out


def call(client, targets: Mapping[K, int], fn: Callable, *args: Any, timeout: float) -> Results:
    """``fn(*args)`` on every target at once; wait for all of them (see ``wait``)."""
    return wait(submit(client, targets, fn, *args), timeout)
