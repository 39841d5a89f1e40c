"""The sidebar's count of a cluster's engines after a replacement: the engines it has now, a
replaced one not counted as a dead one of the cluster's ("2/2 alive", not "2/3")."""

from __future__ import annotations

import subprocess
import sys
import time

from nbdist.records import registry
from nbdist.records.host import HostRecord
from nbdist.server.clusters import Clusters


def test_a_replaced_engine_is_not_listed_as_a_dead_one(data_dir):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that was an engine and is no more
    # stands for the host and its live engines: named as a host is, running until its stdin ends
    host = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", registry.HOST_MODULE],
        stdin=subprocess.PIPE,
    )
    engines = ({"pid": gone.pid, "rank": 0}, {"pid": host.pid, "rank": 1})
    engines += ({"pid": host.pid, "rank": 0},)  # rank 0's replacement
    record = HostRecord(pid=host.pid, n=2, state="running", started=time.time(), engines=engines)
    registry.write(record)
    try:
        [entry] = Clusters().list()
        assert [(e["rank"], e["alive"]) for e in entry["engines"]] == [(0, True), (1, True)]
    finally:
        host.stdin.close()
        host.wait(timeout=30)
        registry.remove(host.pid)
