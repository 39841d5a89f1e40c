"""A real slow link: engines on two hosts, each a network namespace with its own subnet, address
and hostname and an sshd, joined to this machine by a veth pair of its own shaped with ``tc
tbf`` (``tests/netns.py``). The hosts reach this machine by different addresses, so the cluster
file names the controller's with ``ip``; host b reaches host a (rank 0) only through this
machine. Started as a person would, from a cluster file over ssh. Skipped, with the reason,
where namespaces cannot be made (not root, no ``ip`` or ``tc``).
"""

from __future__ import annotations

import textwrap

import netns
import psutil
import pytest
from netns import cluster_file
from processes import assert_gone

import nbdist

RATE = "80mbit"
RATE_BITS = 80e6

_NETWORK = textwrap.dedent(
    """
    import os, socket, psutil
    peers = {(c.laddr.ip, c.raddr.ip) for c in psutil.Process().net_connections("tcp")
             if c.raddr and c.status == psutil.CONN_ESTABLISHED}
    net = {"master": os.environ["MASTER_ADDR"], "hostname": socket.gethostname(),
     "gloo": os.environ.get("GLOO_SOCKET_IFNAME"), "peers": sorted(peers)}
    """
)

_DDP = textwrap.dedent(
    """
    import torch
    torch.manual_seed(0)
    model = nbdist.prepare(torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                               torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(nbdist.rank())
    X = torch.randn(128, 16, generator=g)
    y = X.sum(1, keepdim=True)
    losses = []
    for step in range(40):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(X), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.zeros_like(flat) for _ in range(nbdist.world_size())]
    torch.distributed.all_gather(everyone, flat)
    ({"identical": all(torch.equal(everyone[0], t) for t in everyone),
      "first": losses[0], "last": losses[-1],
      "shared_memory": getattr(model.process_group, "exchange", None) is not None})
    """
)

_ALL_REDUCE = textwrap.dedent(
    """
    import time, torch, torch.distributed as dist
    x = torch.ones(MB * 2**18)  # MB megabytes of float32
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(x)
    took = time.perf_counter() - t0
    (took, bool((x == nbdist.world_size()).all()))
    """
)


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """The two shaped hosts and a cluster of one engine on each, from a cluster file."""
    if reason := netns.unavailable(shaped=True):
        pytest.skip(reason)
    home = tmp_path_factory.mktemp("slow-link")
    hosts = netns.TwoHosts(home / "hosts", routed=True, rate=RATE)
    try:
        f = cluster_file(
            home / "cluster.toml",
            [hosts.host("a"), hosts.host("b")],
            ip=hosts.kernel_addr["a"],  # host b reaches it across this machine's routing
            remote_dir=str(home / "remote"),
        )
        c = nbdist.start(cluster_file=f)
    except BaseException:
        hosts.close()
        raise
    yield hosts, c
    if nbdist.current(required=False) is c:
        c.stop()
    hosts.close()


def test_every_address_is_the_hosts_own(slow):
    hosts, c = slow
    a, b = hosts.addr["a"], hosts.addr["b"]
    assert c.cfg.ip == hosts.kernel_addr["a"] != hosts.kernel_addr["b"]
    assert [s.host for s in c.slots] == [a, b]
    assert c.master_addr == a
    c.run(_NETWORK)
    net = [c.pull("net", rank=r) for r in range(2)]
    assert [n["master"] for n in net] == [a, a]
    assert [n["hostname"] for n in net] == [hosts.hostname["a"], hosts.hostname["b"]]
    assert [n["gloo"] for n in net] == [hosts.iface["a"], hosts.iface["b"]]
    controller = hosts.kernel_addr["a"]
    assert (a, controller) in {tuple(p) for p in net[0]["peers"]}, net[0]["peers"]
    assert (b, controller) in {tuple(p) for p in net[1]["peers"]}, net[1]["peers"]
    assert (b, a) in {tuple(p) for p in net[1]["peers"]}  # rank 1 to rank 0: the group's links


def test_ddp_trains_across_the_slow_link_to_identical_parameters(slow):
    _, c = slow
    out = c.run(_DDP)
    assert out["identical"], out
    assert out["last"] < out["first"] / 5, out
    assert not out["shared_memory"], "hosts apart shared memory: their gradients skip the link"


def test_the_link_is_really_shaped(slow):
    hosts, c = slow
    mb = 8
    before = hosts.link_bytes("b")
    took, right = c.run(_ALL_REDUCE.replace("MB", str(mb)))
    moved = hosts.link_bytes("b") - before
    assert right
    floor = mb * 2**20 * 8 / RATE_BITS  # each rank sends and receives about mb MB (ring, 2 ranks)
    assert took >= 0.9 * floor, f"{mb} MB all-reduced in {took:.2f} s: faster than {RATE}"
    assert took < 6 * floor, f"{mb} MB all-reduced in {took:.2f} s: far slower than {RATE}"
    assert moved >= 2 * mb * 2**20, f"only {moved} bytes crossed host b's link"


def test_everything_is_gone_after_stop_and_close(slow):
    hosts, c = slow
    engines = [p for pids in c.engines.remote_pids().values() for p in pids]
    local = [p.pid for p in c.engines.processes()]
    sshds = [psutil.Process(pid) for pid in hosts.pids()]
    c.stop()
    assert_gone(engines + local, timeout=15)
    hosts.close()
    assert_gone(sshds, timeout=10)
    assert hosts.leftovers() == []
