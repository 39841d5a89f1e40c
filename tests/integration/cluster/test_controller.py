"""The controller keeps no database of the tasks it relays (ipyparallel's ``NoDB``): its default,
in memory, kept every task's whole printed output, up to 1,024 tasks (two cells in which 2 ranks
printed 10 MB each grew it by 108 MB; 19-39 MB with none, what its relays' queues leave)."""

from __future__ import annotations

import pytest


def test_the_controller_keeps_no_record_of_the_tasks(cluster):
    cluster.run("print('x' * 1000)")
    with pytest.raises(Exception, match="NoDB"):  # no database of tasks to ask
        cluster.client.hub_history()
    assert cluster.run("1 + 1") == 2  # and the cluster works on
