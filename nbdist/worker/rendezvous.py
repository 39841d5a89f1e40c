"""Forming, checking and tearing down the process group, on an engine.

Rendezvous works as under torchrun's agent: rank 0's engine serves a TCPStore on a socket it bound
itself (a free port with no race, on the address named, never on all interfaces), and every rank
joins it as a client under a prefix of its own for each formation, so a re-formed group never
reads a stale key (torch's own env:// path reuses the keys of the last group). Calls to
``init_process_group`` go through the same path: a no-op while nbdist's group stands, a fresh
formation after the user's code destroyed it. So code written for torchrun runs unchanged.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ..protocol import RankInfo
from . import context, groups, host
from .state import engine


def serve_store(addr: str, own: bool = False) -> int:
    """Serve the rendezvous store on ``addr`` (rank 0's engine) and return its port. ``own``:
    a store of its own for one sweep trial's group, in place of this engine's previous one
    (the world's store is never shared with a trial's group)."""
    if own:
        engine.trial_store = _listen(addr)
        return engine.trial_store[0].port
    if engine.store is None:
        engine.store, engine.store_socket = _listen(addr)
    return engine.store.port


def _listen(addr: str) -> tuple:
    """A TCPStore served on a free port of ``addr``, and the socket it serves on (kept open as
    long as the store serves it)."""
    sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
    sock.bind((addr, 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    store = dist.TCPStore(
        addr, port, is_master=True, wait_for_workers=False, master_listen_fd=sock.fileno()
    )
    return store, sock


def _interface_of(addr: str) -> str | None:
    """The network interface that owns ``addr`` (gloo listens there and nowhere else)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == addr for a in addrs):
            return name
    return None


def host_address(peer: str, interface: str | None = None) -> str:
    """This host's address as others reach it: the IPv4 address of ``interface`` if named,
    else the address this host's traffic to ``peer`` leaves from (the routing table's answer;
    no packet is sent). Used for MASTER_ADDR on rank 0's host."""
    import psutil

    if interface:
        addrs = psutil.net_if_addrs()
        for a in addrs.get(interface, []):
            if a.family == socket.AF_INET:
                return a.address
        raise RuntimeError(
            f"{socket.gethostname()} has no IPv4 address on interface {interface!r}; "
            f"its interfaces: {', '.join(sorted(addrs))}"
        )
    with socket.socket(socket.AF_INET6 if ":" in peer else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))
        return s.getsockname()[0]


def form(ri: RankInfo, timeout: float) -> float:
    """Join the process group described by ``ri``; return seconds taken.

    Ends with an all-reduce that proves every rank is in the same group: two processes that
    believe they train together but never synchronise are caught here, not after an epoch.
    """
    t0 = time.perf_counter()
    engine.retired_groups.clear()  # destroyed earlier, idle since: safe to free now
    _release()  # whatever group this engine had is over (a failed cell aborted it already)
    context.set_current(ri)
    engine.formations = 0
    iface = _interface_of(host_address(ri.master_addr))  # where this host reaches rank 0
    if iface:  # gloo (NCCL: its bootstrap) listens there, where the other hosts reach this one
        os.environ.setdefault(f"{ri.backend.upper()}_SOCKET_IFNAME", iface)
    if ri.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(ri.device))
    elif engine.pin_cores:  # its own cores, by its place on its host (worker.host)
        host.pin(ri.local_rank, ri.local_world_size)
    _init(ri.backend, timedelta(seconds=timeout))
    probe = torch.ones(1, device=ri.device)
    dist.all_reduce(probe)
    if int(probe.item()) != ri.world_size:
        raise RuntimeError(
            f"process group check failed: all-reduce of ones gave {probe.item()}, "
            f"expected {ri.world_size}; ranks are not in one group"
        )
    return time.perf_counter() - t0


