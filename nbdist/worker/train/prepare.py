"""Training helpers for engines: make a model data-parallel, and take training steps with it.

``prepare(model, optimizer, ...)`` puts the model on this rank's device and wraps it for
data-parallel training (DDP, or FSDP when asked), with the options the best launchers give:
mixed precision, gradient compression, gradient accumulation. ``train_step(model, optimizer)``
is the one helper a training loop needs to use them all correctly::

    model, opt = nbdist.prepare(net, opt, precision="bf16", accumulate=4)
    for x, y in batches:
        with nbdist.train_step(model, opt) as step:
            loss = F.cross_entropy(model(x), y)
            step.backward(loss)       # not loss.backward(): it scales for accumulation and fp16

Without options, ``prepare`` is plain DDP and a loop of ``loss.backward(); opt.step()`` is fine.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ...errors import UsageError
from .. import context, groups, rendezvous
from ..mesh import layout, materialize
from ..state import engine
from . import sync as sync_modes
from . import sync_options
from .step import Plan

#: Values of ``precision`` (None means fp32).
PRECISIONS = ("fp32", "bf16", "fp16")
#: Values of ``compress`` (None means full-precision all-reduce).
COMPRESSIONS = ("fp16", "bf16", "powersgd")
#: Values of ``strategy``.
STRATEGIES = ("ddp", "fsdp")


def prepare(
    model,
    optimizer=None,
    *,
    precision: str | None = None,
    compress: str | None = None,
    accumulate: int = 1,
    strategy: str = "ddp",
    static_graph: bool = False,
    find_unused_parameters: bool = False,
    powersgd_rank: int = 1,
    powersgd_warmup: int = 0,
    sync: str = "ddp",
    sync_every: int | None = None,
    sync_warmup: int = 0,
    outer_lr: float | None = None,
    outer_momentum: float | None = None,
    topology: str | None = None,
    max_staleness: int | None = None,
    mesh=None,
    plan: dict | None = None,
):
    """Move ``model`` to this rank's device and wrap it for data-parallel training.

    Returns the wrapped model, or ``(model, optimizer)`` when an optimizer is given. Every rank
    starts from rank 0's weights. Defaults cost nothing: gradient buckets are views of the
    gradients (no copy per step). Options are checked before anything moves.

    Options, and when each helps:

    - ``precision="bf16"``: the model's forward runs under ``torch.autocast`` in bfloat16 and its
      floating outputs come back as float32 (so the loss is computed in full precision). Helps on
      GPUs with bf16 (Ampere and later) and on CPUs with AVX512-BF16 or AMX: roughly halves the
      time of matrix multiplies and the activation memory. On CPUs without them it is slower.
      Weights, gradients and the optimizer stay float32; no loss scaling is needed.
    - ``precision="fp16"``: float16 autocast with gradient scaling, on GPUs only (older GPUs
      without bf16). Use ``train_step``, which scales the loss and skips steps whose gradients
      overflowed.
    - ``compress="fp16"`` or ``"bf16"``: gradients travel as 16-bit floats in the all-reduce
      (a DDP communication hook): half the bytes on the wire, relative error about 1e-3 (fp16)
      or 1e-2 (bf16). Helps when the all-reduce is limited by a slow link between hosts.
    - ``compress="powersgd"``: PowerSGD low-rank compression of gradient matrices, rank
      ``powersgd_rank``, errors fed back into later steps. It compresses from the third step
      by default (torch's earliest with error feedback: DDP settles its buckets in the first
      two), not after torch's default 1000 steps of plain all-reduce; ``powersgd_warmup=N``
      asks for N plain steps first. Cuts traffic by 10-100x for large layers; for slow links
      and big models, at the cost of some accuracy, so tune the rank and the warm-up.
    - ``accumulate=k``: ``train_step`` steps the optimizer every ``k`` micro-batches and skips
      the all-reduce on the other ``k - 1`` (forward and backward run inside ``no_sync``): a
      k-times larger effective batch for the memory of one, with ``1/k`` of the communication.
    - ``strategy="fsdp"``: fully sharded data parallel (torch's ``fully_shard``): parameters,
      gradients and optimizer state are split across ranks, for models that do not fit on one
      device. Each child module with parameters becomes a shard unit (call ``fully_shard`` on
      your own blocks before ``prepare`` for finer units). A fresh optimizer passed in is pointed
      at the sharded parameters. Slower than DDP for models that fit.
    - ``static_graph=True``: the model uses the same parameters every step, so DDP can skip its
      per-step bookkeeping and overlap better. ``find_unused_parameters=True``: some parameters
      get no gradient in some steps (costs a graph walk per step; use only when DDP asks).
    - ``sync="local_sgd"`` or ``"diloco"`` with ``sync_every=H`` (and ``opt``): no gradient
      all-reduce; each rank steps on its own and after every H-th ``opt.step()`` the ranks
      agree again, exactly: on the mean of their parameters (local SGD), or on DiLoCo's outer
      Nesterov step (``outer_lr=0.7``, ``outer_momentum=0.9``) on the mean difference between
      the global and the local parameters. ``sync_warmup=N``: N synchronous steps first. For
      slow links, where DDP waits on every step; see ``nbdist.worker.train.sync``.
    - ``sync="gossip"`` with ``sync_every=H`` (and ``opt``), ``topology="ring"`` (the default,
      the only one so far): decentralised training (D-PSGD). After every H-th step each rank
      replaces its parameters and floating buffers by the mean of itself and its two ring
      neighbours (ranks r - 1 and r + 1; weights 1/3, or 1/2 with 2 ranks), sent point to point
      with both exchanges overlapping: no all-reduce, no rank waits for any but its neighbours.
      Ranks stay close, not equal. No ``compress``, mesh or pipeline with it; see
      ``nbdist.worker.train.gossip``.
    - ``sync="async"`` with ``sync_every=H`` (and ``opt``): asynchronous training; no rank ever
      waits for another. After every H-th step a rank sends its change to a global model (a
      parameter service on rank 0's host) on a thread of its own and, when the reply comes,
      takes the global model back keeping what it learnt meanwhile. ``max_staleness=S``
      (default 4 x world size): a change staler than S updates is dropped. A rank that dies
      leaves the others training. See ``nbdist.worker.train.asynchronous``.
    - ``mesh=nbdist.mesh(dp=..., tp=...)``: data parallel over the mesh's ``dp`` dimension only
      (DDP, or FSDP2 with ``strategy="fsdp"``), and ``plan={"ff.up": ColwiseParallel(), ...}``
      applies torch's tensor-parallel plan over its ``tp`` dimension first (checked: a name
      that is no submodule is one line). A model built on the meta device is materialised
      once laid out (``nbdist.materialize``, seed 0), so no rank ever holds it whole. With
      ``pp`` in the mesh, pass a pipeline's stage: see ``nbdist.worker.mesh.layout``.
    """
    precision = None if precision == "fp32" else precision
    _check_options(
        precision, compress, accumulate, strategy, static_graph or find_unused_parameters,
        powersgd_rank, powersgd_warmup,
    )  # fmt: skip
    local = sync_options.check_options(
        sync, optimizer=optimizer, strategy=strategy, compress=compress, precision=precision,
        sync_every=sync_every, sync_warmup=sync_warmup, outer_lr=outer_lr,
        outer_momentum=outer_momentum, topology=topology, mesh=mesh, model=model,
        max_staleness=max_staleness,
    )  # fmt: skip
    on_mesh = layout.check(
        mesh, plan, model, strategy=strategy, sync=sync, compress=compress
    )  # fmt: skip
    info = context.current()
    if not dist.is_initialized():
        raise UsageError(
            "no process group on this rank: run this inside a %%distributed cell of a running "
            "cluster (a failed cell's group is re-formed at the start of the next one)"
        )
    device = torch.device(info.device)
    dtype = _check_device(precision, device)
    synchronizer = None
    names = {id(p): n for n, p in model.named_parameters()}
    if on_mesh is not None:
        model = layout.tensor_parallel(model, on_mesh, plan)
    meta = layout.is_meta(model)
    model = model if meta else model.to(device)
    if strategy == "fsdp":
        wrapped = _fsdp(model, dtype, on_mesh.dp_mesh if on_mesh else None, meta)
        groups.track(wrapped, "fsdp", rendezvous.formation())  # bound again after a stop
    elif on_mesh is not None and (on_mesh.dp == 1 or on_mesh.pp > 1):  # the pipeline averages
        wrapped = materialize.materialize(model) if meta else model
    else:
        # PowerSGD on gloo deadlocks with several buckets (tested, torch 2.13): one bucket on CPU
        cap = 2.0**40 if compress == "powersgd" and device.type == "cpu" else None
        model = materialize.materialize(model) if meta else model
        group = on_mesh.dp_group if on_mesh is not None else None
        if group is not None and layout.has_shards(model):  # DDP cannot hold DTensor weights
            wrapped = layout.replicate(model, on_mesh.dp_mesh, _policy(dtype))
        else:
            flags = (static_graph, find_unused_parameters, local is None)
            wrapped = _ddp(model, device, dtype, *flags, cap, group)

        if local is not None:  # the warm-up all-reduces as compress= says, then nothing
            reduce = None if compress is None else _compressor(compress)
            synchronizer = sync_modes.attach(wrapped, optimizer, local, reduce)
        elif compress is not None:
            _register_compression(wrapped, compress, powersgd_rank, powersgd_warmup)
    # FSDP, a plan and replicate put new parameters in the model: the optimizer follows them
    layout.rebind(optimizer, names, getattr(wrapped, "module", wrapped))
    scaler = None
    if precision == "fp16":
        if strategy == "fsdp":  # each rank sees a shard: overflow must be agreed on by all
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            scaler = ShardedGradScaler(device.type)
        else:
            scaler = torch.amp.GradScaler(device.type)
    engine.training_plans[wrapped] = Plan(accumulate, scaler, static_graph, sync=synchronizer)
    return wrapped if optimizer is None else (wrapped, optimizer)


def _check_options(
    precision, compress, accumulate, strategy, ddp_only, powersgd_rank, powersgd_warmup
) -> None:
    if precision not in (None, *PRECISIONS):
        raise UsageError(f"precision must be one of {PRECISIONS} (or None), not {precision!r}")
    if compress not in (None, *COMPRESSIONS):
        raise UsageError(f"compress must be one of {COMPRESSIONS} (or None), not {compress!r}")
    if strategy not in STRATEGIES:
        raise UsageError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
    if not isinstance(accumulate, int) or isinstance(accumulate, bool) or accumulate < 1:
        raise UsageError(f"accumulate must be a whole number >= 1, not {accumulate!r}")
    if ddp_only and strategy == "fsdp":
        raise UsageError(
            "static_graph and find_unused_parameters are DDP options: drop them with "
            "strategy='fsdp'"
        )
    if compress is not None and strategy == "fsdp":
        raise UsageError(
            "compress works with strategy='ddp' only; with FSDP, precision='bf16' already "
            "halves the traffic"
        )
    if compress == "powersgd" and (not isinstance(powersgd_rank, int) or powersgd_rank < 1):
        raise UsageError(f"powersgd_rank must be a whole number >= 1, not {powersgd_rank!r}")
    if compress == "powersgd" and (not isinstance(powersgd_warmup, int) or powersgd_warmup < 0):
        raise UsageError(f"powersgd_warmup must be a whole number >= 0, not {powersgd_warmup!r}")


def _check_device(precision: str | None, device):
    """The autocast dtype for ``precision`` on ``device``, or a one-line error where it can't."""
    if precision is None:
        return None
    if precision == "fp16":
        if device.type != "cuda":
            raise UsageError(
                "precision='fp16' needs a GPU (gradient scaling is for CUDA); this rank trains on "
                f"{device.type}: use precision='bf16' on CPU"
            )
        return torch.float16
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError("this GPU has no bfloat16: use precision='fp16' (with gradient scaling)")
    return torch.bfloat16


def _ddp(
    model,
    device,
    dtype,
    static_graph: bool,
    find_unused: bool,
    sync_buffers: bool,
    cap_mb=None,
    group=None,
) -> DistributedDataParallel:
    ddp = (DistributedDataParallel if dtype is None else _AutocastDDP)(
        model,
        process_group=group,
        device_ids=[device] if device.type == "cuda" else None,
        bucket_cap_mb=cap_mb,
        gradient_as_bucket_view=True,
        static_graph=static_graph,
        find_unused_parameters=find_unused,
        **({} if sync_buffers else _no_forward_buffer_sync()),
    )
    if dtype is not None:
        ddp.autocast_dtype = dtype
    return ddp


def _no_forward_buffer_sync() -> dict:
    """DDP's option not to broadcast buffers at every forward (renamed in torch 2.13); local
    modes average them when they sync."""
    new = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    return {"forward_sync_buffers" if new else "broadcast_buffers": False}


class _AutocastDDP(DistributedDataParallel):
    """DDP whose forward runs under autocast and returns float32 outputs (state_dict unchanged)."""

    autocast_dtype = torch.bfloat16

    def forward(self, *inputs, **kwargs):
        with torch.autocast(self.device_type, dtype=self.autocast_dtype):
            out = super().forward(*inputs, **kwargs)
        return _to_float32(out)


def _to_float32(obj):
    """``obj`` with its low-precision floating tensors (also inside tuples, lists, dicts) upcast."""
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.dtype in (torch.bfloat16, torch.float16) else obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_to_float32(v) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to_float32(v) for v in obj)
    if isinstance(obj, dict):
        return type(obj)({k: _to_float32(v) for k, v in obj.items()})
    return obj


