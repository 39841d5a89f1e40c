"""The retention rule applied: what gc would free, kind by kind, with sizes; freed when asked.

``make`` is pure: a census, what is in use (``inuse``), the run store's runs and a
``config.Retention`` in, a ``Plan`` out. What goes:

- checkpoints: folders beyond the last ``keep_checkpoints`` runs' (by last write) that are not
  in use, and what an interrupted gc left (``.gc-*``);
- runs: runs beyond the newest ``keep_runs`` that started before the last ``keep_days`` and do
  not run: their rows (``RunStore.delete_run``: the store's pages are reused by later runs, its
  file does not shrink) and profile folders; profile folders of runs the store no longer has;
- logs: the log folders (and controller logs) of clusters that are gone, beyond the last
  ``keep_logs`` clusters'; logs kept that are over ``log_bytes`` are rotated (``engines.logs``);
- clusters: what clusters and hosts that are gone left: cluster and connection files, hub
  states, a dead host's record, socket and lease (``records.registry.remove``);
- segments: outside the data folder, shared-memory files (``/dev/shm/nbdist-shm-*``) whose
  maker is gone (``worker.collectives.segments``: added by ``gc.plan``, removed through it).

``Plan.free`` looks again first (``recheck``) and frees only what the plan showed and the rule
still lets go now: a cluster started since keeps its files.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import stat
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...config import Retention
from ...records import registry
from ...telemetry.store import RunStore
from ...worker.collectives import segments
from ..cluster.engines import logs
from .census import Census, Entry, human
from .inuse import InUse

KINDS = ("checkpoints", "runs", "logs", "clusters", "segments")
_CONTROLLER_LOG = re.compile(r"ipcontroller-(?P<cid>.+)-\d+\.log(\.1)?")
_HUB_STATE = re.compile(r"engines(?P<cid>.+)\.json")
_SECURITY = re.compile(r"cluster-(?P<cid>.+)\.json|ipcontroller-(?P<conn>.+)-(client|engine)\.json")
_HOST_FILE = re.compile(r"host-(?P<pid>\d+)\.(json|sock|lease)")
_SHOWN = 3  # names shown per kind


@dataclass(frozen=True)
class Item:
    """One thing the plan frees: a file or folder (``path``), a run's rows (``run_id``), a dead
    host's files (``host``), or a log to rotate (``rotate``); ``bytes`` freed on disk, ``rows``
    the run's estimated share of the store's file."""

    kind: str
    what: str
    bytes: int = 0
    path: Path | None = None
    run_id: int | None = None
    host: int | None = None
    rotate: bool = False
    rows: int = 0

    @property
    def key(self) -> tuple:
        return (self.kind, str(self.path), self.run_id, self.host, self.rotate)


@dataclass(repr=False)
class Plan:
    """What ``rule`` frees of the data folder ``root`` (``total`` bytes); ``free()`` frees it."""

    root: Path
    rule: Retention
    items: list[Item] = field(default_factory=list)
    total: int = 0
    sizes: dict[str, int] = field(default_factory=dict)  # the data folder's bytes by kind
    complete: bool = True
    kept: Counter = field(default_factory=Counter)  # why something old stays: how many
    store: RunStore | None = None
    recheck: Callable[[], Plan] | None = None
    freed: int | None = None
    failed: list[str] = field(default_factory=list)
    spared: list[Item] = field(default_factory=list)  # in use by the time it was freed

    def bytes(self, kind: str | None = None) -> int:
        """Bytes the plan frees on disk (of ``kind``, or in all)."""
        return sum(i.bytes for i in self.items if kind is None or i.kind == kind)

    def frees(self) -> str:
        """What the plan frees, in words: ``900 MB and 120 old runs``."""
        runs = sum(1 for i in self.items if i.run_id is not None)
        return human(self.bytes()) + (f" and {runs} old run(s)" if runs else "")

    def free(self) -> Plan:
        """Free what the plan lists and the rule still lets go (looked at again first)."""
        if self.freed is not None:
            return self
        allowed = {i.key for i in self.recheck().items} if self.recheck else None
        freed = 0
        for item in self.items:
            if allowed is not None and item.key not in allowed:
                self.spared.append(item)
                continue
            try:
                self._free(item)
            except (OSError, sqlite3.Error) as e:
                self.failed.append(f"{item.what}: {getattr(e, 'strerror', None) or e}")
                continue
            freed += item.bytes
        self.freed = freed
        return self

    def _free(self, item: Item) -> None:
        if item.run_id is not None and self.store is not None:
            self.store.delete_run(item.run_id)  # its rows, in one transaction
        if item.host is not None:
            registry.remove(item.host)
        if item.path is None:
            return
        if item.kind == "segments":
            segments.remove(item.path)  # only if its maker is still gone
            return
        if item.rotate:
            logs.rotate(item.path, self.rule.log_bytes)
            return
        try:
            st = os.stat(item.path, follow_symlinks=False)
        except FileNotFoundError:
            return  # gone already
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(item.path)
            return
        target = item.path
        if item.kind == "checkpoints" and not target.name.startswith(".gc-"):
            target = _aside(item.path)  # gone at once for readers; the rest then, or next time
            os.rename(item.path, target)
        shutil.rmtree(target)

    # -- shown ----------------------------------------------------------------------------------
    def summary(self) -> str:
        """One line per kind that frees something: bytes, how many, the first few names."""
        lines = []
        for kind in KINDS:
            items = [i for i in self.items if i.kind == kind]
            if not items:
                continue
            names = ", ".join(i.what for i in items[:_SHOWN])
            more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
            rows = sum(i.rows for i in items)
            extra = f" (and ~{human(rows)} of runs.sqlite, reused by later runs)" if rows else ""
            lines.append(f"  {kind:<11} {human(self.bytes(kind)):>7}  {names}{more}{extra}")
        lines += [f"  kept: {n} {why}" for why, n in sorted(self.kept.items())]
        return "\n".join(lines)

    def text(self, hint: bool = True) -> str:
        """The plan as shown (after ``free``: what was freed); ``hint``: how to free it."""
        at = shown_path(self.root)
        partial = "" if self.complete else " at least"
        if self.freed is None:
            head = f"nbdist gc: {at} holds{partial} {human(self.total)}; "
            head += f"the rule frees {self.frees()}" if self.items else "nothing to free"
        else:
            head = f"nbdist gc: {self.outcome()} in {at}"
        lines = [head]
        if self.items or self.kept:
            lines.append(self.summary())
        lines.append(f"  rule: {describe(self.rule)} (nbdist.config.Retention)")
        if self.freed is None and self.items and hint:
            lines.append("%nbdist gc --yes frees it (from Python: nbdist.gc().free())")
        return "\n".join(lines)

    def outcome(self) -> str:
        """What ``free`` did, in one line."""
        line = f"freed {human(self.freed or 0)}"
        line += "".join(f"; not freed: {f}" for f in self.failed[:3])
        if len(self.failed) > 3:
            line += f" and {len(self.failed) - 3} more"
        if self.spared:
            line += f"; kept {len(self.spared)} item(s) in use by then"
        return line

    def __str__(self) -> str:
        return self.text()

    __repr__ = __str__

    def _repr_pretty_(self, p, cycle: bool) -> None:
        p.text(str(self))


def describe(rule: Retention) -> str:
    """The rule in a few words."""
    return (
        f"keep the last {rule.keep_checkpoints} runs' checkpoints, the newest {rule.keep_runs} "
        f"runs and any of the last {rule.keep_days:g} days, the last {rule.keep_logs} clusters' "
        f"logs, logs up to {human(rule.log_bytes)}"
    )


def shown_path(path: Path) -> str:
    """``path`` with the home folder written ``~``."""
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home) :] if text == home or text.startswith(home + os.sep) else text


def _aside(path: Path) -> Path:
    for n in range(1000):
        target = path.with_name(f".gc-{path.name}" + (f".{n}" if n else ""))
        if not os.path.lexists(target):
            return target
    raise OSError(f"too many folders named .gc-{path.name}* beside it: remove them")


# -- the rule -------------------------------------------------------------------------------------


def make(
    census: Census,
    use: InUse,
    runs: list[dict] | None,
    rule: Retention,
    store: RunStore | None = None,
) -> Plan:
    """What ``rule`` frees of the data folder ``census`` found (``config.data_dir()``: a dead
    host's files go through ``records.registry``), keeping what ``use`` says is in use; ``runs``
    (the store's, as ``list_runs`` gives them; None: unknown) to judge runs, deleted through
    ``store`` (default: the data folder's)."""
    store = store or RunStore(census.root / "runs.sqlite")
    plan = Plan(census.root, rule, total=census.total, sizes=dict(census.sizes), store=store)
    plan.complete = census.complete
    _checkpoints(plan, census, use)
    if runs is not None:
        _runs(plan, census, use, runs)
    gone = _logs(plan, census, use)
    _rotations(plan, census, gone)
    _clusters(plan, census, use)
    return plan


def _rel(plan: Plan, path: Path) -> str:
    try:
        return str(path.relative_to(plan.root))
    except ValueError:
        return str(path)


def _checkpoints(plan: Plan, census: Census, use: InUse) -> None:
    keep = plan.rule.keep_checkpoints
    ranked = 0
    for e in sorted(census.checkpoints, key=lambda e: e.mtime, reverse=True):
        if not e.folder:
            continue
        if e.name.startswith(".gc-"):
            plan.items.append(Item("checkpoints", _rel(plan, e.path), e.bytes, e.path))
            continue
        if e.name.startswith("."):
            continue  # not a run's folder: a name nbdist never gives one
        ranked += 1
        if ranked <= keep:
            continue
        why = use.holds(e.name, e.mtime)
        if why:
            plan.kept[f"older checkpoint folder(s) in use ({why})"] += 1
            continue
        plan.items.append(Item("checkpoints", e.name, e.bytes, e.path))


def _runs(plan: Plan, census: Census, use: InUse, runs: list[dict]) -> None:
    rule = plan.rule
    runs = sorted(runs, key=lambda r: r["id"], reverse=True)
    profiles = {e.name: e for e in census.profiles if e.folder}
    per_run = sum(e.bytes for e in census.store) // max(1, len(runs))
    cutoff = use.now - rule.keep_days * 86400
    for i, run in enumerate(runs):
        if i < rule.keep_runs or (run.get("started") or 0) >= cutoff:
            continue
        if run.get("status") == "running":
            plan.kept["old run(s) still running"] += 1
            continue
        prof = profiles.get(str(run["id"]))
        name = f"run {run['id']}" + (f" {run['name']!r}" if run.get("name") else "")
        path = prof.path if prof else None
        size = prof.bytes if prof else 0
        plan.items.append(Item("runs", name, size, path, run_id=run["id"], rows=per_run))
    ids = {str(r["id"]) for r in runs}
    for name, e in sorted(profiles.items()):
        if name.isdigit() and name not in ids and not use.young(e.mtime):
            plan.items.append(Item("runs", _rel(plan, e.path), e.bytes, e.path))


def _logs(plan: Plan, census: Census, use: InUse) -> set[Path]:
    """Log folders and controller logs of gone clusters beyond the last ``keep_logs``; the
    paths planned away."""
    log_root = plan.root / "profile" / "log"
    groups: dict[str, list[Entry]] = defaultdict(list)
    for e in census.log_dirs:
        groups[e.name].append(e)
    for e in census.loose:
        if e.path.parent == log_root and (m := _CONTROLLER_LOG.fullmatch(e.name)):
            groups[m["cid"]].append(e)
    gone = [
        (max(e.mtime for e in es), cid, es)
        for cid, es in groups.items()
        if cid not in use.clusters and not any(use.young(e.mtime) for e in es)
    ]
    planned: set[Path] = set()
    for *_, es in sorted(gone, reverse=True)[plan.rule.keep_logs :]:
        for e in es:
            plan.items.append(Item("logs", _rel(plan, e.path), e.bytes, e.path))
            planned.add(e.path)
    return planned


def _rotations(plan: Plan, census: Census, gone: set[Path]) -> None:
    cap = plan.rule.log_bytes
    for e in census.logs:
        if e.bytes > cap and e.path not in gone and e.path.parent not in gone:
            what = f"{_rel(plan, e.path)} (rotated)"
            plan.items.append(Item("logs", what, e.bytes - cap, e.path, rotate=True))


def _clusters(plan: Plan, census: Census, use: InUse) -> None:
    log_root = plan.root / "profile" / "log"
    security = plan.root / "profile" / "security"
    hosts: dict[int, list[Entry]] = defaultdict(list)
    for e in census.loose:
        cid = None
        if e.folder:
            continue
        if e.path.parent == log_root and (m := _HUB_STATE.fullmatch(e.name)):
            cid = m["cid"]
        elif e.path.parent == security and (m := _SECURITY.fullmatch(e.name)):
            cid = m["cid"] or m["conn"]
        elif e.path.parent == plan.root / "clusters" and (m := _HOST_FILE.fullmatch(e.name)):
            hosts[int(m["pid"])].append(e)
        if cid is not None and cid not in use.clusters and not use.young(e.mtime):
            plan.items.append(Item("clusters", _rel(plan, e.path), e.bytes, e.path))
    for e in census.kept:  # ranks' states kept for replacements: a gone cluster's are of no use
        if e.name not in use.clusters and not use.young(e.mtime):
            plan.items.append(Item("clusters", _rel(plan, e.path), e.bytes, e.path))
    for pid, es in sorted(hosts.items()):
        if pid not in use.hosts and not any(use.young(e.mtime) for e in es):
            size = sum(e.bytes for e in es)
            plan.items.append(Item("clusters", f"clusters/host-{pid}.*", size, host=pid))
