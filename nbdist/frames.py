"""Whose code a frame is: the person's, or nbdist's, a library's, Python's own.

Tracebacks, stacks and post-mortems show the person's frames as they are and fold the others:
a frame is the person's when it is the cell or script that ran (``program``), a
``%%distributed`` cell, or a file outside nbdist's package and outside Python's library folders
(their own modules, next to the notebook).
Imports neither side: the engines decide it for what they send, the kernel for what it reads
from outside (``py-spy``).
"""

from __future__ import annotations

import os
import sysconfig

#: How ``%%distributed`` cells are named as code (``<distributed-cell-3>``): the person's.
CELL_PREFIX = "<distributed-cell-"
_NBDIST = os.path.dirname(os.path.abspath(__file__)) + os.sep
_LIBRARIES = tuple(
    {p + os.sep for p in (sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib"))}
)


def is_user(filename: str, program: str = "") -> bool:
    """Is ``filename`` the person's code: the cell or script ``program``, or a module of theirs?"""
    if filename == program or filename.startswith(CELL_PREFIX):
        return True
    if filename.startswith("<"):  # <string>, <frozen runpy>: code made by a library, not typed
        return False
    path = os.path.abspath(filename)
    return not (path.startswith(_NBDIST) or path.startswith(_LIBRARIES))


def package(filename: str) -> str:
    """The package a library's file belongs to: ``…/site-packages/torch/distributed/x.py`` ->
    ``torch.distributed``; nbdist's own -> ``nbdist.worker``; the standard library's -> its
    module (``threading``)."""
    path = os.path.abspath(filename)
    for root in sorted((*_LIBRARIES, os.path.dirname(_NBDIST.rstrip(os.sep)) + os.sep), key=len)[
        ::-1
    ]:
        if path.startswith(root):
            parts = path[len(root) :].split(os.sep)
            return ".".join(parts[:-1]) or os.path.splitext(parts[-1])[0]
    return os.path.splitext(os.path.basename(filename))[0]


def cell_name(filename: str) -> str | None:
    """``cell 3`` for a cell's code name (``<distributed-cell-3>``), else None."""
    if filename.startswith(CELL_PREFIX) and filename.endswith(">"):
        return "cell " + filename[len(CELL_PREFIX) : -1]
    return None
