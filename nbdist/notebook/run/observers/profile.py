"""``--profile``: where each rank's step went, shown under the cell when it ends (a row per
rank, the straggler and why), the ranks' traces merged into one in the run's folder, and the
profile kept for ``nbdist.profile()`` (``debug.profile``)."""

from __future__ import annotations

import sys

from ....errors import UsageError
from ...debug import profile
from .base import Observer, RunEnd


class ProfileTable(Observer):
    """Shows and keeps one run's profile, at its end."""

    def __init__(self, run_id: int | None):
        self.run_id = run_id

    def on_end(self, end: RunEnd) -> None:
        if end.profile is None:
            return
        results = {r: st.profile for r, st in end.live.ranks.items() if st.profile}
        try:
            folder = profile.folder_of(self.run_id)
        except (UsageError, OSError) as e:
            print(f"nbdist: the trace is not kept ({e})", file=sys.stderr)
            folder = None
        print(profile.keep(end.profile, results, folder).text(), flush=True)
