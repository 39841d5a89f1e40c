"""A real IPython kernel, driven as a notebook front end drives it: ``start_kernel()`` gives one
with ``%load_ext nbdist`` done, ``Kernel.run`` executes a cell and returns what it showed
(``CellResult``), ``shutdown_kernel`` shuts it down and checks that nothing it started is left."""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import time
from dataclasses import dataclass, field

import psutil
from processes import assert_gone


@dataclass
class CellResult:
    stdout: str = ""
    stderr: str = ""
    result: str | None = None  # text/plain of the cell's value
    error: dict | None = None  # {"ename", "evalue", "traceback"}
    displays: list = field(default_factory=list)
    seconds: float = 0.0
    # displays updated in place: display id -> each text/plain it showed, in order
    in_place: dict = field(default_factory=dict)


class Kernel:
    """A live kernel with nbdist loaded; ``run`` executes a cell and returns what it showed."""

    def __init__(self, km, kc):
        self.km, self.kc = km, kc

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def run(self, code: str, timeout: float = 120, interrupt_after: float | None = None):
        """Execute ``code`` and wait for it (optionally pressing interrupt after some seconds)."""
        return self.collect(self.submit(code), timeout, interrupt_after)

    def submit(self, code: str) -> tuple[str, float]:
        """Send a cell without waiting; ``collect`` its result later."""
        return self.kc.execute(code), time.monotonic()

    def collect(self, sent: tuple[str, float], timeout: float = 120, interrupt_after=None):
        msg_id, t0 = sent
        res = CellResult()
        interrupted = False
        deadline = t0 + timeout
        while True:
            if interrupt_after is not None and not interrupted:
                if time.monotonic() - t0 > interrupt_after:
                    self.km.interrupt_kernel()
                    interrupted = True
            try:
                msg = self.kc.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"cell {msg_id} did not finish in {timeout} s\n{self.stacks()}"
                    ) from None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    res.stdout += content["text"]
                else:
                    res.stderr += content["text"]
            elif kind == "execute_result":
                res.result = content["data"].get("text/plain")
            elif kind in ("display_data", "update_display_data"):
                if kind == "display_data":
                    res.displays.append(content["data"])
                shown_id = content.get("transient", {}).get("display_id")
                if shown_id is not None and "text/plain" in content["data"]:
                    res.in_place.setdefault(shown_id, []).append(content["data"]["text/plain"])
            elif kind == "error":
                res.error = content
            elif kind == "status" and content["execution_state"] == "idle":
                break
        res.seconds = time.monotonic() - t0
        return res

    def ok(self, code: str, timeout: float = 120) -> CellResult:
        """Run a cell that must succeed."""
        res = self.run(code, timeout)
        assert res.error is None, "\n".join(res.error["traceback"])
        return res

    def stacks(self) -> str:
        """The kernel's Python stacks and its children's (py-spy): where a cell hung."""
        if shutil.which("py-spy") is None:
            return "(py-spy is not installed: no stacks)"
        out = []
        for pid in [self.pid, *self.descendants()]:
            done = subprocess.run(
                ["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
            )
            out.append(f"--- pid {pid}\n{done.stdout}{done.stderr}")
        return "\n".join(out)

    def descendants(self) -> list[int]:
        try:
            return [p.pid for p in psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


def start_kernel() -> Kernel:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env=dict(os.environ))
    k = Kernel(km, kc)
    k.ok("%load_ext nbdist")
    return k


def shutdown_kernel(k: Kernel) -> None:
    pids = k.descendants() + [k.pid]
    k.kc.stop_channels()
    k.km.shutdown_kernel(now=False)
    assert_gone(pids, timeout=15)
