"""Waiting for the tests' conditions and processes: a condition polled until it holds, a process
killed once a rank reached the step to die at, and processes checked gone."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil


def wait_until(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it is truthy; fail the test with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def kill_when(flag, pid: int, timeout: float = 60.0) -> threading.Event:
    """From a thread: SIGKILL ``pid`` once the file ``flag`` exists (a rank reached the step to
    die at, and wrote it); the event is set once the signal is sent."""
    killed = threading.Event()

    def _kill() -> None:
        wait_until(flag.exists, timeout, what="the rank to reach the step to die at")
        os.kill(pid, signal.SIGKILL)
        killed.set()

    threading.Thread(target=_kill, daemon=True).start()
    return killed


def assert_gone(procs, timeout: float = 10.0) -> None:
    """Every process in ``procs`` (pids, or psutil.Process objects, which also tell a reused pid
    from the process first seen) has exited; zombies count as gone."""
    procs = [p if isinstance(p, psutil.Process) else _process(p) for p in procs]
    procs = [p for p in procs if p is not None]

    def alive(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def gone():
        return not any(alive(p) for p in procs)

    try:
        wait_until(gone, timeout, what="processes to exit")
    except AssertionError:
        left = [(p.pid, " ".join(p.cmdline())[:100]) for p in procs if alive(p)]
        raise AssertionError(f"still running after {timeout} s: {left}") from None


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
