"""Elastic recovery: when a lost worker cannot be replaced, go on with fewer ranks.

Its own module: it needs a cluster of its own, whose fork server it kills.
"""

from __future__ import annotations

import os
import signal
import threading

from clusters import logged_steps as _steps
from processes import assert_gone, wait_until

from nbdist.config import CellOptions


def test_min_workers_shrinks_and_reshards_when_a_worker_cannot_be_replaced(tmp_path):
    import numpy as np

    import nbdist

    c = nbdist.start(n=2)
    pids = [p.pid for p in c.engines.processes()]
    try:
        X = np.arange(100, dtype=np.float32).reshape(50, 2)
        nbdist.scatter("X", X, shuffle=False)
        log = tmp_path / "steps.log"
        c.run(f"LOG = {str(log)!r}")
        train = (
            "import time\n"
            "start = nbdist.restore(n={'rows': 0})\n"
            "for step in range(start, 30):\n"
            "    time.sleep(0.05)\n"
            "    nbdist.checkpoint(step, every=5, n={'rows': 0})\n"
            "    if nbdist.rank() == 0:\n"
            "        open(LOG, 'a').write(f'{step}\\n')\n"
            "(nbdist.world_size(), len(X))"
        )
        victim = c.slots[1].pid

        def inject():
            wait_until(lambda: len(_steps(log)) >= 8, 60, what="training to start")
            c.engines._forks.proc.kill()  # no engine can be started any more
            os.kill(victim, signal.SIGKILL)

        threading.Thread(target=inject, daemon=True).start()
        world, rows = c.run(train, CellOptions(restarts=1, min_workers=1))
        assert world == 1 and rows == 50  # the whole data set, re-sharded to the one rank left
        assert _steps(log)[-1] == 29
        assert len(c.slots) == 1
    finally:
        c.stop()
        assert_gone(pids)
