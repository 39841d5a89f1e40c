"""The group DDP models on CPU all-reduce through: gloo, with all-reduce through shared memory
when every rank of the group runs on this host (``shared_memory``).

A DDP model on CPU made on an engine with no ``process_group`` gets this group in place of the
default one, made once per formation by the first such model (a collective: every rank makes its
model at the same point). It is a ``ProcessGroup`` whose all-reduce of a CPU tensor goes through
shared memory when every rank shares this host (a local cluster, or one remote host), and whose
every other operation (broadcast, all-gather, barrier, ...) is gloo's, registered under it: so
DDP's start (its broadcast of the weights, its check of their shapes) and everything it does
beside its gradient all-reduce run as they would on gloo. The default group stays gloo: code that
asks ``dist.get_backend()``, frameworks, ``dist.all_reduce`` without a group, device meshes and
nbdist's own collectives see exactly what they would under torchrun. ``--no-shm`` (config
``shared_memory=False``) leaves DDP on the default group.

Where a rank cannot map the segment (no room in ``/dev/shm``, another host, not x86-64 Linux)
every rank agrees, through the group's store, and DDP keeps the default group.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import socket
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future as _work_from_future
from torch.distributed import ProcessGroupGloo

from .. import groups, rendezvous
from ..state import engine
from . import counting, segments, shared_memory

#: The backend name of the group (``dist.get_backend(model.process_group)``).
NAME = "nbdist_shm"
_SLOT_MAX = 4 << 20  # bytes a rank moves a round
_SEGMENT_MAX = 64 << 20  # bytes of a segment, whatever the ranks (a container's /dev/shm: 64 MiB)


class LocalGroup(dist.ProcessGroup):
    """gloo's group over ``store``, whose all-reduce of a CPU tensor goes through shared memory
    (``exchange``; None where the ranks could not all map it)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._gloo = ProcessGroupGloo(store, rank, size, timeout)
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo)
        self.exchange = _open(store, rank, size, timeout.total_seconds())

    def allreduce(self, tensors: list[torch.Tensor], opts=None):  # the C++ group calls this
        opts = opts if opts is not None else dist.AllreduceOptions()
        fn = shared_memory.reducer(tensors[0], opts.reduceOp) if len(tensors) == 1 else None
        with counting.entered("all_reduce"):  # DDP's: from C++, past torch's Python functions
            self._allreduce(tensors, opts, fn)
        done = torch.futures.Future()
        done.set_result(tensors)
        return _work_from_future(done)

    def _allreduce(self, tensors: list[torch.Tensor], opts, fn) -> None:
        if self.exchange is None or fn is None:
            # done here, not handed back pending: torch keeps a Work made in Python alive by a
            # holder whose end takes the interpreter's lock, on whichever thread ends it; gloo's
            # worker thread ending it while this thread holds that lock and waits on gloo's
            # queue is a deadlock (seen: a DDP cell hung across two hosts)
            self._gloo.allreduce(tensors, opts).wait()
        elif torch.autograd._profiler_enabled():  # --profile: a collective, as gloo's are
            with torch.profiler.record_function(f"{NAME}:all_reduce"):
                self.exchange.allreduce(tensors[0], fn)
        else:
            self.exchange.allreduce(tensors[0], fn)

    def getBackendName(self) -> str:  # noqa: N802 (the C++ name)
        return NAME

    def _on_gloo(self, name: str, *args, **kwargs):
        """gloo's ``name``, called from here rather than by torch's C++ group under this one:
        that call holds the interpreter's lock while it waits on gloo's queue, and gloo's
        worker thread, freeing the last operation's tensors, waits for that lock with the
        queue held (a deadlock, seen: a broadcast after a broadcast hung). Called from
        Python, gloo's binding lets the lock go first."""
        return getattr(self._gloo, name)(*args, **kwargs)

    def stop(self, why: str) -> None:
        """Stop every rank's shared-memory calls at once, each saying ``why`` (gloo's part is
        shut with its sockets)."""
        if self.exchange is not None:
            self.exchange.abort(why)

    def abort(self) -> None:
        """torch's abort of every group (``rendezvous.abort``) reaches the shared memory too."""
        self.stop("the group was aborted")
        super().abort()


#: The operations torch's C++ group would hand gloo itself (see ``LocalGroup._on_gloo``).
_ON_GLOO = (
    "broadcast", "allgather", "_allgather_base", "allgather_coalesced", "allreduce_coalesced",
    "alltoall", "alltoall_base", "barrier", "gather", "scatter", "reduce", "reduce_scatter",
    "_reduce_scatter_base", "send", "recv",
)  # fmt: skip
for _name in _ON_GLOO:
    setattr(LocalGroup, _name, functools.partialmethod(LocalGroup._on_gloo, _name))


