"""Recovery time: from the SIGKILL of a worker to the first step completed after recovery.

nbdist (``%%distributed --restarts 1``, checkpoints every K steps) against torchrun's own elastic
restart (``torchrun --max-restarts 1``, the same loop saving with ``torch.save`` every K steps),
measured in the same run on the same machine. Also counts the steps computed twice.

Then the same with E seconds of training in an earlier cell of the notebook (``--earlier``, 0 20
60 by default): the fresh engine taking over the state its lost engine kept, against the journal
of earlier cells run again on every rank (what recovery did before the state was kept, and still
does where none was: here the kept files are removed just before the kill).

    python -m benchmarks.bench_recovery [--steps 60] [--every 10] [--kill-at 25] [--earlier 0 20 60]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from benchmarks import Result, table

_LOOP = """
import os, time, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
{wrap}
opt = torch.optim.SGD(model.parameters(), lr=0.01)
{load}
open(PIDS + str(RANK), "w").write(str(os.getpid()))
for step in range(start, STEPS):
    x = torch.randn(64, 64)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    opt.step()
    {save}
    if RANK == 0:
        with open(LOG, "a") as f:
            f.write(f"{{step}} {{time.time()}}\\n")
    time.sleep(0.02)
"""

_NBDIST = _LOOP.format(
    wrap="model = nbdist.prepare(model)",
    load="start = nbdist.restore(model=model, opt=opt)",
    save="nbdist.checkpoint(step, every=EVERY, model=model, opt=opt)",
)

_TORCHRUN = (
    "import os, torch, torch.distributed as dist\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "dist.init_process_group('gloo')\n"
    "RANK = int(os.environ['RANK'])\n"
    "LOG, PIDS, CKPT = os.environ['B_LOG'], os.environ['B_PIDS'], os.environ['B_CKPT']\n"
    "STEPS, EVERY = int(os.environ['B_STEPS']), int(os.environ['B_EVERY'])\n"
    + _LOOP.format(
        wrap="model = DDP(model)",
        load=(
            "start = 0\n"
            "if os.path.exists(CKPT):\n"
            "    ck = torch.load(CKPT)\n"
            "    model.load_state_dict(ck['model']); opt.load_state_dict(ck['opt'])\n"
            "    start = ck['step'] + 1"
        ),
        save=(
            "if step % EVERY == 0 and RANK == 0:\n"
            "        torch.save({'model': model.state_dict(), 'opt': opt.state_dict(),"
            " 'step': step}, CKPT + '.tmp')\n"
            "        os.replace(CKPT + '.tmp', CKPT)"
        ),
    )
)


def _log(path: Path) -> list[tuple[int, float]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        step, t = line.split()
        rows.append((int(step), float(t)))
    return rows


def _kill_at(
    log: Path, pidfile: Path, step: int, out: dict, before=None, deadline: float = 120
) -> None:
    """Kill rank 1 once rank 0 has logged ``step`` (``before()`` first, if given); note when."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if len(_log(log)) >= step and pidfile.exists():
            if before is not None:
                before()
            out["killed_at"] = time.time()
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
            return
        time.sleep(0.005)


def _measure(log: Path, killed_at: float) -> tuple[float, int]:
    rows = _log(log)
    after = [t for _, t in rows if t > killed_at]
    steps = [s for s, _ in rows]
    return (after[0] - killed_at if after else float("nan")), len(steps) - len(set(steps))


# (a NaN figure in the table means that side never recovered within its time limit)


#: an earlier cell of the notebook: a model trained for E seconds (no checkpoints)
_EARLIER = """
import time, torch
earlier = nbdist.prepare(torch.nn.Linear(256, 256))
earlier_opt = torch.optim.SGD(earlier.parameters(), lr=0.01)
t0 = time.time()
while True:
    done = torch.tensor([float(time.time() - t0 >= SECONDS)])  # the ranks agree when to stop
    torch.distributed.all_reduce(done, op=torch.distributed.ReduceOp.MAX)
    if done.item():
        break
    earlier_opt.zero_grad()
    earlier(torch.randn(32, 256)).pow(2).mean().backward()
    earlier_opt.step()
"""


