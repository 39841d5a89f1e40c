"""Training over a slow link: time to a fixed accuracy, and bytes per step, by how ranks sync.

Two hosts (network namespaces, an sshd in each, ``tests/netns.py``) are joined to this machine
by veth pairs shaped to ``RATE`` with ``tc tbf``; one engine on each, started from a cluster
file over ssh, as a person would. The same race then runs on loopback (``nbdist.start(n=2)``).
The race: an MLP of about 1.2M parameters (4.8 MB of gradients) on a synthetic 10-class task
shipped here (Gaussian clusters, 4 per class), AdamW, 64 samples per rank per step, until the
ranks' mean accuracy on a fixed held-out set reaches ``target`` (checked every ``every`` steps;
each rank scores its own model, which between syncs is its local one). Time counts training
steps only (the slowest rank's); bytes are both directions of host a's interface during the
race. Variants: ``ddp`` (the baseline of every ratio), ``compress="fp16"``,
``compress="powersgd"`` (nbdist's defaults), ``sync="local_sgd"`` with two values of H and
``sync="diloco"``; a variant that ``prepare`` refuses is shown as "n/a (not built)".

    python -m benchmarks --only slow-link      # or: python -m benchmarks.bench_slow_link

Needs root for the namespaces; without it, or with ``--tiny``, only the loopback race runs.
"""

from __future__ import annotations

import math
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from . import Result

ROOT = Path(__file__).resolve().parents[1]
RATE = "100mbit"

#: (name, prepare() options), the baseline first.
VARIANTS = (
    ("ddp", {}),
    ('compress="fp16"', {"compress": "fp16"}),
    ('compress="powersgd"', {"compress": "powersgd"}),
    ("local_sgd H=4", {"sync": "local_sgd", "sync_every": 4}),
    ("local_sgd H=16", {"sync": "local_sgd", "sync_every": 16}),
    ("diloco H=16", {"sync": "diloco", "sync_every": 16}),
)


@dataclass(frozen=True)
class Sizes:
    """The race; ``TINY`` only checks that every path runs."""

    hidden: int = 1024
    batch: int = 64
    target: float = 0.92
    every: int = 5
    max_steps: int = 400
    lr: float = 1e-3


FULL = Sizes()
TINY = Sizes(hidden=32, target=0.0, every=2, max_steps=4)


# -- on every rank -------------------------------------------------------------------------------
def _task(n: int, gen):
    """``n`` samples of the task: 10 classes, each 4 Gaussian clusters in 128 dimensions."""
    import torch

    means = torch.randn(10, 4, 128, generator=torch.Generator().manual_seed(1234))
    c = torch.randint(0, 10, (n,), generator=gen)
    m = torch.randint(0, 4, (n,), generator=gen)
    return means[c, m] + 2.0 * torch.randn(n, 128, generator=gen), c


def race(options: dict, sizes: dict, watch: tuple[str, int] | None = None) -> dict:
    """Train with ``prepare(model, opt, **options)`` until the target accuracy (every rank);
    ``{"refused": why}`` when ``prepare`` does not accept ``sync=``. ``watch=(path, rank)``:
    that rank writes its steps so far to ``path`` after every step (for the benchmark's killer).

    Under ``sync="async"`` no collective follows ``prepare``: each rank stops on its own
    model's accuracy, and the figures are this rank's own (rank 0's reach the notebook)."""
    import os
    import time

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import nbdist
    from nbdist.errors import UsageError

    s = Sizes(**sizes)
    torch.manual_seed(0)
    h = s.hidden
    model = torch.nn.Sequential(
        torch.nn.Linear(128, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(),
        torch.nn.Linear(h, 10),
    )  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr)
    try:
        model, opt = nbdist.prepare(model, opt, **options)
    except (UsageError, TypeError) as e:
        if "sync" not in options:
            raise
        return {"refused": str(e).splitlines()[0]}
    alone = options.get("sync") == "async"  # ranks never wait for each other
    xe, ye = _task(2000, torch.Generator().manual_seed(99))
    gen = torch.Generator().manual_seed(1000 + nbdist.rank())
    stats = Path(f"/sys/class/net/{_interface()}/statistics")
    noted = watch is not None and watch[1] == nbdist.rank()

    def link_bytes() -> int:
        return sum(int((stats / f"{d}_bytes").read_text()) for d in ("tx", "rx"))

    if not alone:
        dist.barrier()
    bytes0, seconds, steps, acc = link_bytes(), 0.0, 0, 0.0
    while steps < s.max_steps:
        x, y = _task(s.batch, gen)
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        seconds += time.perf_counter() - t0
        steps += 1
        if noted:
            Path(watch[0] + ".tmp").write_text(str(steps))
            os.replace(watch[0] + ".tmp", watch[0])
        if steps % s.every == 0:
            with torch.no_grad():
                score = (model(xe).argmax(1) == ye).float().mean()
            if not alone:
                dist.all_reduce(score)
            acc = score.item() / (1 if alone else nbdist.world_size())
            if acc >= s.target:
                break
    moved = link_bytes() - bytes0
    if not alone:
        slowest = torch.tensor([seconds])
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        seconds = slowest.item()
    return {"seconds": seconds, "steps": steps, "accuracy": acc, "bytes": moved,
            "reached": acc >= s.target}  # fmt: skip


