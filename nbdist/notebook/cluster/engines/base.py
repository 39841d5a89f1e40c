"""What the kernel needs from a set of engines, whoever started them.

Three kinds implement ``EngineSet``: ``local.LocalEngines`` (forked on this machine from a warm
fork server), ``remote.RemoteEngines`` (started on other hosts by SSH, Slurm or MPI) and
``hosted.HostedEngines`` (held by a cluster host that the sidebar started; this kernel only
connects). The session, the supervisor and recovery use this interface alone, so none of them
asks which kind it holds.
"""

from __future__ import annotations

import queue
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .processes import signal_own

if TYPE_CHECKING:
    import ipyparallel as ipp
    import psutil

    from ....config import ClusterConfig
    from ....protocol import Inventory


@dataclass(frozen=True)
class EngineExit:
    """An engine process ended: its pid and exit status (negative: killed by that signal)."""

    pid: int
    status: int

    def describe(self) -> str:
        if self.status < 0:
            try:
                return f"killed by {signal.Signals(-self.status).name}"
            except ValueError:
                return f"killed by signal {-self.status}"
        return f"exited with status {self.status}"


@runtime_checkable
class EngineSet(Protocol):
    """A controller and its engines, as the kernel uses them."""

    cfg: ClusterConfig  # settled by start(): remote engines fix the controller's address
    cluster_id: str
    log_dir: Path  # where the engines' logs are (named in errors)
    owns_engines: bool  # False for hosted engines: stop() only disconnects
    exits: queue.Queue[EngineExit]  # engine deaths, as they are known

    @property
    def client(self) -> ipp.Client | None:
        """ipyparallel's client, once started; None after stop()."""

    def start(self) -> ipp.Client:
        """Start (or connect to) the controller and the engines; the client once all are in."""

    def add_engines(self, n: int, known: set[int]) -> list[int]:
        """Start ``n`` more engines; their engine ids (not in ``known``) once registered."""

    def check(self, inventory: dict[int, Inventory]) -> dict[int, Inventory]:
        """Refuse, in one line, engines whose environments differ; the inventory, completed
        (remote engines add each host's position in the user's list)."""

    def address_of(self, engine_id: int) -> str:
        """The address at which the other engines reach this engine's host (MASTER_ADDR)."""

    def signal(self, pids: list[int], sig: int = signal.SIGINT) -> None:
        """Send ``sig`` to these engine processes (ours only, checked by PID)."""

    def retire(self, pids: list[int]) -> None:
        """Kill these engine processes and forget them (their ranks go to fresh engines)."""

    def expect_replacements(self) -> None:
        """A run starts (any may lose an engine): get ready to replace one quickly (local
        engines: the fork server imports what a fresh engine's first cell would); may do
        nothing."""

    def processes(self) -> list[psutil.Process]:
        """The processes this set owns on this machine (for cleanup and CPU accounting)."""

    def stop(self, timeout: float = 5.0) -> None:
        """Stop what this set owns (or disconnect); nothing it started is left running."""


class OnThisMachine:
    """What engines on this machine share (local engines, and a cluster host's): one
    environment, the controller's address for all, and signals sent straight to their pids.
    Needs ``cfg`` and ``engine_pids`` (the pids this set may signal)."""

    cfg: ClusterConfig
    engine_pids: set[int]

    def check(self, inventory: dict[int, Inventory]) -> dict[int, Inventory]:
        """One machine, one environment: nothing to compare."""
        return inventory

    def address_of(self, engine_id: int) -> str:
        """Every engine here is reached at the controller's address."""
        return self.cfg.ip

    def signal(self, pids: list[int], sig: int = signal.SIGINT) -> None:
        """Send ``sig`` to these engine processes (ours only: checked against our pids)."""
        signal_own(pids, self.engine_pids, sig)

    def retire(self, pids: list[int]) -> None:
        """Kill these engines and forget them: their ranks go to fresh engines."""
        signal_own(pids, self.engine_pids, signal.SIGKILL)
        self.engine_pids.difference_update(pids)

    def expect_replacements(self) -> None:
        """Nothing to prepare (local engines override this)."""
