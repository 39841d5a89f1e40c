"""``nbdist.gc()``, ``%nbdist gc`` and the data folder's line in ``%nbdist status``.

``gc()`` works out what the retention rule (``config.Retention``; a keyword changes one of its
settings) frees of the data folder, with the shared-memory segments whose maker is gone
(``worker.collectives.segments``), and returns that plan, which shows itself; nothing is freed
until asked: ``plan.free()``, ``gc(dry_run=False)``, or ``%nbdist gc --yes``. Two steps rather
than a question: a cell that waits for an answer blocks the kernel, and fails where nobody
answers (nbconvert, papermill). The plan is worked out again at the moment of freeing, and only
what both show goes.

The status line costs one bounded walk (``STATUS_LIMIT`` entries) and is kept ``STATUS_FOR``
seconds: ``%nbdist status`` may be run often.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from ... import config, datadir
from ...config import Retention
from ...errors import UsageError
from ...telemetry.store import RunStore
from ...worker.collectives import segments
from .. import session
from . import census, inuse
from .census import human
from .plan import Item, Plan, make, shown_path

#: Entries the status line's walk looks at, at most (a checkpoint folder holds a few files).
STATUS_LIMIT = 20_000
#: Seconds a status line is shown again before it is measured anew.
STATUS_FOR = 60.0
#: How many runs the store is asked for: all of them, in practice.
_ALL_RUNS = 10**9

_status: tuple[Path, float, str] | None = None  # (data folder, when, the line)


def rule_of(settings: dict[str, Any]) -> Retention:
    """``Retention`` with ``settings`` (None: the default) changed; one line for a wrong name."""
    names = [f.name for f in fields(Retention)]
    unknown = sorted(set(settings) - set(names))
    if unknown:
        raise UsageError(
            f"nbdist.gc: there is no setting {unknown[0]!r}: the rule's settings are "
            f"{', '.join(names)}"
        )
    return Retention(**{k: v for k, v in settings.items() if v is not None})


def plan(rule: Retention | None = None, limit: int | None = None) -> Plan:
    """What ``rule`` (default: ``Retention()``) frees of the data folder now (nothing freed);
    ``limit`` bounds the walk."""
    rule = rule or Retention()
    root = datadir.check()  # one line when the folder is not fit; None: there is none yet
    if root is None:
        p = Plan(config.data_dir(), rule)
    else:
        store = RunStore()
        try:
            runs = store.list_runs(limit=_ALL_RUNS)
        except sqlite3.Error:  # being written this moment, or damaged: runs are left alone
            runs = None
        use = inuse.look(root, runs, session.current(required=False))
        p = make(census.take(root, limit), use, runs, rule, store)
    p.items += [Item("segments", str(s.path), s.bytes, s.path) for s in segments.leftovers()]
    p.recheck = lambda: plan(rule)
    return p


def gc(dry_run: bool = True, **rule: Any) -> Plan:
    """What the retention rule frees of the data folder, shown; freed too with ``dry_run=False``
    (or later: ``.free()`` on what this returns). Keywords change the rule's settings
    (``keep_checkpoints``, ``keep_runs``, ``keep_days``, ``keep_logs``, ``log_bytes``: see
    ``nbdist.config.Retention``). Never frees what a running cluster or run uses."""
    global _status
    if not isinstance(dry_run, bool):
        raise UsageError(f"nbdist.gc: dry_run must be True or False, not {dry_run!r}")
    p = plan(rule_of(rule))
    if not dry_run:
        p.free()
        _status = None
    return p


def command(yes: bool, **rule: Any) -> None:
    """``%nbdist gc [--yes]``: show the plan; with ``yes``, free it and say what was freed."""
    global _status
    p = gc(dry_run=True, **rule)
    print(p.text(hint=not yes))
    if yes and p.items:
        p.free()
        _status = None
        print(f"nbdist gc: {p.outcome()}")


def status_line() -> str:
    """``data folder ~/...: 1.2 GB (checkpoints 1.1 GB, runs 80 MB, logs 3 MB); %nbdist gc
    frees 900 MB``: measured at most every ``STATUS_FOR`` seconds."""
    global _status
    root = config.data_dir()
    if _status is not None and _status[0] == root and time.monotonic() - _status[1] < STATUS_FOR:
        return _status[2]
    try:
        p = plan(limit=STATUS_LIMIT)
    except (UsageError, OSError, sqlite3.Error) as e:
        return f"data folder {root}: not measured ({e})"
    line = _line(p)
    _status = (root, time.monotonic(), line)
    return line


def _line(p: Plan) -> str:
    at_least = "" if p.complete else "at least "
    main = ("checkpoints", "runs", "logs")  # the rest is small unless something is wrong
    shown = [(k, n) for k, n in p.sizes.items() if n and (k in main or n >= 10**6)]
    parts = ", ".join(f"{k} {human(n)}" for k, n in shown)
    line = f"data folder {shown_path(p.root)}: {at_least}{human(p.total)}"
    line += f" ({parts})" if parts else ""
    if p.items:
        return line + f"; %nbdist gc frees {at_least}{p.frees()}"
    return line + "; nothing for %nbdist gc to free"
