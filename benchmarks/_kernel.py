"""A real IPython kernel for the benchmarks, driven as a notebook front end drives it; and the
CPU time of processes and threads on this host (``cpu_seconds``), to see where a run's CPU goes."""

from __future__ import annotations

import ast
import os
import queue
import subprocess
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds(pids: list[int], thread_pids: list[int] = ()) -> dict:
    """CPU time so far (s) of each process in ``pids`` and of each thread of the processes in
    ``thread_pids``, with the ``time.monotonic()`` of the reading.

    ``{"t": ..., "procs": {pid: s}, "threads": {pid: {tid: (name, s)}}}``; processes that are
    gone are left out. A process's time is psutil's user + system (10 ms steps); a thread's is
    read from ``/proc/PID/task`` (Linux; elsewhere none): its run time in ns from ``schedstat``,
    or its ticks from ``stat``; ``name`` is the kernel's name of the thread (``comm``: "python"
    unless the thread named itself). Cheap enough to call from a training loop.
    """
    out: dict = {"t": time.monotonic(), "procs": {}, "threads": {}}
    for pid in pids:
        try:
            c = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        out["procs"][pid] = c.user + c.system
    for pid in thread_pids:
        threads = out["threads"][pid] = {}
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                threads[int(task.name)] = ((task / "comm").read_text().strip(), _run_time(task))
            except (OSError, ValueError):  # the thread ended meanwhile
                continue
    return out


def cpu_total(procs: list[psutil.Process]) -> float:
    """User + system seconds of ``procs`` so far (those gone count nothing)."""
    total = 0.0
    for p in procs:
        try:
            c = p.cpu_times()
        except psutil.Error:
            continue
        total += c.user + c.system
    return total


def _run_time(task: Path) -> float:
    """Seconds a thread (``/proc/PID/task/TID``) has run on a CPU."""
    try:
        return int((task / "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):  # a kernel without schedstats: ticks, then
        utime, stime = (task / "stat").read_text().rsplit(")", 1)[1].split()[11:13]
        return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


class Kernel:
    """A live ``python3`` kernel in the repository root; ``value(code)`` runs a cell."""

    def __init__(self, env: dict[str, str] | None = None):
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(
            kernel_name="python3",
            cwd=str(ROOT),
            env={**os.environ, **(env or {})},
            stderr=subprocess.DEVNULL,  # the kernel's start-up chatter; cell errors come by iopub
        )
        self.pid = self.km.provisioner.process.pid

    def run(self, code: str, timeout: float = 600) -> tuple[str | None, str]:
        """Run a cell; return its value's text and its output. A failed cell raises."""
        msg_id = self.kc.execute(code)
        deadline = time.monotonic() + timeout
        result, out, error = None, [], None
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                if not self.km.is_alive():  # killed (the OOM killer): no reply will come
                    raise RuntimeError(f"the kernel died running: {code[:80]}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"cell did not finish in {timeout} s: {code[:80]}") from None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind == "execute_result":
                result = content["data"].get("text/plain")
            elif kind == "error":
                error = f"{content['ename']}: {content['evalue']}"
            elif kind == "status" and content["execution_state"] == "idle":
                break
        if error is not None:
            raise RuntimeError(f"benchmark cell failed: {error}\n{''.join(out)[-2000:]}")
        return result, "".join(out)

    def value(self, code: str, timeout: float = 600):
        """Run a cell whose last expression is a literal (number, dict...); return that value."""
        text, out = self.run(code, timeout)
        if text is None:
            raise RuntimeError(f"benchmark cell returned nothing: {code[:80]}\n{out[-2000:]}")
        return ast.literal_eval(text)

    def descendants(self) -> list[psutil.Process]:
        """Every process the kernel started, and theirs (controller, fork server, engines...)."""
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def shutdown(self) -> None:
        """Stop the kernel and every process it started (by PID), waiting for them to go."""
        try:
            procs = [psutil.Process(self.pid), *psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)
        _, alive = psutil.wait_procs(procs, timeout=15)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)

    def __enter__(self) -> Kernel:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
