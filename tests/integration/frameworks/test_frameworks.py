"""Real frameworks' training scripts, run under torchrun and with ``%nbdist run``: same results.

Every script in ``tests/frameworks/`` is written for torchrun, with nothing nbdist-specific in it
but the framework's one dashboard line (an adapter that does nothing under torchrun, and feeds
the run store on engines, which the test checks), and rank 0 writes ``--out`` (final loss, a
parameter checksum, world size, steps). Each runs once under ``torchrun --nproc-per-node 2``
(the baseline) and once with ``%nbdist run`` on one 2-engine cluster shared by the whole module;
the results must be identical, bit for bit: both launchers run one intra-op thread per rank (the
scripts call ``torch.set_num_threads(1)``), the same seeds, and a 2-rank gloo sum does not
depend on the order. After every run the cluster must still form a
process group: a framework's teardown, signal handlers and ``sys.exit`` must not break engines.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import ROOT
from processes import assert_gone

SCRIPTS = ROOT / "tests" / "frameworks"
TEARDOWN_ABORT = "terminate called without an active exception"

ALL_REDUCE_OF_ONES = (
    "%%distributed\nimport torch\nt = torch.ones(1)\ntorch.distributed.all_reduce(t)\nt.item()"
)


@pytest.fixture(scope="module")
def nb(kernel):
    """The module's kernel with one 2-engine cluster, for every test here; stopped after."""
    kernel.ok("%nbdist start -n 2")
    pids = engine_pids(kernel)
    yield kernel
    kernel.ok("%nbdist stop")
    assert_gone(pids)


def engine_pids(k) -> list[int]:
    return eval(k.ok("print([s.pid for s in __import__('nbdist').current().slots])").stdout)


def torchrun(script: str, *args: str, cwd: Path, timeout: float = 180) -> tuple[int, str]:
    """``torchrun --nproc-per-node 2 SCRIPT ARGS``: its exit status and output.

    torchrun's own worker sometimes aborts at exit (``terminate called without an active
    exception``: the gloo destructor race that nbdist works around on engines); such a run is
    repeated, at most twice: it says nothing about nbdist."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += [str(SCRIPTS / script), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for _ in range(3):
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its workers share its process group: killed together
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
        if proc.returncode == 0 or TEARDOWN_ABORT not in out:
            break
    return proc.returncode, out


def nbdist_run(nb, script: str, *args: str, timeout: float = 180):
    """``%nbdist run SCRIPT ARGS`` in the kernel, then check the cluster still works."""
    line = shlex.join(["%nbdist", "run", str(SCRIPTS / script), *args])
    cell = nb.run(line, timeout=timeout)
    assert nb.ok(ALL_REDUCE_OF_ONES).result == "2.0", "the cluster is broken after the script"
    return cell


def reported_losses(nb, script: str) -> int:
    """How many losses the latest run of ``script`` (runs are named after their script) kept
    in the run store."""
    r = nb.ok(
        "import nbdist\n"
        f"run = next(r for r in nbdist.runs() if r['name'] == {script!r})\n"
        "print(sum(m['loss'] is not None for m in run.metrics(as_frame=False)))"
    )
    return int(r.stdout)


def last_error_line(text: str) -> str:
    """The last ``SomethingError: message`` line of a traceback, without torchrun's prefixes."""
    lines = re.findall(r"^(?:\[rank\d+\]:\s*)?(\w+(?:Error|Exception): .*)$", text, re.M)
    assert lines, text
    return lines[-1].strip()


CASES = [
    pytest.param("plain_torch.py", (), id="torch-ddp"),
    pytest.param("lightning_ddp.py", ("--strategy", "ddp"), id="lightning-ddp"),
    pytest.param("lightning_ddp.py", ("--strategy", "fsdp"), id="lightning-fsdp"),
    pytest.param("accelerate_train.py", (), id="accelerate"),
    pytest.param("hf_trainer.py", (), id="hf-trainer"),
]