def _release() -> None:
    """Leave a group whose last cell ended here without failing, as it is: no socket shut, no
    abort (no peer waits on this rank), so gloo closes its sockets once, when the group is freed
    (kept until the next formation, or as long as a model uses it). An aborted group closes
    them twice, and a number reused in between would be closed under its new owner."""
    if not is_formed():
        return
    c10d = dist.distributed_c10d
    world = c10d._world
    engine.retired_groups.extend(world.pg_map)
    engine.local_group = None
    c10d._update_default_pg(None)
    for registry in (
        world.pg_map,
        world.pg_names,
        world.pg_group_ranks,
        world.pg_backend_config,
        world.pg_to_tag,
        world.tags_to_pg,
        world.pg_coalesce_state,
    ):
        registry.clear()
    c10d._unregister_all_process_groups()
    world.group_count = 0
    engine.group_sockets.clear()


def is_formed() -> bool:
    """True while this engine is in a process group."""
    return dist.is_available() and dist.is_initialized()


def abort() -> None:
    """Leave the process group at once. Peers blocked in a collective with us fail within
    milliseconds ("Connection closed by peer") instead of waiting for the collective timeout."""
    if not is_formed():
        return
    groups = list(dist.distributed_c10d._world.pg_map)  # the formation's groups (WORLD, new)
    fds = {conn[0] for conn in engine.group_sockets}
    if engine.local_group is not None:  # ranks waiting in its shared memory stop at once
        engine.local_group.stop(f"rank {dist.get_rank()} left the group")
        engine.local_group = None
    _shut_group_sockets()
    try:
        dist.distributed_c10d._abort_process_group()
    except Exception:
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    _hold(groups, fds)


# An aborted gloo group closes its sockets, and closes their numbers once more when the group
# object is freed (when the last model using it goes, at any time). A number reused meanwhile
# (the next group's store client, say) would be closed under its new owner ("Broken pipe"
# while forming, seen when sweeps re-form groups quickly). So each closed number is held by a
# /dev/null placeholder, and the aborted groups are kept, until nothing else holds the groups:
# then they are freed here, at a known time, and only then are the placeholders let go.
_CLOSE_WAIT = 0.1  # seconds an aborted group's sockets get to be closed by gloo
_MAX_HELD = 64  # aborted formations kept at most (a model kept forever must not pin more)


def _hold(groups: list, fds: set[int]) -> None:
    deadline = time.monotonic() + _CLOSE_WAIT
    while any(_inode(fd) is not None for fd in fds) and time.monotonic() < deadline:
        time.sleep(0.002)  # gloo's loop thread closes them as it notices
    wanted = {fd for fd in fds if _inode(fd) is None}
    opened: list[int] = []
    while wanted and len(opened) < 256:  # the lowest free numbers come first
        fd = os.open(os.devnull, os.O_RDONLY)
        opened.append(fd)
        wanted.discard(fd)
        if fd > max(fds):
            break
    held = [(fd, _inode(fd)) for fd in opened if fd in fds]
    for fd in opened:
        if fd not in fds:
            os.close(fd)
    engine.held_groups.append((groups, held))
    _release_unheld()


def _release_unheld() -> None:
    """Free the aborted groups nothing else holds any more, then their placeholders."""
    keep = []
    for i, (aborted, held) in enumerate(engine.held_groups):
        # 3 references: the list, the loop's name, getrefcount's argument
        pinned = any(sys.getrefcount(g) > 3 for g in aborted)
        if pinned and len(engine.held_groups) - i <= _MAX_HELD:
            keep.append((aborted, held))
            continue
        aborted.clear()  # the last reference: gloo closes its numbers again, now
        for fd, inode in held:
            if _inode(fd) == inode:  # still our placeholder
                os.close(fd)
    engine.held_groups = keep


