"""Fresh engines given their names back: the cluster's journal run again on every rank.

After recovery replaces an engine, the new one has none of the names that earlier cells and
scatters defined. ``replay`` redoes the journal (``cluster.journal``) in order: each scatter is
sent again (re-sharded for the current world size), each cell that succeeded runs again under
its own run key, so a training cell resumes from its own last checkpoint
(``nbdist.restore()``), not from the start.
"""

from __future__ import annotations

import contextlib
import io

from ...config import CellOptions
from ...errors import DistributedCellError, NbdistError
from ..cluster.journal import CellEntry
from ..cluster.ranks import Ranks
from .supervisor import CellRun, Launch


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
        launch = Launch(entry.program, opts, ranks, groups, entry.run_key)
        report = CellRun(cluster, launch).wait()
        if report.failures or report.interrupted:
            err = DistributedCellError(report.failures or [], "") if report.failures else None
            raise NbdistError(
                f"recovery failed while replaying earlier cell #{i + 1}: "
                f"{err or 'interrupted'}{notes}"
            )
        if full:
            cluster.note_group(not report.group_broken)
