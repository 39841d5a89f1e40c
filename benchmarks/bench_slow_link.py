"""Training over a slow link: time to a fixed accuracy, and bytes per step, by how ranks sync;
then the same race with one rank made 3 times slower, and with one rank killed.

Two hosts (network namespaces, an sshd in each, ``tests/netns.py``) are joined to this machine
by veth pairs shaped to ``RATE`` with ``tc tbf``; one engine on each, started from a cluster
file over ssh, as a person would. The same races then run on loopback (``nbdist.start(n=2)``).
The race: an MLP of about 1.2M parameters (4.8 MB of gradients) on a synthetic 10-class task
shipped here (Gaussian clusters, 4 per class), AdamW, 64 samples per rank per step, until the
ranks' mean accuracy on a fixed held-out set reaches ``target`` (checked every ``every`` steps;
each rank scores its own model, which between syncs is its local one). Time counts training
steps only (the slowest rank's); bytes are both directions of host a's interface during the
race. Variants: ``ddp`` (the baseline of every ratio), ``compress="fp16"``,
``compress="powersgd"`` (nbdist's defaults), ``sync="local_sgd"`` with two values of H,
``sync="diloco"``, ``sync="gossip"`` (the ring's mixing, point to point; ranks still stop on
the mean accuracy, together) and ``sync="async"`` (the parameter service: ranks never wait for
each other, so that race has no collective after ``prepare``: each rank stops when its own
model, the global one plus its recent local progress, reaches the target, and the time is
rank 0's own); a variant that ``prepare`` refuses is shown as "n/a (not built)".

Full runs race ``MODES`` (ddp, local SGD, DiLoCo, gossip, async) twice more on each link:

- rank ``SLOW_RANK`` held to a third of a core by a CPU quota on its engine process, from
  outside (a cgroup, ``_quota``; v2's ``cpu.max``, or v1's ``cpu.cfs_quota_us`` where the
  machine has only that), so ddp waits for it every step and async need not: slowed ddp
  against ddp at full speed, then each mode against slowed ddp. Without root or a cgroup cpu
  controller these rows say "skipped: why";
- rank ``SLOW_RANK``'s engine SIGKILLed by its PID (``_faults``), from outside, once it has made
  a third of ddp's steps: the synchronous modes fail (the cell raises, the cluster is
  replaced), async goes on on rank 0; each row says at what accuracy a mode finished.

    python -m benchmarks --only slow-link      # or: python -m benchmarks.bench_slow_link

Needs root for the namespaces and the quota; without it, or with ``--tiny``, only the loopback
race runs (with ``--tiny``: without the slowed and killed races).
"""

from __future__ import annotations

import contextlib
import math
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from . import Result, _faults, _quota

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
    ("gossip H=4", {"sync": "gossip", "sync_every": 4}),
    ("async H=4", {"sync": "async", "sync_every": 4}),
)
#: The modes raced again with one rank slowed, and with one rank killed (ddp first).
MODES = tuple(v for v in VARIANTS if v[0] in ("ddp", "local_sgd H=4", "diloco H=16",
                                               "gossip H=4", "async H=4"))  # fmt: skip
#: The rank slowed (by a CPU quota on its engine) or killed: not rank 0, whose host runs
#: async's parameter service (started after the quota, it would inherit it) and whose figures
#: reach the notebook.
SLOW_RANK = 1
#: Its share of one core (engines run one thread: ``threads_per_engine=1``): 3 times slower.
SLOW_SHARE = 1 / 3


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
def _races(start, s: Sizes, variants=VARIANTS, around=None, limit: float = 1200.0) -> dict:
    """Every variant, one cell each, on clusters from ``start()``: rank 0's figures by name.

    ddp runs first; the others get 1.5 times its wall time (plus 30 s) before they count as
    failed, and a failure (torch's PowerSGD hook can hang or abort on gloo; a killed rank)
    costs only that row: the cluster is replaced for the next. ``around(c)``, a context
    manager entered for each cell, yields the race's ``watch`` and a dict of what it did,
    merged into the row's figures (a quota on a rank; a killer).
    """
    import time

    import nbdist
    from nbdist.config import CellOptions

    load = (f"import sys\nif {str(ROOT)!r} not in sys.path: sys.path.insert(0, {str(ROOT)!r})\n"
            "from benchmarks.bench_slow_link import race\n")  # fmt: skip
    got, c = {}, start()
    try:
        for i, (name, opts) in enumerate(variants, 1):
            t0 = time.monotonic()
            try:
                with around(c) if around else contextlib.nullcontext((None, {})) as (watch, did):
                    got[name] = c.run(
                        load + f"race({opts!r}, {asdict(s)!r}, {watch!r})",
                        CellOptions(timeout=limit),
                    )
            except nbdist.DistributedCellError as e:
                got[name] = {"failed": str(e).splitlines()[0][:80]}
                c.stop()
                c = start()
            got[name].update(did, wall=time.monotonic() - t0)
            if did.get("killed") and "failed" not in got[name] and i < len(variants):
                c.stop()  # it went on without the killed rank: the next cell starts whole
                c = start()
            if name == "ddp" and "failed" not in got[name]:
                limit = 1.5 * got[name]["wall"] + 30
    finally:
        c.stop()
    return got


