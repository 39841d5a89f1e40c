"""Fresh engines given their state back: what the lost ones kept, or the journal run again.

After recovery replaces an engine, the new one has none of the names that earlier cells and
scatters defined. ``give_back`` first has each fresh engine take over the state its lost one
kept at the end of its last good cell (``worker.continuity.snapshot``: its names, nbdist's
objects among them, its random state; when the cell runs again, each survivor goes back to its
own, as a replay would have left it), and sends it its scatters' shards again: no earlier cell
runs again, on any rank, however long they ran. Where a fresh engine finds no kept state (its
host is gone, or the state was too large or could not be kept), it says so in one line and
``replay`` redoes the journal (``cluster.journal``) in order on every rank, as before: each
scatter sent again (re-sharded for the current world size), each cell that succeeded run again
under its own run key, so a training cell resumes from its own last checkpoint
(``nbdist.restore()``), not from the start.
"""

from __future__ import annotations

import contextlib
import io

from ...config import CellOptions
from ...errors import DistributedCellError, NbdistError
from ...worker import api
from ..cluster import fanout
from ..cluster.journal import CellEntry
from ..cluster.ranks import Ranks
from .supervisor import CellRun, Launch

#: Seconds a fresh engine may take to read its lost engine's state back.
GIVE_BACK_TIMEOUT = 300.0


def give_back(cluster: Ranks, fresh: list[int], again: bool = False) -> str:
    """The fresh engines of ``fresh`` take their lost engines' kept states, and get their
    shards again; with ``again`` (the cell runs again) every other rank goes back to its own
    kept state too, so that all start it where the last good cell left them. Where one cannot,
    the journal is run again on every rank. The lines to show."""
    ranks = range(len(cluster.slots)) if again else fresh
    got = fanout.on_ranks(
        cluster, api.bring_back, list(fresh), ranks=ranks, timeout=GIVE_BACK_TIMEOUT
    )
    lines = [line for r in sorted(got.values) for line in got.values[r]]
    if got.failures:
        why = fanout.describe_failures(got.failures)
        lines.append(f"nbdist: no state kept to bring back ({why}): earlier cells run again")
        replay(cluster)
    else:
        _resend(cluster)
    return "\n".join(lines)


def _resend(cluster: Ranks) -> None:
    """The journal's scatters sent again (every rank gets its shard, re-sharded as before)."""
    for entry in cluster.journal:
        if not isinstance(entry, CellEntry):
            with contextlib.redirect_stdout(io.StringIO()):
                note = entry()
            if isinstance(note, str):
                print(note)


def replay(cluster: Ranks) -> None:
    """Run ``cluster``'s journal again on every rank; an NbdistError naming the entry that
    could not be redone."""
    journal = cluster.journal
    journal.replaying = True
    try:
        _replay(cluster)
    finally:
        journal.replaying = False


def _replay(cluster: Ranks) -> None:
    notes = ""  # scatters that could not be redone: said at once, and with a failure
    for i, entry in enumerate(cluster.journal):
        if not isinstance(entry, CellEntry):  # a scatter: re-sent, re-sharded
            with contextlib.redirect_stdout(io.StringIO()):
                note = entry()
            if isinstance(note, str):
                print(note)
                notes += f" ({note})"
            continue
        opts = CellOptions(ranks=entry.ranks, quiet=True)
        full = entry.ranks is None
        ranks = entry.ranks if entry.ranks is not None else tuple(s.rank for s in cluster.slots)
        groups = cluster.group_of() if full and not cluster.group_ready else {}
        launch = Launch(entry.program, opts, ranks, groups, entry.run_key, rebind=full)
        report = CellRun(cluster, launch).wait()
        if report.failures or report.interrupted:
            err = DistributedCellError(report.failures or [], "") if report.failures else None
            raise NbdistError(
                f"recovery failed while replaying earlier cell #{i + 1}: "
                f"{err or 'interrupted'}{notes}"
            )
        if full:
            cluster.note_group(not report.group_broken)
