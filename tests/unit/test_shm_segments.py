"""Shared-memory segments are never left behind (``nbdist.worker.collectives.segments``): a local
group whose agreement fails (its peer dies) leaves no file and no descriptor; an interrupt while
the file is allocated takes it away; a file whose maker is gone is removed by ``%nbdist gc`` and
by the fork server as it starts, while a live maker's, another user's, a link and a name that
does not say its maker stay. Real processes, real files; the leftovers are made in a folder of
the test's own (the temp folder, where segments go when /dev/shm has no room), so that no other
process's gc sees them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from processes import assert_gone, wait_until

import nbdist
from nbdist.launch.lifeline import identity
from nbdist.notebook.housekeeping import gc
from nbdist.worker.collectives import group, segments, shared_memory

pytestmark = pytest.mark.skipif(not shared_memory.supported(), reason="x86-64 Linux only")

#: Rank 0 of a 2-rank local group agreeing through a file store; rank 1, forked, opens the
#: segment and dies before it says so. Prints what rank 0 is left with.
_PEER_DIES = r"""
import datetime, json, os, sys
import torch.distributed as dist
from nbdist.worker.collectives import group

store_path = sys.argv[1]
child = os.fork()
store = dist.FileStore(store_path, 2)
store.set_timeout(datetime.timedelta(seconds=2))
if child == 0:
    path = store.get("shm/path").decode()
    os.open(path, os.O_RDWR)
    os._exit(1)  # dies while the group forms
try:
    group._open(store, 0, 2, 30.0)
    ended = "formed"
except BaseException as e:
    ended = f"{type(e).__name__}: {e}"
os.waitpid(child, 0)
path = store.get("shm/path").decode()
fds = []
for n in os.listdir("/proc/self/fd"):
    try:
        fds.append(os.readlink(f"/proc/self/fd/{n}"))
    except FileNotFoundError:  # the listing's own descriptor, closed
        pass
print(json.dumps({"ended": ended, "path": path, "fds": [f for f in fds if "nbdist-shm-" in f]}))
"""


def test_a_group_whose_peer_dies_while_agreeing_leaves_no_segment_and_no_descriptor(tmp_path):
    args = [sys.executable, "-c", _PEER_DIES, str(tmp_path / "store")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["ended"].startswith("RuntimeError") and "imeout" in got["ended"], got
    assert got["fds"] == []
    assert got["path"].startswith(f"/dev/shm/{segments.PREFIX}")
    assert not os.path.exists(got["path"])


def test_an_interrupt_while_the_segment_is_allocated_takes_the_file_away(monkeypatch):
    made = []

    def interrupted(fd, offset, size):
        made.append(os.readlink(f"/proc/self/fd/{fd}"))
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "posix_fallocate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        group._make(1 << 20)
    assert made and not os.path.exists(made[0])
    assert os.path.basename(made[0]).startswith(segments.prefix())  # named for its maker


def _left_by_a_gone_maker(folder: Path) -> Path:
    """A segment file made (and named) by a process that then exited without removing it."""
    made = subprocess.run(
        [sys.executable, "-c", _MAKER, str(folder)], capture_output=True, text=True, check=True
    )
    return Path(made.stdout.strip())


_MAKER = """
import sys, tempfile
from nbdist.worker.collectives import segments
fd, path = tempfile.mkstemp(prefix=segments.prefix(), dir=sys.argv[1])
print(path)
"""


def _kept(folder: Path, gone: Path) -> list[Path]:
    """Files beside ``gone`` that must stay: this live process's segment, another user's and a
    link under a gone maker's name, a name that says no maker, another pid namespace's."""
    live = Path(tempfile.mkstemp(prefix=segments.prefix(), dir=folder)[1])
    theirs = folder / (gone.name + "theirs")
    theirs.write_bytes(b"x")
    os.chown(theirs, 65534, 65534)
    target = folder / "target"
    target.write_bytes(b"x")
    link = folder / (gone.name + "link")
    link.symlink_to(target)
    old = folder / "nbdist-shm-abc123xy"
    old.write_bytes(b"x")
    pid, start, ns = gone.name.removeprefix(segments.PREFIX).split("-")[0].split(".")
    elsewhere = folder / f"{segments.PREFIX}{pid}.{start}.{int(ns) + 1}-abc"
    elsewhere.write_bytes(b"x")
    return [live, theirs, target, link, old, elsewhere]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """The temp folder, where segments are made when /dev/shm has no room: this test's own."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    monkeypatch.setenv("NBDIST_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(gc, "_status", None)
    return path


def test_gc_removes_a_gone_makers_segment_and_keeps_the_rest(folder):
    gone = _left_by_a_gone_maker(folder)
    kept = _kept(folder, gone)
    p = nbdist.gc()
    planned = [i.path for i in p.items if i.kind == "segments"]
    assert gone in planned and not set(kept) & set(planned)
    assert "segments" in str(p) and gone.exists()  # shown, not freed until asked
    p.free()
    assert not gone.exists() and all(os.path.lexists(k) for k in kept)
    assert not p.failed


def test_the_fork_server_removes_a_gone_makers_segment_as_it_starts(folder):
    gone = _left_by_a_gone_maker(folder)
    kept = _kept(folder, gone)
    env = dict(os.environ, TMPDIR=str(folder), NBDIST_PARENT_PID=identity())
    args = [sys.executable, "-m", "nbdist.launch.forkserver", "60"]
    server = subprocess.Popen(args, stdin=subprocess.PIPE, env=env, start_new_session=True)
    try:
        wait_until(lambda: not gone.exists(), 60, what="the fork server's sweep")
        assert all(os.path.lexists(k) for k in kept)
    finally:
        server.stdin.close()  # the kernel gone: it leaves
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    assert_gone([server.pid])
