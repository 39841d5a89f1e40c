"""What a sharded checkpoint holds of each keyword, and how it is put back.

One ``torch.distributed.checkpoint`` state dict per rank (``saved``), of which each rank writes
only what it holds:

- a model (plain, DDP, FSDP2, tensor parallel): ``get_model_state_dict``, its DTensors as this
  rank's shards, under ``state.<keyword>``;
- an optimizer: ``get_optimizer_state_dict`` with the model among the keywords whose
  parameters it holds (``_model_of``);
- a pipeline stage's model or optimizer (``pipeline.holds_stage``): only this rank's stage's
  tensors, under ``stage.<stage>.<keyword>``, so the replicas of a stage write one copy and a
  rank restores its own stage;
- anything else (a scheduler's state, dicts, numbers): rank 0's, whole, as one item.

Loading builds the same dict from the objects as they are now (``targets``: their own, possibly
other, sharding), which ``dcp.load`` fills, and ``put_back`` hands it to them.
"""

from __future__ import annotations

import sys
from typing import Any

from ...errors import UsageError
from ..pipeline import stages as pipeline
from ..state import engine
from . import contents

MODEL, OPTIMIZER, VALUE = "model", "optimizer", "value"


def _inner(obj: Any) -> Any:
    """The module a pipeline, DDP or plain module trains."""
    if isinstance(obj, pipeline.Pipeline):
        return obj.stage
    return getattr(obj, "module", obj) if type(obj).__name__ == "DistributedDataParallel" else obj


def _dtensor() -> Any:
    """torch's DTensor class, or None while nothing has imported it (so nothing holds one)."""
    return getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)


def is_sharded(state: dict) -> bool:
    """Whether ``state`` holds a model sharded over ranks (DTensor weights) or a pipeline's
    stage: the same answer on every rank."""
    DTensor = _dtensor()
    for v in state.values():
        if pipeline.holds_stage(v):
            return True
        inner = _inner(v)
        if DTensor is not None and callable(getattr(inner, "named_modules", None)):
            if any(isinstance(p, DTensor) for p in inner.parameters()):
                return True
    return False


def _is_module(obj: Any) -> bool:
    return callable(getattr(_inner(obj), "named_parameters", None))


def _is_optimizer(obj: Any) -> bool:
    return hasattr(obj, "param_groups") and hasattr(obj, "state_dict")


def kinds(state: dict) -> dict[str, str]:
    """Each keyword's kind: a model, an optimizer, or a value saved whole; "stage-" before a
    pipeline stage's model or optimizer."""
    out = {}
    for k, v in state.items():
        kind = MODEL if _is_module(v) else OPTIMIZER if _is_optimizer(v) else VALUE
        out[k] = f"stage-{kind}" if kind != VALUE and pipeline.holds_stage(v) else kind
    return out


def _ptr(t: Any) -> int:
    return (t.to_local() if hasattr(t, "to_local") else t).data_ptr()


def _model_of(key: str, opt: Any, state: dict) -> Any:
    """The model among ``state``'s keywords whose parameters ``opt`` holds."""
    mine = {_ptr(p) for g in opt.param_groups for p in g["params"]} - {0}
    for v in state.values():
        if _is_module(v):
            if mine & {_ptr(p) for p in _inner(v).parameters()}:
                return v
    raise UsageError(
        f"nbdist.checkpoint: the optimizer {key!r} holds none of the parameters of the models "
        f"passed ({', '.join(k for k, v in state.items() if _is_module(v)) or 'none'}): pass "
        "the model it trains too, e.g. model=model, opt=opt"
    )


def _stage_part(obj: Any) -> Any:
    """The pipeline stage module on this rank whose tensors ``obj`` holds or trains."""
    if _is_module(obj):
        held = {_ptr(t) for t in _inner(obj).state_dict(keep_vars=True).values()}
    else:
        held = {_ptr(p) for g in obj.param_groups for p in g["params"]}
    for part in list(engine.pipeline_parts):
        if held & {_ptr(t) for t in part.state_dict(keep_vars=True).values()}:
            return part
    raise UsageError("nbdist.checkpoint: no pipeline stage on this rank holds its tensors")