def nbdist_recovery(
    tmp: Path, steps: int, every: int, kill_at: int, earlier: float = 0, replay: bool = False
) -> tuple[float, int]:
    """Kill -> first step after, and the steps redone, with ``earlier`` seconds of training in
    an earlier cell; ``replay``: the kept states removed first (the journal runs again)."""
    import nbdist
    from nbdist.config import CellOptions

    name = f"nbdist-{earlier:g}-{'replay' if replay else 'kept'}"
    tmp = Path(tempfile.mkdtemp(prefix=name, dir=tmp))  # each run's own log and pid files
    log, pids = tmp / "nbdist.log", tmp / "nbdist-pid"
    with nbdist.start(n=2) as cluster:
        cluster.run(
            f"LOG, PIDS, STEPS, EVERY = {str(log)!r}, {str(pids)!r}, {steps}, {every}\n"
            "RANK = nbdist.rank()"
        )
        if earlier:
            cluster.run(f"SECONDS = {earlier}\n" + _EARLIER)
        kept = cluster.run("from nbdist.worker.continuity import snapshot\nstr(snapshot.folder())")
        out: dict = {}
        before = (lambda: _remove_states(Path(kept))) if replay else None
        t = threading.Thread(target=_kill_at, args=(log, Path(f"{pids}1"), kill_at, out, before))
        t.start()
        cluster.run(_NBDIST, CellOptions(restarts=1, quiet=True))
        t.join()
    return _measure(log, out["killed_at"])


def _remove_states(folder: Path) -> None:
    for f in folder.glob("rank-*.state"):
        f.unlink()


def torchrun_recovery(tmp: Path, steps: int, every: int, kill_at: int) -> tuple[float, int]:
    script = tmp / "train.py"
    script.write_text(_TORCHRUN)
    log, pids = tmp / "torchrun.log", tmp / "torchrun-pid"
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        B_LOG=str(log),
        B_PIDS=str(pids),
        B_CKPT=str(tmp / "torchrun.ckpt"),
        B_STEPS=str(steps),
        B_EVERY=str(every),
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--monitor-interval",
        "0.1",
        str(script),
    ]
    # its own process group: on a timeout the agent and its workers go together
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    out: dict = {}
    workers: set[psutil.Process] = set()
    try:
        _kill_at(log, Path(f"{pids}1"), kill_at, out)
        # torchrun's agent can exit while the workers of its restart still wait in
        # init_process_group, orphaned: every worker seen is tracked, and stopped below
        end = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < end:
            workers.update(_descendants(proc.pid))
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for w in workers:
            with contextlib.suppress(psutil.Error):
                w.kill()  # psutil checks it is still the process first seen, not a reused pid
        psutil.wait_procs(list(workers), timeout=10)
    if "killed_at" not in out:
        return float("nan"), 0
    return _measure(log, out["killed_at"])


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def run(
    tiny: bool = False,
    steps: int = 60,
    every: int = 10,
    kill_at: int = 25,
    earlier: tuple[float, ...] = (0, 20, 60),
) -> list[Result]:
    if tiny:
        steps, every, kill_at, earlier = 16, 4, 6, (2,)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ours, redone = nbdist_recovery(tmp, steps, every, kill_at)
        theirs, their_redone = torchrun_recovery(tmp, steps, every, kill_at)
        grown = [
            Result(
                f"recovery after {e:g} s of earlier training: kill -> step (kept / journal run)",
                nbdist_recovery(tmp, steps, every, kill_at, e)[0],
                nbdist_recovery(tmp, steps, every, kill_at, e, replay=True)[0],
                "s",
            )
            for e in earlier
        ]
    return grown + [
        Result(
            "recovery: kill -> first step after (nbdist / torchrun)",
            ours,
            theirs,
            "s",
            note=f"steps redone: nbdist {redone}, torchrun {their_redone} (K={every})",
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--kill-at", type=int, default=25)
    p.add_argument("--earlier", type=float, nargs="*", default=[0, 20, 60])
    a = p.parse_args(argv)
    print(table(run(steps=a.steps, every=a.every, kill_at=a.kill_at, earlier=tuple(a.earlier))))


if __name__ == "__main__":
    main()