def _inode(fd: int) -> tuple | None:
    """(device, inode) of what ``fd`` refers to; None when it is closed."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


_original_init = dist.init_process_group


def _shut_group_sockets() -> None:
    """Shut the group's connections down, so peers blocked on us fail at once.

    ``_abort_process_group`` closes gloo's connections only when nothing else holds the group,
    and a DDP model does: without this, a peer waiting in an all-reduce would wait for the
    collective timeout. NCCL's abort needs no help; its connections are not in this set.
    """
    live = groups.tcp()
    for conn in engine.group_sockets & live:  # same fd, same endpoints: still gloo's socket
        try:
            with socket.socket(fileno=os.dup(conn[0])) as s:
                s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    engine.group_sockets.clear()


def _init(backend: str | None, timeout: timedelta | None = None, **kwargs) -> None:
    """Form the default group on nbdist's store, under a prefix no earlier formation used."""
    ri = context.current()
    engine.formations += 1
    engine.mesh, engine.meshes = None, {}  # a mesh lives as long as the group it was made over
    client = dist.TCPStore(
        ri.master_addr, ri.master_port, is_master=False, timeout=timeout or timedelta(minutes=5)
    )
    store = dist.PrefixStore(f"nbdist/{ri.attempt}/{engine.formations}", client)
    previous = groups.begin(ri.world_size, ri.rank)  # the groups the last formation made
    if previous is not None and previous.made:
        engine.previous_groups = previous
    if timeout is not None:
        kwargs["timeout"] = timeout
    engine.local_group = None
    groups.tracked(
        _original_init,
        backend=backend or ri.backend, store=store, rank=ri.rank, world_size=ri.world_size,
        **kwargs,
    )  # fmt: skip


@functools.wraps(_original_init)
def _idempotent_init(backend=None, init_method=None, *args, **kwargs):
    """``init_process_group`` as torchrun scripts call it: a no-op when nbdist's group is formed."""
    if dist.is_initialized():
        ws = kwargs.get("world_size", -1)
        if ws not in (-1, None, dist.get_world_size()):
            raise ValueError(
                f"init_process_group(world_size={ws}) but this cluster has "
                f"{dist.get_world_size()} ranks: drop world_size, or restart with "
                f"%nbdist start -n {ws}"
            )
        wanted = str(backend).lower() if backend else None
        if wanted in (None, dist.get_backend().lower()) or wanted in dist.get_backend().lower():
            return None
        dist.destroy_process_group()
    if init_method in (None, "env://") and "store" not in kwargs and engine.rank_info is not None:
        kwargs.pop("rank", None)
        kwargs.pop("world_size", None)
        return _init(backend, kwargs.pop("timeout", None), **kwargs)
    return _original_init(backend, init_method, *args, **kwargs)


_original_destroy = dist.destroy_process_group


@functools.wraps(_original_destroy)
def _deferred_destroy(group=None):
    """``destroy_process_group``, keeping the group object alive until the next formation.

    torch's gloo group joins its worker threads in its destructor without releasing the GIL,
    and a worker finishing its last collective needs the GIL to free that collective's
    tensors: when a script destroys the group and then drops its DDP model (the group's last
    owner), the engine deadlocks about one run in five. Freed at the next formation, seconds
    later, the group finds its workers idle.
    """
    pg = group if group is not None else (dist.group.WORLD if dist.is_initialized() else None)
    if pg is not None:
        engine.retired_groups.append(pg)
    return _original_destroy(group)


def formation() -> tuple[int, int]:
    """Which formation of the group stands on this engine: (its attempt, its count in it)."""
    info = engine.rank_info
    return (info.attempt if info is not None else -1, engine.formations)


def install_idempotent_init() -> None:
    """Route ``init_process_group`` through the idempotent wrapper, and
    ``destroy_process_group`` through the deferring one; record the groups each formation
    makes (``groups``)."""
    groups.install()
    dist.init_process_group = _idempotent_init
    dist.distributed_c10d.init_process_group = _idempotent_init
    dist.destroy_process_group = _deferred_destroy
    dist.distributed_c10d.destroy_process_group = _deferred_destroy
