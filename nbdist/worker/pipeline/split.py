"""How a model is cut into pipeline stages, and each stage's runtime for torch's schedules.

An ``nn.Sequential`` is cut between its top-level layers: stage ``i`` is an ``nn.Sequential`` of
its layers, under the model's own names, and no example input is needed. Any other module is
traced (``torch.distributed.pipelining.pipeline``, i.e. ``torch.export``) on one microbatch of
an example batch and cut before the submodules named in ``split`` (``"layers.2"``); its stages
hold the model's own parameter objects, under their own names, so an optimizer built over
``pipe.stage.parameters()`` and checkpoints of the model keep working. A traced graph has the
shapes of its example: batches must keep the example's shape. Each rank keeps only its own
stage: the other stages are let go of once it is built (freed when the caller drops the model).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from ...errors import UsageError


def _check_names(split: Sequence[str]) -> None:
    if isinstance(split, str) or not all(isinstance(s, str) for s in split):
        raise UsageError(f"split must be a list of layer names, such as split=['2'], not {split!r}")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Tracing without torch.export's notes: the graphs it prints, its log lines and
    deprecation warnings are about torch's internals, not the user's model."""
    log = logging.getLogger("torch")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


class SequentialCut:
    """An ``nn.Sequential`` cut before the top-level layers named in ``split``."""

    def __init__(self, model: Any, split: Sequence[str]) -> None:
        _check_names(split)
        names = [name for name, _ in model.named_children()]
        at = []
        for s in split:
            if s not in names:
                raise UsageError(
                    f"split name {s!r} is not a layer of the model: name one of its top-level "
                    f"layers {', '.join(names)}"
                )
            at.append(names.index(s))
        if at and at[0] == 0:
            raise UsageError(
                f"split {split[0]!r} is the first layer, which would leave stage 0 empty: "
                "name the layers where stages 1, 2, ... begin"
            )
        if at != sorted(set(at)):
            raise UsageError(
                f"split names {list(split)} must each appear once, in the model's layer order "
                f"({', '.join(names)})"
            )
        bounds = [0, *at, len(names)]
        children = list(model.named_children())
        self._groups = [
            OrderedDict(children[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)
        ]
        self.num_stages = len(self._groups)
        self._stage: Any = None

    def module(self, index: int, example: Any = None) -> Any:
        """Stage ``index`` as a module (the model's own layers; ``example`` is not needed). A
        rank asks for its own stage only: the other stages' layers are let go of here, so
        they are freed once the caller drops the model."""
        import torch.nn as nn

        if self._stage is None:
            self._stage = nn.Sequential(self._groups[index])
            self._groups = []
        return self._stage

    def runtime(self, module: Any, index: int, device: Any, group: Any) -> Any:
        """torch's stage object for a schedule, around ``module`` (already on ``device``)."""
        from torch.distributed.pipelining import PipelineStage

        return PipelineStage(module, index, self.num_stages, device, group=group)


class TracedCut:
    """Any other module, traced on a microbatch and cut before the submodules in ``split``."""

    def __init__(self, model: Any, split: Sequence[str], example: Any) -> None:
        _check_names(split)
        for s in split:
            try:
                model.get_submodule(s)
            except AttributeError:
                top = ", ".join(name for name, _ in model.named_children())
                raise UsageError(
                    f"split name {s!r} is not a submodule of the {type(model).__name__}: name "
                    f"submodules as model.named_modules() does (its top level: {top})"
                ) from None
        if len(set(split)) != len(split):
            raise UsageError(f"split names {list(split)} must each appear once")
        if example is None:
            raise UsageError(
                f"pipeline needs example= to cut a {type(model).__name__} (it is traced on one "
                "microbatch): pass a batch of inputs as pipe.step takes them, or write the "
                "model as an nn.Sequential"
            )
        self._model, self._split = model, list(split)
        self.num_stages = len(split) + 1
        self._pipe: Any = None
        self._shape: tuple | None = None
        self._stage: Any = None
        self._runtime: Any = None
        self._trace(example)

    def _trace(self, example: Any) -> None:
        import torch
        from torch.distributed.pipelining import SplitPoint, pipeline

        if not isinstance(example, torch.Tensor) or example.dim() == 0:
            raise UsageError(
                "example must be a tensor with a batch dimension (one microbatch of inputs), "
                f"not {type(example).__name__}"
            )
        spec = {name: SplitPoint.BEGINNING for name in self._split}
        try:
            with _quiet():
                self._pipe = pipeline(self._model, mb_args=(example,), split_spec=spec)
        except Exception as e:  # torch.export's reasons are long: their first sentence suffices
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            first = first.split(". ")[0].rstrip(".")[:160]
            raise UsageError(
                f"pipeline could not trace the {type(self._model).__name__} ({first}): make its "
                "forward traceable by torch.export, or write it as an nn.Sequential"
            ) from None
        if self._pipe.num_stages != self.num_stages:
            raise UsageError(
                f"split {self._split} cut the {type(self._model).__name__} into "
                f"{self._pipe.num_stages} stages, not {self.num_stages}: name submodules that "
                "run one after another in forward, in that order"
            )
        self._shape = (tuple(example.shape), example.dtype)

    def module(self, index: int, example: Any = None) -> Any:
        """Stage ``index``; ``example`` (a microbatch) must have the traced one's shape."""
        if example is not None and (tuple(example.shape), example.dtype) != self._shape:
            shape, dtype = self._shape
            raise UsageError(
                f"this pipeline was traced on microbatches of shape {list(shape)} ({dtype}), not "
                f"{list(example.shape)} ({example.dtype}): give pipe.step batches of the "
                "example's shape (drop_last=True), or build a pipeline for this shape"
            )
        if self._stage is None:
            self._stage = self._pipe.get_stage_module(index)
        return self._stage

    def runtime(self, module: Any, index: int, device: Any, group: Any) -> Any:
        """torch's stage object; built once, after which the whole traced model is let go of
        (only this rank's stage stays alive here)."""
        if self._runtime is None:
            self._runtime = self._pipe.build_stage(index, device, group)
            # the runtime's graph keeps the traced whole (every stage): cut the others out of it
            whole = self._pipe.split_gm
            for name, child in list(whole.named_children()):
                if child is not self._stage:
                    delattr(whole, name)
            self._pipe = self._model = None
        return self._runtime


def cut(model: Any, split: Sequence[str], example: Any, microbatches: int) -> Any:
    """The cut of ``model`` named by ``split`` (``example``: a batch, for a traced model)."""
    import torch
    import torch.nn as nn

    if isinstance(model, nn.Sequential):
        return SequentialCut(model, split)
    if not isinstance(model, nn.Module):
        raise UsageError(f"pipeline cuts a torch nn.Module, not a {type(model).__name__}")
    if isinstance(example, torch.Tensor) and example.dim() > 0:
        if example.shape[0] % microbatches:
            raise UsageError(
                f"an example batch of {example.shape[0]} rows does not split into "
                f"{microbatches} microbatches: pass a batch as pipe.step will take it"
            )
        example = example[: example.shape[0] // microbatches]
    return TracedCut(model, split, example)
