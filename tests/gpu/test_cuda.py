"""nbdist on a real CUDA GPU: placement, NCCL, mixed precision, FSDP, GPU telemetry, forking.

Every test here is marked ``gpu`` and skipped where ``torch.cuda.is_available()`` is False (CI,
laptops). They need one GPU; with one GPU a cluster has one rank on it (NCCL refuses two ranks
on one device, so nbdist gives the second rank no GPU: refused, or CPU everywhere with
``allow_mixed``). ``python tests/gpu/bench_cuda.py`` measures start time and training speed.

The test process itself only asks ``torch.cuda.is_available()``: the engines own the GPU.
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch
from clusters import store_of, watched
from kernels import shutdown_kernel, start_kernel
from processes import assert_gone

import nbdist
from nbdist.config import CellOptions, TelemetryConfig
from nbdist.errors import DistributedCellError, UsageError
from nbdist.notebook.board import dashboard as dashboard_mod
from nbdist.notebook.magics import _status_table
from nbdist.worker import api

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.usefixtures("no_front_end"),  # dashboards are built and updated, shown nowhere
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False)",
    ),
]

# Defined on the engine once: a small regression task, a training loop through train_step that
# records the dtype the first layer computes in, and a summary of the trained parameters.
_HELPERS = """
import math, time
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from nbdist.worker.state import engine as _engine

def make_net(width=32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 1))

def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)
    return x.to(nbdist.device()), y.to(nbdist.device())

def train(steps=60, batch=32, lr=0.05, **options):
    net = make_net()
    inner = set()
    net[0].register_forward_hook(lambda m, i, o: inner.add(str(o.dtype).replace("torch.", "")))
    model, opt = nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=lr), **options)
    x, y = data(batch * steps, seed=1 + nbdist.rank())
    losses, outer = [], set()
    for i in range(steps):
        xb, yb = x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]
        with nbdist.train_step(model, opt) as step:
            out = model(xb)
            outer.add(str(out.dtype).replace("torch.", ""))
            loss = F.mse_loss(out, yb)
            step.backward(loss)
        losses.append(loss.detach())
    losses = torch.stack(losses).float().cpu().tolist()
    return model, opt, losses, {"inner": sorted(inner), "outer": sorted(outer)}

def params(model):
    ps = [p.detach() for p in model.parameters()]
    return [p.full_tensor() if hasattr(p, "full_tensor") else p for p in ps]

def summary(model, losses, dtypes):
    ps = params(model)
    return dict(
        first=sum(losses[:5]) / 5, last=sum(losses[-5:]) / 5,
        finite=all(math.isfinite(v) for v in losses) and all(bool(p.isfinite().all()) for p in ps),
        devices=sorted({str(p.device) for p in model.parameters()}),
        param_dtypes=sorted({str(p.dtype).replace("torch.", "") for p in ps}),
        wrapper=type(model).__name__, **dtypes,
    )