def _on(start, s: Sizes, tmp: Path, extras: bool) -> dict[str, dict]:
    """The races on clusters from ``start()``: the plain ones (by variant's name), then, with
    ``extras``, the slow rank held to a CPU quota ("slowed: NAME") and killed ("killed: NAME")."""
    got = _races(start, s)
    if not extras:
        return got
    if (why := _quota.unavailable()) is None:
        slowed = _races(start, s, MODES, around=_faults.slowed(SLOW_RANK, SLOW_SHARE))
    else:
        slowed = {name: {"skipped": why} for name, _ in MODES}
    base = got["ddp"]
    at = max(1, base.get("steps", s.max_steps) // 3)
    tmp.mkdir()
    kill = _faults.killer(SLOW_RANK, tmp, at, within=3 * base.get("wall", 1200.0) + 60)
    killed = _races(start, s, MODES, around=kill, limit=3 * base.get("wall", 400.0) + 60)
    return {**got, **{f"slowed: {k}": v for k, v in slowed.items()},
            **{f"killed: {k}": v for k, v in killed.items()}}  # fmt: skip


def _on_loopback(s: Sizes, tmp: Path, extras: bool) -> dict[str, dict]:
    import nbdist

    return _on(lambda: nbdist.start(n=2, threads_per_engine=1), s, tmp / "loopback", extras)


def _netns():
    """The tests' two-host helper (``tests/netns.py``)."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    import netns

    return netns


def _on_slow_link(s: Sizes, tmp: Path, extras: bool) -> dict[str, dict]:
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
        return _on(lambda: nbdist.start(cluster_file=f), s, tmp / "link", extras)
    finally:
        hosts.close()


def _results(link: str, got: dict[str, dict], s: Sizes, with_bytes: bool) -> list[Result]:
    """Rows of ratios against ddp: time to the target, and (shaped link) MB per step; then, when
    measured, the same with the slow rank slowed (against slowed ddp), and killed."""
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
    if "slowed: ddp" in got:
        rows += _slowed_rows(link, got, s)
    if "killed: ddp" in got:
        rows += _killed_rows(link, got, s)
    return rows


def _seconds(r: dict) -> float:
    return r["seconds"] if r.get("reached") else math.nan


def _slowed_rows(link: str, got: dict[str, dict], s: Sizes) -> list[Result]:
    """Rank ``SLOW_RANK`` at ``SLOW_SHARE`` of a core: slowed ddp against ddp at full speed,
    then every mode against slowed ddp."""
    where, to = f"{link}, rank {SLOW_RANK} at 1/{round(1 / SLOW_SHARE)} CPU", f"s to {s.target:.0%}"
    slow = got["slowed: ddp"]
    if "skipped" in slow:
        return [Result(f"{where}: skipped", math.nan, math.nan, note=f"skipped: {slow['skipped']}")]
    rows = [Result(f"{where}: ddp / ddp at full speed, {to}", _seconds(slow),
                   got["ddp"]["seconds"], "s", note=_how(slow, got["ddp"]))]  # fmt: skip
    for name, _ in MODES[1:]:
        r = got[f"slowed: {name}"]
        rows.append(Result(f"{where}: {name} / ddp, {to}", _seconds(r),
                           slow.get("seconds", math.nan), "s", note=_how(r, slow)))  # fmt: skip
    return rows


def _killed_rows(link: str, got: dict[str, dict], s: Sizes) -> list[Result]:
    """Rank ``SLOW_RANK`` killed mid-race: each mode's time to the target (if it finished)
    against ddp's with no rank killed."""
    rows = []
    for name, _ in MODES:
        r = got[f"killed: {name}"]
        rows.append(Result(
            f"{link}, rank {SLOW_RANK} killed: {name} / ddp unharmed, s to {s.target:.0%}",
            _seconds(r), got["ddp"]["seconds"], "s", note=_how(r, None),
        ))  # fmt: skip
    return rows


def _how(r: dict, base: dict | None) -> str:
    """A row's note: how the race went (failed, finished at what accuracy, killed when)."""
    killed = f"rank {SLOW_RANK} killed at step {r['killed']}" if r.get("killed") else ""
    if "killed" in r and not killed:
        killed = f"rank {SLOW_RANK} not killed: the race ended first"
    if "failed" in r or "refused" in r:
        why = "failed: rank lost" if r.get("killed") else f"failed: {r.get('failed', 'refused')}"
        return f"{why} ({killed})" if killed else why
    went = f"finished at {r['accuracy']:.0%}, {r['steps']} steps"
    if base is not None and "steps" in base:
        went += f" vs {base['steps']}"
    return f"{went}{'; ' + killed if killed else ''}"


def run(tiny: bool = False, extras: bool | None = None, shaped: bool | None = None,
        **sizes) -> list[Result]:  # fmt: skip
    """The race on the shaped link (full runs, as root) and on loopback; with ``extras`` (full
    runs) also with one rank slowed by a CPU quota and with one rank killed."""
    s = replace(TINY if tiny else FULL, **sizes)
    extras = not tiny if extras is None else extras
    results = []
    with tempfile.TemporaryDirectory(prefix="nbdist-slow-") as tmp:
        if not tiny if shaped is None else shaped:
            reason = _netns().unavailable(shaped=True)
            if reason:
                results.append(Result(f"{RATE} link: skipped", math.nan, math.nan, note=reason))
            else:
                got = _on_slow_link(s, Path(tmp), extras)
                results += _results(f"{RATE} link", got, s, with_bytes=True)
        got = _on_loopback(s, Path(tmp), extras)
        results += _results("loopback", got, s, with_bytes=False)
    return results


if __name__ == "__main__":
    from . import table

    print(table(run(tiny="--tiny" in sys.argv)))