def _policy(dtype):
    """FSDP2's mixed precision: compute in ``dtype`` (None: as stored), reduce and return fp32."""
    from torch.distributed import fsdp  # not imported by torch.distributed itself

    return fsdp.MixedPrecisionPolicy(
        param_dtype=dtype, reduce_dtype=torch.float32, output_dtype=torch.float32
    )


def _fsdp(model, dtype, dp_mesh=None, meta: bool = False):
    """Shard ``model`` with torch's ``fully_shard`` (over ``dp_mesh``, or every rank): each
    child with parameters, then the root. A meta model is materialised once sharded."""
    from torch.distributed import fsdp  # not imported by torch.distributed itself

    if not hasattr(fsdp, "fully_shard"):
        raise UsageError(
            f"strategy='fsdp' needs torch >= 2.6 (fully_shard); this is torch "
            f"{torch.__version__}: upgrade torch, or use strategy='ddp'"
        )
    policy = _policy(dtype)
    if not meta:  # start from the weights of the group's first rank, as DDP does
        layout.broadcast_weights(model, dp_mesh.get_group() if dp_mesh is not None else None)
    try:
        for child in model.children():
            has_params = any(True for _ in child.parameters())
            if has_params and not isinstance(child, fsdp.FSDPModule):
                fsdp.fully_shard(child, mesh=dp_mesh, mp_policy=policy)
        if not isinstance(model, fsdp.FSDPModule):
            fsdp.fully_shard(model, mesh=dp_mesh, mp_policy=policy)
    except (RuntimeError, NotImplementedError, AssertionError) as exc:
        raise UsageError(
            f"strategy='fsdp' is not supported here ({type(exc).__name__}: {exc}); "
            "use strategy='ddp'"
        ) from None
    return materialize.materialize(model) if meta else model


def _register_compression(ddp: DistributedDataParallel, how: str, rank: int, warmup: int) -> None:
    if how == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        state = ps.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=rank,
            start_powerSGD_iter=max(2, warmup),  # torch's minimum with error feedback
        )
        ddp.register_comm_hook(state, ps.powerSGD_hook)
    else:
        ddp.register_comm_hook(torch.float16 if how == "fp16" else torch.bfloat16, _compress_hook)


def _compressor(how: str):
    dtype = torch.float16 if how == "fp16" else torch.bfloat16
    return lambda state, bucket: _compress_hook(dtype, bucket)


def _compress_hook(dtype, bucket):  # no return annotation: DDP checks it, and ours is a string
    """All-reduce a gradient bucket as ``dtype``, averaged, then copied back in place.

    torch's own bf16 hook refuses gloo; gloo (and NCCL >= 2.10) reduce bfloat16 fine.
    """
    buffer = bucket.buffer()
    compressed = buffer.to(dtype).div_(dist.get_world_size())

    def decompress(fut):
        return buffer.copy_(fut.value()[0])

    return dist.all_reduce(compressed, async_op=True).get_future().then(decompress)
