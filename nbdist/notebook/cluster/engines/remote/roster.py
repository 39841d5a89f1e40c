"""Which remote engine is which: each one's pid and host as it registered, and which have left.

An engine is known once it has registered and said its pid and host (``identify``: the name its
launcher gave it; None where the launcher names none: Slurm, MPI). One that leaves (it
unregistered, its job ended, or we killed it) is gone for good, and its host has a vacancy:
replacements go to vacant hosts first, then to the host with the fewest live engines
(``hosts_for``). Signals reach only engines known and not gone, by their pid (``engines_of``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import ipyparallel as ipp

from .....worker import api
from ... import fanout
from .jobs import RemoteExit


class Roster:
    """The engines of one remote cluster; ``hosts``: its named hosts, as the user listed them."""

    def __init__(self, hosts: Iterable[str]) -> None:
        self.hosts = list(hosts)
        self.pid_of: dict[int, int] = {}  # engine id -> pid on its host
        self.host_of: dict[int, str | None] = {}  # engine id -> host name (None: unnamed)
        self.pids: set[int] = set()  # the pids this cluster may signal
        self.gone: set[int] = set()  # engine ids that left, or that we killed
        self.vacant: list[str] = []  # hosts of engines that left: replacements go there first

    def identify(self, client: ipp.Client, ids: list[int], timeout: float) -> None:
        """Learn each new engine's pid and host (the name its launcher gave it)."""
        found = fanout.call(client, {eid: eid for eid in ids}, api.process_id, timeout=timeout)
        for eid, (pid, host) in found.values.items():
            self.pid_of[eid], self.host_of[eid] = pid, host
            self.pids.add(pid)
        found.check("asking the new engines for their pids", noun="engine")

    def unknown(self, ids: Iterable[int]) -> list[int]:
        """Those of ``ids`` not identified yet, in order."""
        return sorted(set(ids) - set(self.host_of))

    def live(self, ids: Iterable[int]) -> list[int]:
        """Those of ``ids`` identified and not gone, in order."""
        return [e for e in sorted(ids) if e in self.pid_of and e not in self.gone]

    def engines_of(self, pids: Iterable[int]) -> list[int]:
        """The live engines with these pids (ours only: a pid we never saw reaches none)."""
        by_pid = {p: e for e, p in self.pid_of.items() if e not in self.gone}
        return [by_pid[p] for p in pids if p in self.pids and p in by_pid]

    def leave(self, eid: int) -> None:
        """``eid`` left, or was killed: gone for good, and its host has a vacancy."""
        if eid not in self.gone:
            self.gone.add(eid)
            if self.host_of.get(eid) in self.hosts:
                self.vacant.append(self.host_of[eid])

    def exit_of(self, eid: int, reason: str = "") -> RemoteExit:
        """How ``eid``'s leaving is told: its pid, its host, and why, where known."""
        host = self.host_of.get(eid) or "?"
        return RemoteExit(self.pid_of[eid], host=host, engine_id=eid, reason=reason)

    def hosts_for(self, n: int) -> list[str]:
        """Where ``n`` replacements go: the hosts where engines left first, then each to the
        host with the fewest live engines (the first listed, on a tie)."""
        hosts = []
        while self.vacant and len(hosts) < n:
            hosts.append(self.vacant.pop(0))
        live = Counter(h for e, h in self.host_of.items() if e not in self.gone)
        while len(hosts) < n:
            hosts.append(min(self.hosts, key=lambda h: live[h] + hosts.count(h)))
        return hosts

    def pids_by_host(self) -> dict[str, list[int]]:
        """Live engines' pids on each host."""
        out: dict[str, list[int]] = {}
        for eid, pid in self.pid_of.items():
            if eid not in self.gone:
                out.setdefault(self.host_of[eid] or "?", []).append(pid)
        return out
