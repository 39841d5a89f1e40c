"""A real IPython kernel for the benchmarks, driven as a notebook front end drives it."""

from __future__ import annotations

import ast
import os
import queue
import subprocess
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


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