def _slot(size: int) -> int:
    return max(64 << 10, min(_SLOT_MAX, _SEGMENT_MAX // (2 * size)) // 64 * 64)


def _identity() -> str:
    """What ranks must share to share memory and see each other's processes: one boot of one
    machine, one process namespace, and one network namespace (hosts simulated in network
    namespaces, as the tests' are, stay apart, their traffic on the links between them)."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    spaces = "/".join(str(os.stat(f"/proc/self/ns/{ns}").st_ino) for ns in ("pid", "net"))
    return f"{boot}/{spaces}/{socket.gethostname()}"


def _make(nbytes: int) -> tuple[int, str]:
    """A new file of ``nbytes`` (its blocks allocated: a full tmpfs fails here, not with a
    SIGBUS mid-step), readable by its owner alone, named for this process (``segments``); its
    descriptor and path. Whatever stops it midway takes the file away again."""
    last: OSError | None = None
    for folder in segments.folders():
        try:
            fd, path = tempfile.mkstemp(prefix=segments.prefix(), dir=folder)
        except OSError as e:
            last = e
            continue
        try:
            os.posix_fallocate(fd, 0, nbytes)
            return fd, path
        except BaseException as e:  # no room, or an interrupt while it allocates
            os.close(fd)
            os.unlink(path)
            if not isinstance(e, OSError):
                raise
            last = e
    raise last or OSError("no folder for shared memory")


def _open(store, rank: int, size: int, timeout: float) -> shared_memory.Exchange | None:
    """Map one segment on every rank, or on none: the ranks agree through ``store``. However
    the agreement ends (a peer gone, an interrupt), rank 0 unlinks the file and every rank
    closes its descriptor: only a mapping stays."""
    if size < 2:
        return None
    slot = _slot(size)
    nbytes = shared_memory.segment_bytes(size, slot)
    fd, path, mine = -1, "", "no"
    try:
        try:
            if not shared_memory.supported():
                raise OSError("not x86-64 Linux")
            if rank == 0:
                fd, path = _make(nbytes)
                store.set("shm/path", path)
            else:
                path = store.get("shm/path").decode()
                fd = os.open(path, os.O_RDWR) if path else -1
                st = os.fstat(fd) if fd >= 0 else None
                if st is None or st.st_uid != os.getuid() or st.st_size != nbytes:
                    raise OSError(f"cannot use {path!r}")
            mine = f"{_identity()} {os.getpid()}"
        except OSError:
            if rank == 0 and not path:
                store.set("shm/path", "")
        store.set(f"shm/ok/{rank}", mine)
        said = [store.get(f"shm/ok/{k}").decode() for k in range(size)]
        if "no" in said or len({s.split()[0] for s in said}) != 1:
            return None
        pids = [int(s.split()[1]) for s in said]
        return shared_memory.Exchange(fd, rank, size, slot, pids, timeout)
    finally:
        if rank == 0 and path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # every rank has it open, gave up, or never will
        if fd >= 0:
            os.close(fd)  # the mapping stays


def register() -> None:
    """Make ``NAME`` a backend ``dist.new_group`` knows (once per process)."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, LocalGroup, devices=["cpu"])


def for_model(module: torch.nn.Module) -> dist.ProcessGroup | None:
    """The group a DDP model of ``module`` made with no group should use: this formation's
    ``LocalGroup`` (made now if it is the first), or None to keep torch's default.

    Every test here gives the same answer on every rank (one setting, one backend, one world,
    the same code), so either every rank makes the group or none does. Whether the ranks share
    a host is not asked here (a sweep trial's ranks may, its world's not): ``_open`` finds out.
    """
    if not (engine.shared_memory and engine.rank_info is not None and dist.is_initialized()):
        return None
    if dist.get_world_size() < 2 or dist.get_backend() != "gloo":
        return None
    if any(t.device.type != "cpu" for t in (*module.parameters(), *module.buffers())):
        return None
    if engine.local_group is None:
        make()
    # where the ranks could not share memory, DDP stays on the default group, as under torchrun
    return engine.local_group if engine.local_group.exchange is not None else None


def make() -> None:
    """Make this formation's ``LocalGroup`` (every rank at once: it is a collective)."""
    register()
    engine.local_group = dist.new_group(backend=NAME)  # its connections tracked (groups)


_DDP = torch.nn.parallel.DistributedDataParallel
_original_ddp_init = _DDP.__init__
_DDP_SIGNATURE = inspect.signature(_original_ddp_init)


@functools.wraps(_original_ddp_init)
def _ddp_init(self, *args, **kwargs):
    """DDP's constructor, given this formation's ``LocalGroup`` when it names no group."""
    bound = _DDP_SIGNATURE.bind(self, *args, **kwargs)
    named = bound.arguments
    if named.get("process_group") is None and named.get("device_mesh") is None:
        group = for_model(named["module"])
        if group is not None:
            named["process_group"] = group
    _original_ddp_init(*bound.args, **bound.kwargs)
    if dist.is_initialized():  # bound to this formation: the next one binds it again (rebind)
        groups.track(self, "ddp", rendezvous.formation())


def install() -> None:
    """Route DDP models made with no group through ``for_model``; make ``NAME`` a backend
    (a fresh engine makes the group again with its peers: ``groups.remake``)."""
    register()
    counting.install()
    _DDP.__init__ = _ddp_init