def _interface() -> str:
    """The interface the group's traffic takes (nbdist sets gloo's to it when it forms)."""
    import os

    return os.environ.get("GLOO_SOCKET_IFNAME") or "lo"


# -- in the benchmark's process ------------------------------------------------------------------
def _races(start, s: Sizes) -> dict[str, dict]:
    """Every variant, one cell each, on clusters from ``start()``: rank 0's figures by name.

    ddp runs first; the others get 1.5 times its wall time (plus 30 s) before they count as
    failed, and a failure (torch's PowerSGD hook can hang or abort on gloo) costs only that
    row: the cluster is replaced for the next.
    """
    import time

    import nbdist
    from nbdist.config import CellOptions

    load = (f"import sys\nif {str(ROOT)!r} not in sys.path: sys.path.insert(0, {str(ROOT)!r})\n"
            "from benchmarks.bench_slow_link import race\n")  # fmt: skip
    got, limit, c = {}, 1200.0, start()
    try:
        for name, opts in VARIANTS:
            t0 = time.monotonic()
            try:
                got[name] = c.run(
                    load + f"race({opts!r}, {asdict(s)!r})", CellOptions(timeout=limit)
                )
            except nbdist.DistributedCellError as e:
                got[name] = {"failed": str(e).splitlines()[0][:80]}
                c.stop()
                c = start()
            if name == "ddp":
                limit = 1.5 * (time.monotonic() - t0) + 30
    finally:
        c.stop()
    return got


def _on_loopback(s: Sizes) -> dict[str, dict]:
    import nbdist

    return _races(lambda: nbdist.start(n=2, threads_per_engine=1), s)


def _netns():
    """The tests' two-host helper (``tests/netns.py``)."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    import netns

    return netns


def _on_slow_link(s: Sizes, tmp: Path) -> dict[str, dict]:
    import nbdist

    netns = _netns()
    hosts = netns.TwoHosts(tmp / "hosts", routed=True, rate=RATE)
    try:
        f = netns.cluster_file(
            tmp / "cluster.toml",
            [hosts.host("a"), hosts.host("b")],
            ip=hosts.kernel_addr["a"],
            threads_per_engine=1,
            remote_dir=str(tmp / "remote"),
        )
        return _races(lambda: nbdist.start(cluster_file=f), s)
    finally:
        hosts.close()


def _results(link: str, got: dict[str, dict], s: Sizes, with_bytes: bool) -> list[Result]:
    """Rows of ratios against ddp: time to the target, and (shaped link) MB per step."""
    base = got["ddp"]
    rows = []
    for name, _ in VARIANTS[1:]:
        r = got[name]
        if "refused" in r or "failed" in r:
            why = "n/a (not built)" if "refused" in r else f"failed: {r['failed']}"
            rows.append(Result(f"{link}: {name} / ddp, s to {s.target:.0%}", math.nan,
                               base["seconds"], "s", note=why))  # fmt: skip
            continue
        seconds = r["seconds"] if r["reached"] else math.nan
        rows.append(Result(
            f"{link}: {name} / ddp, s to {s.target:.0%}", seconds, base["seconds"], "s",
            note=f"({r['steps']} steps vs {base['steps']}"
            + ("" if r["reached"] else f"; only {r['accuracy']:.0%}") + ")",
        ))  # fmt: skip
        if with_bytes:
            rows.append(Result(f"{link}: {name} / ddp, MB sent+received per step",
                               r["bytes"] / r["steps"] / 1e6, base["bytes"] / base["steps"] / 1e6,
                               "MB"))  # fmt: skip
    return rows


def run(tiny: bool = False, **sizes) -> list[Result]:
    """The race on the shaped link (full runs, as root) and on loopback."""
    s = replace(TINY if tiny else FULL, **sizes)
    results = []
    if not tiny:
        reason = _netns().unavailable(shaped=True)
        if reason:
            results.append(Result(f"{RATE} link: skipped", math.nan, math.nan, note=reason))
        else:
            with tempfile.TemporaryDirectory(prefix="nbdist-slow-") as tmp:
                got = _on_slow_link(s, Path(tmp))
            results += _results(f"{RATE} link", got, s, with_bytes=True)
    results += _results("loopback", _on_loopback(s), s, with_bytes=False)
    return results


if __name__ == "__main__":
    from . import table

    print(table(run(tiny="--tiny" in sys.argv)))
