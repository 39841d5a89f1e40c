"""A CPU quota on one process, by cgroup: ``with quota(pid, share): ...`` slows it from outside.

The process (all its threads) is moved into a cgroup of its own, ``nbdist-bench-<our pid>``,
whose CPU bandwidth is ``share`` of one core: cgroup v2's ``cpu.max`` (``/sys/fs/cgroup``, the
``cpu`` controller enabled in its ``subtree_control`` if it is not yet), or, where the machine
mounts cgroup v1 (``/sys/fs/cgroup`` a tmpfs), the v1 ``cpu`` hierarchy's ``cpu.cfs_quota_us``.
On the way out, always, whatever is in the cgroup goes back to where the process was, and the
cgroup is removed (and ``+cpu``, if we enabled it, is disabled again). ``unavailable()`` says why
none can be made here (not root, no cpu controller), or None.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

V2 = Path("/sys/fs/cgroup")
V1 = Path("/sys/fs/cgroup/cpu")
PERIOD = 100_000  # µs


def _hierarchy() -> tuple[str, Path]:
    """("v2" or "v1", the hierarchy's root), or ``OSError`` saying why there is none."""
    if os.geteuid() != 0:
        raise OSError("a CPU quota by cgroup needs root")
    if (V2 / "cgroup.controllers").exists():
        if "cpu" not in (V2 / "cgroup.controllers").read_text().split():
            raise OSError("cgroup v2 has no cpu controller here (cgroup.controllers)")
        return "v2", V2
    if (V1 / "cpu.cfs_quota_us").exists():
        return "v1", V1
    raise OSError("no cgroup v2 at /sys/fs/cgroup and no cgroup v1 cpu hierarchy")


def unavailable() -> str | None:
    """Why ``quota`` cannot work here (None when it can): tried on a cgroup of our own."""
    try:
        kind, root = _hierarchy()
        with _enabled(kind, root):
            probe = root / f"nbdist-probe-{os.getpid()}"
            probe.mkdir()
            probe.rmdir()
    except OSError as e:
        return str(e)
    return None


@contextlib.contextmanager
def _enabled(kind: str, root: Path) -> Iterator[None]:
    """cgroup v2: the cpu controller on in ``root``'s children while inside (if it was not)."""
    subtree = root / "cgroup.subtree_control"
    added = kind == "v2" and "cpu" not in subtree.read_text().split()
    if added:
        subtree.write_text("+cpu")
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(OSError):  # busy: another cgroup uses it now
                subtree.write_text("-cpu")


def _home(pid: int, kind: str, root: Path) -> Path:
    """The cgroup ``pid`` is in now, in this hierarchy (the root when it cannot be read)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (kind == "v2" and controllers == "") or (
            kind == "v1" and "cpu" in controllers.split(",")
        ):
            home = root / path.lstrip("/")
            return home if home.is_dir() else root
    return root


@contextlib.contextmanager
def quota(pid: int, share: float) -> Iterator[str]:
    """Process ``pid`` held to ``share`` of one core while inside; yields what was set."""
    kind, root = _hierarchy()
    usec = max(1000, round(share * PERIOD))
    with _enabled(kind, root):
        home = _home(pid, kind, root)
        cg = root / f"nbdist-bench-{os.getpid()}"
        cg.mkdir()
        try:
            if kind == "v2":
                (cg / "cpu.max").write_text(f"{usec} {PERIOD}")
            else:
                (cg / "cpu.cfs_period_us").write_text(str(PERIOD))
                (cg / "cpu.cfs_quota_us").write_text(str(usec))
            (cg / "cgroup.procs").write_text(str(pid))
            yield f"cgroup {kind} {usec}/{PERIOD} µs"
        finally:
            _remove(cg, home)


def _remove(cg: Path, home: Path) -> None:
    """Every process in ``cg`` back to ``home`` (or the root), then ``cg`` removed (a process
    that is just exiting may hold it a moment: polled, 10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        for pid in (cg / "cgroup.procs").read_text().split():
            for to in (home, cg.parent):  # where it was; the root if that refuses it
                with contextlib.suppress(OSError):  # gone meanwhile, or refused
                    (to / "cgroup.procs").write_text(pid)
                    break
        try:
            cg.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # poll interval while the cgroup empties
