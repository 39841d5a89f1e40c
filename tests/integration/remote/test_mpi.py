"""Engines through a real Open MPI ``mpiexec`` (ipyparallel's MPI launcher, on this machine):
start, a DDP cell, status and stop from the magics in a real kernel, and a killed kernel that
leaves neither mpiexec nor an engine behind.

As root, Open MPI refuses to run unless told (``OMPI_ALLOW_RUN_AS_ROOT`` and its confirmation):
the tests set them, as a person running as root would.
"""

from __future__ import annotations

import ast
import os
import shutil
import signal
import time

import psutil
import pytest
from kernels import shutdown_kernel, start_kernel
from processes import assert_gone

ALL_REDUCE = (
    "%%distributed --no-dashboard\nimport torch\nt = torch.ones(1) * (nbdist.rank() + 1)\n"
    "torch.distributed.all_reduce(t)\nint(t.item())"
)
PIDS = "import nbdist\nprint([p.pid for p in nbdist.current().engines.processes()])"
START = "%nbdist start -n 2 --launcher mpi --ip 127.0.0.1"


@pytest.fixture
def mpi(monkeypatch, tmp_path):
    if shutil.which("mpiexec") is None:
        pytest.skip("mpiexec is not installed: run scripts/install-system-deps.sh (openmpi-bin)")
    if os.geteuid() == 0:
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _mpiexec(pids: list[int]) -> list[int]:
    return [p for p in pids if psutil.Process(p).name() == "mpiexec"]


def test_magics_start_train_status_and_stop_through_mpiexec(mpi):
    k = start_kernel()
    try:
        r = k.ok(START, timeout=120)
        assert "nbdist: 2 ranks ready" in r.stdout, r.stdout
        assert k.ok(ALL_REDUCE, timeout=60).result == "3"  # 1 + 2: both ranks took part
        status = k.ok("%nbdist status").stdout.splitlines()
        assert status[0].split()[:2] == ["rank", "host"] and len(status) == 4, status
        pids = ast.literal_eval(k.ok(PIDS).stdout)
        assert len(_mpiexec(pids)) == 1  # mpiexec runs here, a child of the kernel
        t0 = time.monotonic()
        assert "cluster stopped" in k.ok("%nbdist stop").stdout
        print(
            f"mpi: started in {r.stdout.split(' in ')[-1].strip()}, stopped in "
            f"{time.monotonic() - t0:.2f} s"
        )
        assert_gone(pids)
        assert not list(mpi.iterdir())
    finally:
        shutdown_kernel(k)


def test_a_killed_kernel_leaves_neither_mpiexec_nor_engines(mpi):
    k = start_kernel()
    try:
        k.ok(START, timeout=120)
        pids = ast.literal_eval(k.ok(PIDS).stdout)
        assert _mpiexec(pids)
        os.kill(k.pid, signal.SIGKILL)  # no exit handler runs
        assert_gone(pids, timeout=20)  # engines tied to the kernel leave; mpiexec with them
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)