def _form(k: str, obj: Any, kind: str, state: dict) -> Any:
    """What keyword ``k`` (a model or an optimizer) is saved as, and loaded into."""
    from torch.distributed.checkpoint import state_dict as dsd

    if kind == "stage-model":
        mine = {_ptr(t) for part in engine.pipeline_parts for t in part.state_dict().values()}
        held = _inner(obj).state_dict(keep_vars=True)
        return {n: t.detach() for n, t in held.items() if _ptr(t) in mine}
    if kind == "stage-optimizer":
        return dsd.get_optimizer_state_dict(_stage_part(obj), obj)
    model = obj if kind == MODEL else _model_of(k, obj, state)
    if kind == MODEL:
        return dsd.get_model_state_dict(model)
    return dsd.get_optimizer_state_dict(model, obj)


def _value(k: str, obj: Any) -> Any:
    value = obj.state_dict() if hasattr(obj, "state_dict") else obj
    contents.check_safe(k, value)
    return value


def check(state: dict) -> None:
    """Refuse now (at ``restore``, before training) what saving ``state`` would refuse."""
    for k, kind in kinds(state).items():
        if kind == VALUE:
            _value(k, state[k])
        elif kind == OPTIMIZER:
            _model_of(k, state[k], state)


def saved(state: dict, kind_of: dict, stage: int | None, first: bool) -> dict:
    """This rank's part of the checkpoint of ``state`` (``first``: rank 0, which saves the
    values)."""
    out: dict[str, dict] = {"state": {}, "stage": {}}
    for k, obj in state.items():
        kind = kind_of[k]
        if kind == VALUE:
            value = _value(k, obj)  # refused on every rank alike
            if first:  # one item, whole (a tuple is not taken apart): restored as it was
                out["state"][k] = (value,)
        elif kind.startswith("stage-"):
            out["stage"].setdefault(str(stage), {})[k] = _form(k, obj, kind, state)
        else:
            out["state"][k] = _form(k, obj, kind, state)
    return out


def targets(state: dict, kind_of: dict, stages: list, stage: int | None) -> dict:
    """What ``dcp.load`` fills for ``state`` from a checkpoint of ``kind_of`` whose ranks held
    ``stages``; this rank holds ``stage``."""
    now = kinds(state)
    for k in state:
        if now[k].startswith("stage-") != kind_of[k].startswith("stage-"):
            held = "per pipeline stage" if kind_of[k].startswith("stage-") else "whole"
            raise UsageError(
                f"nbdist.restore: the checkpoint holds {k!r} {held}, and it is not so now: build "
                "the model and its pipeline as the checkpointed run did"
            )
    if any(k.startswith("stage-") for k in now.values()) and stage not in stages:
        raise UsageError(
            f"nbdist.restore: the checkpoint holds stages {sorted(set(stages) - {None})}, not "
            f"stage {stage}: split the model as the checkpointed run did"
        )
    out: dict[str, dict] = {"state": {}, "stage": {}}
    for k, obj in state.items():
        if kind_of[k] == VALUE:
            out["state"][k] = None  # the saved item takes its place
        elif kind_of[k].startswith("stage-"):
            out["stage"].setdefault(str(stage), {})[k] = _form(k, obj, now[k], state)
        else:
            out["state"][k] = _form(k, obj, now[k], state)
    return out


def put_back(state: dict, kind_of: dict, loaded: dict, stage: int | None) -> dict:
    """Hand each object in ``state`` what ``dcp.load`` filled in ``loaded``; the plain values
    (saved objects without ``load_state_dict``), for ``nbdist.restored()``."""
    from torch.distributed.checkpoint import state_dict as dsd

    values = {}
    for k, obj in state.items():
        kind = kind_of[k]
        if kind == VALUE:
            value = loaded["state"][k][0]
            if hasattr(obj, "load_state_dict"):
                obj.load_state_dict(value)
            else:
                if isinstance(obj, dict):  # plain dicts are refilled in place
                    obj.clear()
                    obj.update(value)
                values[k] = value
        elif kind == "stage-optimizer":
            part = _stage_part(obj)
            dsd.set_optimizer_state_dict(part, obj, loaded["stage"][str(stage)][k])
        elif kind in (MODEL, OPTIMIZER):
            _put(k, obj, kind, loaded["state"][k], state)
    return values  # a stage's model was loaded in place: its tensors are the stage's own


def _put(k: str, obj: Any, kind: str, sd: dict, state: dict) -> None:
    from torch.distributed.checkpoint import state_dict as dsd

    if kind == MODEL:
        dsd.set_model_state_dict(obj, sd)
    else:
        dsd.set_optimizer_state_dict(_model_of(k, obj, state), obj, sd)