@pytest.mark.parametrize(("script", "args"), CASES)
def test_framework_gives_torchruns_result(nb, tmp_path, script, args):
    work = tmp_path / "work"  # each run's own scratch folder (Lightning, HF Trainer)
    opts = {
        "lightning_ddp.py": ["--root-dir", str(work)],
        "hf_trainer.py": ["--output-dir", str(work)],
    }.get(script, [])
    t0 = time.monotonic()
    rc, out = torchrun(script, *args, *opts, "--out", str(tmp_path / "torchrun.json"), cwd=tmp_path)
    torchrun_s = time.monotonic() - t0
    cell = nbdist_run(nb, script, *args, *opts, "--out", str(tmp_path / "nbdist.json"))
    if rc != 0 and "fsdp" in args:
        # Lightning refuses FSDP without a GPU (in Trainer(), before any process group), and
        # torch's FSDP itself needs an accelerator: nbdist must refuse it the same way.
        reason = last_error_line(out)
        assert cell.error is not None, cell.stdout
        assert reason in "\n".join(cell.error["traceback"])
        pytest.skip(f"torchrun itself fails: {reason}")
    assert rc == 0, out
    assert cell.error is None, "\n".join(cell.error["traceback"])
    expected = json.loads((tmp_path / "torchrun.json").read_text())
    got = json.loads((tmp_path / "nbdist.json").read_text())
    assert expected["world_size"] == 2
    assert got == expected, f"nbdist {got} != torchrun {expected}"
    if script != "plain_torch.py":  # the framework's one adapter line fed the run store
        assert reported_losses(nb, script) >= 2, f"{script}: its losses did not reach the run store"
    print(f"{script} {' '.join(args)}: torchrun {torchrun_s:.1f} s, nbdist {cell.seconds:.1f} s")


def test_sys_exit_ends_a_script_as_under_torchrun(nb, tmp_path):
    assert nbdist_run(nb, "exits.py", "--code", "0").error is None
    cell = nbdist_run(nb, "exits.py", "--code", "3", "--rank", "1")
    assert cell.error is not None
    message = cell.error["evalue"]
    assert "rank 1: SystemExit: the code called sys.exit(3)" in message
    assert not re.search(r"\branks? 0\b", message), message
    # torchrun says the same: rank 1 failed, with exit code 3
    rc, out = torchrun("exits.py", "--code", "3", "--rank", "1", cwd=tmp_path)
    assert rc != 0
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)\s*\n\s*exitcode\s*: 3 ", out), out


def wait_for_output(nb, msg_id: str, text: str, timeout: float) -> str:
    """Read the kernel's output for cell ``msg_id`` until ``text`` shows; what it showed."""
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = nb.kc.get_iopub_msg(timeout=0.1)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            seen += msg["content"]["text"]
            if text in seen:
                return seen
        elif msg["msg_type"] == "error":
            raise AssertionError("\n".join(msg["content"]["traceback"]))
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            raise AssertionError(f"the cell ended before {text!r}:\n{seen}")
    raise AssertionError(f"no {text!r} within {timeout} s:\n{seen}")


def test_interrupt_stops_a_lightning_fit_on_every_rank_every_time(nb):
    """Lightning catches the KeyboardInterrupt, ignores SIGINT from then on and calls
    ``sys.exit(1)``: the cell still ends as interrupted, the engines stay, and the next
    interrupt works as the first did."""
    before = engine_pids(nb)
    nb.ok("%%distributed\nimport signal\n_sigterm_before = signal.getsignal(signal.SIGTERM)")
    line = shlex.join(
        ["%nbdist", "run", str(SCRIPTS / "lightning_ddp.py"), "--max-steps", "1000000"]
        + ["--max-epochs", "100000", "--print-every", "10"]
    )
    for _ in range(2):
        sent = nb.submit(line)
        wait_for_output(nb, sent[0], "training step 30", timeout=60)
        pressed = time.monotonic()
        nb.km.interrupt_kernel()
        cell = nb.collect(sent, timeout=30)
        stopped_in = time.monotonic() - pressed
        assert cell.error is not None, cell.stdout
        assert cell.error["ename"] == "CellInterrupted", "\n".join(cell.error["traceback"])
        assert stopped_in < 10, f"the fit took {stopped_in:.1f} s to stop"
        # every rank has the engine's signal handlers back, and a process group
        r = nb.ok(
            "%%distributed\nimport signal, torch\n"
            "ok = signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
            "ok = ok and signal.getsignal(signal.SIGTERM) is _sigterm_before\n"
            "t = torch.tensor([float(ok)])\ntorch.distributed.all_reduce(t)\nt.item()"
        )
        assert r.result == "2.0", "a rank's SIGINT or SIGTERM handler is not the engine's"
    assert engine_pids(nb) == before  # stopped by the interrupt itself, not by replacement