"""


@pytest.fixture(scope="class")
def gpu():
    """A real 1-engine cluster on the GPU, with the helpers defined; stopped after the class."""
    c = nbdist.start(n=1)
    pids = [p.pid for p in c.engines.processes()]
    c.run(_HELPERS)
    yield c
    pids += [p.pid for p in c.engines.processes()]  # a replaced engine's too
    c.stop()
    assert_gone(pids)


def _train(c, **options) -> dict:
    return c.run(
        f"model, opt, losses, dtypes = train(**{options!r})\nsummary(model, losses, dtypes)"
    )


class TestOneGpu:
    # -- (a) placement ---------------------------------------------------------------------------
    def test_the_rank_gets_cuda_0_nccl_and_status_names_the_gpu(self, gpu):
        assert gpu.backend == "nccl"
        assert [s.device for s in gpu.slots] == ["cuda:0"]
        name, total, current, backend, device, env = gpu.run(
            "import os\n"
            "(torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory,\n"
            " torch.cuda.current_device(), dist.get_backend(), str(nbdist.device()),\n"
            " {k: os.environ[k] for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE')})"
        )
        assert (current, backend, device) == (0, "nccl", "cuda:0")
        assert env == {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
        [row] = gpu.status()
        assert row["device"] == "cuda:0" and row["state"] == "ready"
        assert row["gpu"] == f"{name}, {total / 2**30:.1f} GiB"
        table = _status_table(gpu.status()).splitlines()
        assert table[0].split() == ["rank", "host", "pid", "device", "gpu", "state"]
        assert "cuda:0" in table[1] and name in table[1]

    # -- (b) NCCL collectives, and a failing cell --------------------------------------------
    def test_nccl_collectives_on_cuda_tensors(self, gpu):
        got = gpu.run(
            "n = 1 << 20\n"
            "t = torch.full((n,), float(nbdist.rank() + 1), device=nbdist.device())\n"
            "dist.all_reduce(t)\n"
            "g = [torch.zeros(4, device=nbdist.device()) for _ in range(dist.get_world_size())]\n"
            "dist.all_gather(g, torch.arange(4.0, device=nbdist.device()) + nbdist.rank())\n"
            "b = torch.full((1,), 42.0 if nbdist.is_main() else 0.0, device=nbdist.device())\n"
            "dist.broadcast(b, 0)\n"
            "(dist.get_backend(), str(t.device), t.sum().item(), [x.tolist() for x in g],"
            " b.item())"
        )
        assert got == ("nccl", "cuda:0", float(1 << 20), [[0.0, 1.0, 2.0, 3.0]], 42.0)

    def test_a_failing_cell_ends_at_once_and_the_nccl_group_is_reformed(self, gpu):
        attempt = gpu.attempt
        t0 = time.monotonic()
        with pytest.raises(DistributedCellError, match="boom on rank 0"):
            gpu.run(
                "x = torch.ones(8, device=nbdist.device())\n"
                "dist.all_reduce(x)\n"
                "torch.cuda.synchronize()\n"
                "raise RuntimeError(f'boom on rank {nbdist.rank()}')\n"
            )
        assert time.monotonic() - t0 < 10
        got = gpu.run(
            "y = torch.full((4,), 3.0, device=nbdist.device())\n"
            "dist.all_reduce(y)\n"
            "(dist.get_backend(), y.tolist(), x.device.type)"
        )
        assert got == ("nccl", [3.0] * 4, "cuda")  # x survives: the failed cell's names persist
        assert gpu.attempt > attempt

    def test_timeout_stops_a_cell_busy_on_the_gpu(self, gpu):
        t0 = time.monotonic()
        with pytest.raises(DistributedCellError, match="timeout"):
            gpu.run(
                "a = torch.randn(2048, 2048, device=nbdist.device())\n"
                "while True:\n"
                "    a = (a @ a).tanh_()\n",
                CellOptions(timeout=2.0),
            )
        assert time.monotonic() - t0 < 20
        got = gpu.run(
            "z = torch.ones(2, device=nbdist.device())\ndist.all_reduce(z)\n(z.tolist(), "
            "dist.get_backend())"
        )
        assert got == ([1.0, 1.0], "nccl")

    # -- (c) mixed precision -------------------------------------------------------------------
    def test_fp32_ddp_on_cuda(self, gpu):
        s = _train(gpu)
        assert s["wrapper"] == "DistributedDataParallel"
        assert s["devices"] == ["cuda:0"] and s["param_dtypes"] == ["float32"]
        assert s["inner"] == ["float32"] and s["outer"] == ["float32"]
        assert s["finite"] and s["last"] < 0.5 * s["first"], s

    def test_fp16_trains_with_gradient_scaling(self, gpu):
        s = _train(gpu, precision="fp16")
        assert s["devices"] == ["cuda:0"] and s["param_dtypes"] == ["float32"]
        assert s["inner"] == ["float16"] and s["outer"] == ["float32"], s
        assert s["finite"] and s["last"] < 0.5 * s["first"], s
        scaler = gpu.run(
            "sc = _engine.training_plans[model].scaler\n"
            "(type(sc).__name__, sc.is_enabled(), sc.get_scale(), str(sc._scale.device))"
        )
        kind, enabled, scale, where = scaler
        assert kind == "GradScaler" and enabled and where == "cuda:0"
        assert 1.0 <= scale < float("inf")

    def test_fp16_skips_a_step_whose_gradients_overflow(self, gpu):
        before, after, unchanged = gpu.run(
            "model, opt, losses, _ = train(steps=10, precision='fp16')\n"
            "sc = _engine.training_plans[model].scaler\n"
            "scale0 = sc.get_scale()\n"
            "p0 = [p.detach().clone() for p in model.parameters()]\n"
            "xb, yb = data(32, seed=7)\n"
            "with nbdist.train_step(model, opt) as step:\n"
            "    step.backward(F.mse_loss(model(xb), yb) * float('inf'))\n"
            "(scale0, sc.get_scale(), all(torch.equal(a, b) for a, b in"
            " zip(p0, model.parameters())))"
        )
        assert unchanged, "an overflowing fp16 step changed the parameters"
        assert after == pytest.approx(before / 2)

    def test_bf16_on_cuda(self, gpu):
        assert gpu.run("torch.cuda.is_bf16_supported()")
        s = _train(gpu, precision="bf16")
        assert s["inner"] == ["bfloat16"] and s["outer"] == ["float32"], s
        assert s["param_dtypes"] == ["float32"] and s["devices"] == ["cuda:0"]
        assert s["finite"] and s["last"] < 0.5 * s["first"], s

    @pytest.mark.parametrize(
        "options",
        [
            {"compress": "fp16"},
            {"compress": "bf16"},
            {"compress": "powersgd", "powersgd_rank": 1, "powersgd_warmup": 2},
            {"accumulate": 4, "precision": "fp16"},
            {"static_graph": True, "precision": "bf16"},
        ],
        ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
    )
    def test_ddp_options_on_nccl(self, gpu, options):
        s = _train(gpu, steps=80, **options)
        assert s["devices"] == ["cuda:0"]
        assert s["finite"] and s["last"] < 0.5 * s["first"], s

    # -- (d) FSDP ----------------------------------------------------------------------------
    @pytest.mark.parametrize(
        "precision, inner", [(None, "float32"), ("bf16", "bfloat16"), ("fp16", "float16")]
    )
    def test_fsdp_trains_on_cuda(self, gpu, precision, inner):
        s = _train(gpu, strategy="fsdp", precision=precision)
        assert s["devices"] == ["cuda:0"] and s["param_dtypes"] == ["float32"]
        assert s["inner"] == [inner] and s["outer"] == ["float32"], s
        assert s["finite"] and s["last"] < 0.5 * s["first"], s
        dtensors, scaler = gpu.run(
            "(all(type(p).__name__ == 'DTensor' for p in model.parameters()),"
            " type(_engine.training_plans[model].scaler).__name__)"
        )
        assert dtensors
        assert scaler == ("ShardedGradScaler" if precision == "fp16" else "NoneType")

    # -- (e) the dashboard's GPU columns -------------------------------------------------------
    def test_health_samples_carry_gpu_memory_and_utilisation(self, gpu):
        src = (
            "w = torch.randn(4096, 4096, device=nbdist.device())\n"
            "t0 = time.time()\n"
            "i = 0\n"
            "while time.time() - t0 < 2.0:\n"
            "    v = (w @ w).sum()\n"
            "    nbdist.report(step=i, loss=v / 1e9, samples=4096)\n"
            "    i += 1\n"
            "torch.cuda.synchronize()\n"
        )
        opts = CellOptions()
        mon = watched(gpu, src, opts, cfg=TelemetryConfig(silent_after=5.0))
        gpu.run(src, opts, watch=mon)
        st = mon.collector.ranks[0]
        h = st.health
        assert h is not None and h.gpu_mem is not None and h.gpu_mem >= 4096 * 4096 * 4, h
        assert h.gpu_util is not None and 0 <= h.gpu_util <= 100, h
        row = dashboard_mod.rank_row(st, time.time(), zero_based=True)
        assert 0 <= row["gpu_util"] <= 100, row  # the board's GPU columns, as numbers
        assert row["gpu_mb"] >= 64, row  # the 64 MiB matrix, at least
        [stored] = store_of(mon).health(mon.run_id)
        assert stored["gpu_mem"] >= 4096 * 4096 * 4 and stored["gpu_util"] is not None

    def test_metrics_as_cuda_tensors_are_read_off_the_training_thread(self, gpu):
        """``acc=(pred == y).float().mean()`` on the GPU: left to the sender to read (the step
        does not wait for the device), and in the store as a number."""
        src = (
            "pred = torch.arange(4, device=nbdist.device())\n"
            "y = torch.tensor([0, 1, 0, 0], device=nbdist.device())\n"
            "for i in range(5):\n"
            "    nbdist.report(step=i, loss=torch.tensor(1.0, device=nbdist.device()),\n"
            "                  acc=(pred == y).float().mean(), hits=(pred == y).sum())\n"
            "torch.cuda.synchronize()\n"
        )
        opts = CellOptions()
        mon = watched(gpu, src, opts)
        gpu.run(src, opts, watch=mon)
        rows = store_of(mon).metrics(mon.run_id)
        assert [r["extra"] for r in rows] == [{"acc": 0.5, "hits": 2.0}] * 5
        assert [r["loss"] for r in rows] == [1.0] * 5

    # -- (f) engines forked from the warm fork server -----------------------------------------
    def test_forked_engines_use_cuda_and_the_fork_server_never_touched_it(self, gpu):
        bad_fork, initialized, pid = gpu.run(
            "import os\n(torch.cuda._is_in_bad_fork(), torch.cuda.is_initialized(), os.getpid())"
        )
        assert not bad_fork and initialized and pid == gpu.slots[0].pid
        server = psutil.Process(pid).parent()
        # named "nbdist forkserver (cluster ...)" with setproctitle, its module's name without
        assert re.search(r"nbdist[ .](launch\.)?forkserver", " ".join(server.cmdline()))
        with_context = _compute_pids()
        print("pids with a CUDA context (NVML):", sorted(with_context), "engine", pid,
              "fork server", server.pid, "libcuda mapped in the fork server:",
              any("libcuda" in m.path for m in server.memory_maps()))  # fmt: skip
        if pid in with_context:  # NVML sees this namespace's pids: the server must not be there
            assert server.pid not in with_context, "the fork server holds a CUDA context"

    def test_a_killed_gpu_engine_is_replaced_by_a_fork_that_uses_cuda(self, gpu):
        old = gpu.slots[0].pid
        threading.Timer(2.0, os.kill, (old, signal.SIGKILL)).start()
        t0 = time.monotonic()
        with pytest.raises(DistributedCellError, match="SIGKILL"):
            gpu.run(
                "a = torch.randn(1024, 1024, device=nbdist.device())\n"
                "for _ in range(600):\n"
                "    a = (a @ a).tanh_(); dist.all_reduce(a); time.sleep(0.05)\n"
            )
        assert time.monotonic() - t0 < 15
        assert_gone([old])
        gpu.run(_HELPERS)  # the fresh engine has none of the old one's names
        new = gpu.slots[0].pid
        assert new != old and gpu.slots[0].device == "cuda:0"
        got = gpu.run(
            "import os\nq = torch.full((3,), 2.0, device=nbdist.device())\ndist.all_reduce(q)\n"
            "(os.getpid(), q.tolist(), dist.get_backend(), torch.cuda._is_in_bad_fork())"
        )
        assert got == (new, [2.0] * 3, "nccl", False)
        s = _train(gpu, precision="bf16")
        assert s["finite"] and s["last"] < 0.5 * s["first"], s

    def test_a_failing_cell_after_ddp_training_shows_only_its_exception(self, gpu, capsys):
        """Aborting the NCCL group right after DDP's last all-reduce must not print the NCCL
        watchdog's C++ stack trace into the notebook (seen once on the H100: "ProcessGroupNCCL
        ... Collective WorkNCCL(... ALLREDUCE ...) raised the following async exception")."""
        capsys.readouterr()
        for _ in range(3):  # the watchdog polls: give the race a few chances
            with pytest.raises(DistributedCellError, match="right after training"):
                gpu.run(
                    "model, opt, losses, dtypes = train(steps=40)\n"
                    "raise ValueError('right after training')"
                )
            assert gpu.run("1 + 1") == 2
        time.sleep(1.0)
        assert gpu.run("dist.get_backend()") == "nccl"
        out = capsys.readouterr()
        assert "ProcessGroupNCCL" not in out.out + out.err, out.out + out.err

    # -- values back to a notebook that has no GPU ---------------------------------------------
    def test_a_cuda_value_can_be_pulled_into_a_notebook_without_a_gpu(self, gpu, tmp_path):
        """The notebook is often on a machine without a GPU (engines on GPU hosts)."""
        gpu.run("pulled = {'t': torch.arange(4.0, device=nbdist.device()),"
                " 'sd': make_net().to(nbdist.device()).state_dict()}")  # fmt: skip
        packed = gpu.client[gpu.slots[0].engine_id].apply_sync(api.fetch, "pulled")
        path = tmp_path / "packed.pickle"
        path.write_bytes(pickle.dumps(packed))
        code = (
            "import pickle, sys, torch\n"
            "from nbdist.notebook.cluster.transfer import unpack\n"
            "packed = pickle.load(open(sys.argv[1], 'rb'))\n"
            "assert not torch.cuda.is_available()\n"
            "try:\n"
            "    pickle.loads(packed.pickle)\n"
            "except Exception as e:\n"
            "    print('pickle.loads:', type(e).__name__, str(e)[:200], file=sys.stderr)\n"
            "v = unpack(packed)\n"
            "print(type(v).__name__, v['t'].tolist() if isinstance(v, dict) else repr(v)[:300])\n"
        )
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        out = subprocess.run(
            [sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "dict [0.0, 1.0, 2.0, 3.0]", out.stdout[:200] + out.stderr

    # -- (g) a mesh on the GPU: meta model materialised on cuda, FSDP2, sharded checkpoint -------
    def test_a_mesh_lays_a_meta_model_on_the_gpu_and_checkpoints_it_sharded(self, gpu, tmp_path):
        got = gpu.run(
            "from torch.distributed.tensor import DTensor\n"
            "mesh = nbdist.mesh(dp=1)\n"
            "with torch.device('meta'):\n"
            "    net = make_net()\n"
            "net = nbdist.prepare(net, mesh=mesh, strategy='fsdp', precision='bf16')\n"
            "opt = torch.optim.Adam(net.parameters(), lr=1e-2)\n"
            "x, y = data(64, 1)\n"
            "for _ in range(3):\n"
            "    opt.zero_grad(); F.mse_loss(net(x), y).backward(); opt.step()\n"
            f"nbdist.checkpoint(2, dir={str(tmp_path)!r}, run='gpu-mesh', model=net, opt=opt)\n"
            "before = {k: v.full_tensor().clone() for k, v in net.state_dict().items()}\n"
            "with torch.no_grad():\n"
            "    for p in net.parameters(): p.zero_()\n"
            f"start = nbdist.restore(dir={str(tmp_path)!r}, run='gpu-mesh', model=net, opt=opt)\n"
            "after = {k: v.full_tensor() for k, v in net.state_dict().items()}\n"
            "(mesh.device_type, str(mesh.mesh.device), mesh.get_coordinate(), start,\n"
            " all(isinstance(p, DTensor) and p.device.type == 'cuda' for p in net.parameters()),\n"
            " all(torch.equal(before[k], after[k]) for k in before))"
        )
        device_type, _, coords, start, on_gpu, same = got
        # torch gives the coordinate as a list or a tuple, by version
        assert (device_type, list(coords), start, on_gpu, same) == ("cuda", [0], 3, True, True)
        assert [d.name for d in (tmp_path / "gpu-mesh").glob("step-*.dcp")] == ["step-00000002.dcp"]


def _compute_pids() -> set[int]:
    """Pids with a CUDA context on GPU 0, as NVML sees them (empty when NVML is missing)."""
    try:
        import pynvml
    except ImportError:
        return set()
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return set()


# -- one GPU, two engines: the second has no GPU of its own -------------------------------------
def test_two_engines_on_one_gpu_are_refused_without_allow_mixed():
    with pytest.raises(UsageError, match=r"ranks \[1\] have no GPU of their own.*--allow-mixed"):
        nbdist.start(n=2)
    assert nbdist.current(required=False) is None
    with pytest.raises(UsageError, match=r"backend nccl needs a GPU for every rank"):
        nbdist.start(n=2, backend="nccl")
    assert nbdist.current(required=False) is None


def test_two_engines_on_one_gpu_with_allow_mixed_train_on_cpu_with_gloo():
    with pytest.warns(UserWarning, match=r"ranks \[1\] have no GPU of their own"):
        c = nbdist.start(n=2, allow_mixed=True)
    pids = [p.pid for p in c.engines.processes()]
    try:
        assert c.backend == "gloo" and [s.device for s in c.slots] == ["cpu", "cpu"]
        assert [r["gpu"] for r in c.status()] == ["-", "-"]
        got = c.run(
            "import torch, torch.distributed as dist\n"
            "t = torch.full((3,), float(nbdist.rank() + 1))\ndist.all_reduce(t)\n"
            "(dist.get_backend(), t.tolist(), torch.cuda.is_available())"
        )
        assert got == ("gloo", [3.0] * 3, True)  # the GPU is there; the mix trains on CPU
        t0 = time.monotonic()
        with pytest.raises(DistributedCellError, match="bad batch on rank 1"):
            c.run(
                "x = torch.ones(1)\n"
                "if nbdist.rank() == 1:\n    raise ValueError('bad batch on rank 1')\n"
                "dist.all_reduce(x)\n"
            )
        assert time.monotonic() - t0 < 10
    finally:
        c.stop()
    assert_gone(pids)


# -- the magics, in a real kernel ------------------------------------------------------------------
def test_status_magic_shows_the_gpu_in_a_real_kernel():
    k = start_kernel()
    try:
        r = k.ok("%nbdist start -n 1")
        assert "1 ranks ready (nccl" in r.stdout, r.stdout
        lines = k.ok("%nbdist status").stdout.splitlines()
        assert lines[0].split() == ["rank", "host", "pid", "device", "gpu", "state"]
        assert "cuda:0" in lines[1] and "GiB" in lines[1] and lines[1].split()[-1] == "ready"
        r = k.ok(
            "%%distributed\nimport torch\nt = torch.ones(5, device=nbdist.device())\n"
            "torch.distributed.all_reduce(t)\n(t.device.type, int(t.sum()))"
        )
        assert r.result == "('cuda', 5)", r.result
        k.ok("%nbdist stop")
    finally:
        shutdown_kernel(k)
