"""A command run beside the suite at a small CPU weight: it takes only what the tests leave idle.

On 2 cores the suite's tests wait (heartbeats, deadlines, polls, browsers) about half of the
time. A CPU-bound job beside them at equal weight would slow the tests that time something; in
a cgroup of its own with a small CPU weight (cgroup v2 ``cpu.weight``, v1 ``cpu.shares``) it
yields the cores whenever a test wants them and uses them when none does. That needs root and a
cpu controller; where either is missing, ``start`` returns None and the caller runs the command
in turn (``in_turn``).

Every process the command starts stays in the cgroup, whatever sessions it makes, so ``kill``
reaches them all by PID, and a census (every 0.2 s) records them for the caller to check that
they ended.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from pathlib import Path

import psutil

V2 = Path("/sys/fs/cgroup")
V1 = Path("/sys/fs/cgroup/cpu")
#: An eighth of a test's weight: enough to keep its own heartbeats and deadlines when the
#: tests are busy, little enough that they barely notice it.
WEIGHT_V2, SHARES_V1 = 12, 128
#: What runs beside the suite now, by the name of the test module that will collect it.
RUNNING: dict[str, Background] = {}


def _cgroup(name: str) -> Path | None:
    """A fresh cgroup with a small CPU weight, or None where none can be made."""
    if os.geteuid() != 0:
        return None
    try:
        if (V2 / "cgroup.controllers").exists():
            if "cpu" not in (V2 / "cgroup.subtree_control").read_text().split():
                return None  # not ours to turn on for the whole machine
            cg = V2 / name
            cg.mkdir()
            (cg / "cpu.weight").write_text(str(WEIGHT_V2))
        elif (V1 / "cpu.shares").exists():
            cg = V1 / name
            cg.mkdir()
            (cg / "cpu.shares").write_text(str(SHARES_V1))
        else:
            return None
    except OSError:
        return None
    return cg


class Background:
    """One command running, in its own low-weight cgroup or (``cgroup`` None) at full weight;
    ``seen``: every process it started."""

    def __init__(self, cmd: list[str], cwd: Path, cgroup: Path | None) -> None:
        self.cmd, self.cgroup = cmd, cgroup
        joined = 'echo $$ > "$0" && exec "$@"'  # in the cgroup before the command starts
        into = ["sh", "-c", joined, str(cgroup / "cgroup.procs")] if cgroup else []
        self.proc = subprocess.Popen(
            into + cmd,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.seen: dict[int, psutil.Process] = {}
        self._out: list[str] = ["", ""]
        self._readers = [
            threading.Thread(target=self._read, args=(i, s), daemon=True)
            for i, s in enumerate((self.proc.stdout, self.proc.stderr))
        ]
        for t in self._readers:
            t.start()
        threading.Thread(target=self._census, daemon=True).start()

    def _read(self, i: int, stream) -> None:
        self._out[i] = stream.read()

    def _census(self) -> None:
        me = psutil.Process(self.proc.pid)
        while self.proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                self.seen.update((p.pid, p) for p in me.children(recursive=True))
            time.sleep(0.2)  # the census's sampling interval, not a synchronisation

    def wait(self, timeout: float) -> tuple[int, str, str]:
        """The command's exit status and output; killed (with all it started) past ``timeout``."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.cmd} still running after {timeout:.0f} s") from None
        for t in self._readers:
            t.join(10)
        return self.proc.returncode, self._out[0], self._out[1]

    def kill(self) -> None:
        """Kill every process still in the cgroup (all ours), and the cgroup once empty; with
        no cgroup, the command's own process."""
        if self.cgroup is None:
            self.proc.kill()
            self.proc.wait()
            return
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError):
                for pid in (self.cgroup / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), 9)
            self.proc.poll()
            try:
                self.cgroup.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # poll interval while the killed processes leave


def start(cmd: list[str], cwd: Path, name: str) -> Background | None:
    """Start ``cmd`` at a small CPU weight, or None where no cgroup can give it one."""
    cg = _cgroup(f"nbdist-tests-{name}-{os.getpid()}")
    return Background(cmd, cwd, cg) if cg is not None else None


def in_turn(cmd: list[str], cwd: Path) -> Background:
    """Start ``cmd`` now at full weight (where ``start`` could not run it beside the suite)."""
    return Background(cmd, cwd, None)
