"""``%nbdist gc`` and ``%nbdist status`` in a real IPython shell, on a real 1-engine cluster: the
cluster's own files and its run's checkpoints stay (however old), a dead kernel's leftovers go,
the cluster works on; its engine's log is capped while it writes; its hub state goes when it
stops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import assert_gone, wait_until

import nbdist
from nbdist.notebook.cluster.engines import logs
from nbdist.notebook.housekeeping import gc

DAY = 86400.0


def old(path: Path, data: bytes = b"x" * 100, days: float = 30) -> Path:
    """``path`` written with ``data``, and it and its folder made ``days`` old."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    for p in (path, path.parent):
        os.utime(p, (time.time() - days * DAY,) * 2)
    return path


@pytest.fixture
def shell(tmp_path, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    root = tmp_path / "data"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("NBDIST_DATA_DIR", str(root))
    monkeypatch.setattr(gc, "_status", None)
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "nbdist")
    return sh, root


def test_gc_frees_a_dead_kernels_leftovers_and_keeps_the_running_clusters(shell, capsys):
    sh, root = shell
    sh.run_line_magic("nbdist", "start -n 1")
    c = nbdist.current()
    pids = [p.pid for p in c.engines.processes()]
    cid = c.engines.cluster_id
    try:
        sh.run_cell_magic(
            "distributed", "--no-dashboard", "import torch\nnbdist.checkpoint(0, w=torch.ones(2))"
        )
        [mine] = list((root / "checkpoints").iterdir())  # this cell's run, named for the cluster
        assert mine.name.startswith(f"{cid}-")
        kept_files = sorted(f.name for f in mine.iterdir())
        assert any(n.endswith(".pt") for n in kept_files)
        for f in [*mine.iterdir(), mine]:
            os.utime(f, (time.time() - 30 * DAY,) * 2)  # old, but its cluster runs
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()  # a dead kernel's controller: its pid names no process now
        record = {"cluster": {"cluster_id": "nbdist-dead0001"}, "controller": {"state": {}}}
        record["controller"]["state"]["pid"] = gone.pid
        leftovers = [
            old(root / "checkpoints" / "nbdist-dead0001-0000000a" / "step-00000000.pt"),
            old(
                root / "profile/security/cluster-nbdist-dead0001.json", json.dumps(record).encode()
            ),
            old(root / "profile/security/ipcontroller-nbdist-dead0001-engine.json"),
            old(root / "profile/log/enginesnbdist-dead0001.json"),
            old(root / "profile/log/nbdist-dead0001/engine-1.log"),
        ]
        live = sorted((root / "profile" / "security").glob(f"*{cid}*"))
        assert len(live) == 3  # the cluster file and its two connection files
        capsys.readouterr()

        sh.run_line_magic("nbdist", "gc --keep-checkpoints 0 --keep-logs 0")
        shown = capsys.readouterr().out
        assert "kept: 1 older checkpoint folder(s) in use (of a running run or this kernel" in shown
        assert "%nbdist gc --yes frees it" in shown and cid not in shown
        assert all(f.exists() for f in leftovers)  # shown, not freed

        sh.run_line_magic("nbdist", "gc --keep-checkpoints 0 --keep-logs 0 --yes")
        assert "nbdist gc: freed" in capsys.readouterr().out
        assert not any(
            f.exists() for f in [leftovers[0].parent, *leftovers[1:4], leftovers[4].parent]
        )
        assert mine.exists() and all(f.exists() for f in live) and c.engines.log_dir.is_dir()
        assert sorted(f.name for f in mine.iterdir()) == kept_files  # all of it
        assert c.run("1 + 1") == 2  # the cluster works on

        capsys.readouterr()
        sh.run_line_magic("nbdist", "status")
        last = capsys.readouterr().out.splitlines()[-1]
        assert last.startswith(f"data folder {root}: ") and "(checkpoints " in last, last

        log = c.engines.log_dir / f"engine-{c.slots[0].pid}.log"
        c.engines.log_cap.limit = 4096  # the real cap is 10 MB: too much to write in a test
        c.run("import os\nos.write(2, b'z' * 20000)")
        wait_until(lambda: log.stat().st_size > 20000, 10, what="the engine to write its log")
        assert c.engines.log_cap.check() > 0
        assert logs.rotated(log).read_bytes().endswith(b"z" * 4000)
        c.run("os.write(2, b'after the rotation')")
        wait_until(lambda: b"after the rotation" in log.read_bytes(), 10, what="a later line")
        assert log.stat().st_size < 4096  # the engine wrote on, into the emptied log
    finally:
        sh.run_line_magic("nbdist", "stop")
    assert_gone(pids)
    assert not (root / "profile" / "log" / f"engines{cid}.json").exists()  # no hub state left
    assert not list((root / "profile" / "security").iterdir())
    assert os.listdir(root / "profile" / "log") == [cid]  # its logs stay, for a while
