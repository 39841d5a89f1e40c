"""The console as code on an engine writes to it: what reaches the notebook is what it printed.

Two things stand between a rank's prints and the notebook:

- ``tqdm.auto`` (Hugging Face's bars, most training loops') draws a widget wherever it finds a
  Jupyter kernel, which an engine is, and no front end shows a widget made on an engine: the bar
  stayed at ``0%``. On engines it draws its console bar (``\\r`` redraws, which the notebook shows
  in place: ``notebook.run.output``).
- Output travels in chunks, so write boundaries are lost: ``print("\\rbatch 10", end="")`` then
  ``print("WARNING: ...")`` would arrive as one line, ``batch 10WARNING: ...``. A write after a
  line that was redrawn with ``\\r``, and that neither redraws it nor ends it, starts a new line.

``install()`` does both, once per engine (``api.setup``); nothing is imported or changed until
the code writes or imports tqdm. It also counts what code sends to the notebook (writes to the
console, displays): ``sent()`` before and after a cell says whether the cell printed anything,
so the kernel knows whether output of it can still trail its reply.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

_sent = 0  # writes to the console and displays on this engine, so far


def sent() -> int | None:
    """How many writes to the console and displays code on this engine has made so far; None
    when they are not counted (``install`` not run, or a stream replaced since)."""
    counted = all(
        isinstance(getattr(s, "write", None), _LineKeeper) for s in (sys.stdout, sys.stderr)
    )
    return _sent if counted else None


def install() -> None:
    """Console bars for ``tqdm.auto``; a line of its own for what follows a redrawn line; what
    is written or displayed counted (``sent``)."""
    if not any(isinstance(f, _ConsoleTqdm) for f in sys.meta_path):
        sys.meta_path.insert(0, _ConsoleTqdm())
    for stream in (sys.stdout, sys.stderr):
        if not isinstance(getattr(stream, "write", None), _LineKeeper):
            try:
                stream.write = _LineKeeper(stream.write)
            except (AttributeError, TypeError):  # a stream that takes no attributes: as it is
                pass
    from IPython import get_ipython

    pub = getattr(get_ipython(), "display_pub", None)
    for name in ("publish", "clear_output"):
        if pub is not None and not isinstance(getattr(pub, name, None), _Counted):
            setattr(pub, name, _Counted(getattr(pub, name)))


class _Counted:
    """A display publisher's method, counted in ``sent``."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        global _sent
        _sent += 1
        return self._fn(*args, **kwargs)


class _LineKeeper:
    """A stream's ``write`` that starts a new line when a write follows a redrawn (``\\r``) line
    without redrawing it (``\\r``) or ending it (``\\n``)."""

    def __init__(self, write: Any) -> None:
        self._write = write
        self._redrawn = False  # the current line holds a \r

    def __call__(self, text: str) -> Any:
        global _sent
        _sent += bool(text)
        if self._redrawn and text and not text.startswith(("\r", "\n")):
            text = "\n" + text
        if text:
            tail = text.rsplit("\n", 1)[-1]
            self._redrawn = "\r" in tail or (self._redrawn and "\n" not in text)
        return self._write(text)


class _ConsoleTqdm(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``tqdm.autonotebook`` (behind ``tqdm.auto``) as a console would: it picks its
    widget bar where ``ipykernel.zmqshell`` is imported, so that name is hidden while it loads.
    tqdm itself is not changed."""

    _NAME = "tqdm.autonotebook"

    def find_spec(
        self, name: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != self._NAME:
            return None
        sys.meta_path.remove(self)  # find the real module, once
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._real = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        hidden = sys.modules.pop("ipykernel.zmqshell", None)
        try:
            self._real.exec_module(module)
        finally:
            if hidden is not None:
                sys.modules["ipykernel.zmqshell"] = hidden
