"""The interrupt button, held while the kernel's bookkeeping of a run is half done.

The kernel's SIGINT raises ``KeyboardInterrupt`` between any two bytecodes of the main thread.
Landing inside the watch's fold (a metric's first record: its curve made, its running sums not
yet), it left the run's series half-built; the cell then ended with that ``KeyError`` in place of
"interrupted", and the run store and board missed the run's end. ``held()`` wraps such a
section: a press inside it is kept and raised as the section ends, so the controller handles the
same interrupt at a point where every structure is whole. Off the main thread (where no signal
lands), and inside a section already held, it does nothing.
"""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_depth = 0  # sections held on the main thread, one inside another


@contextmanager
def held() -> Iterator[None]:
    """Hold SIGINT for the block; raise ``KeyboardInterrupt`` after it if one came (unless the
    block raised: its own exception goes on)."""
    global _depth
    if _depth or threading.current_thread() is not threading.main_thread():
        yield  # the outermost section raises it
        return
    pressed: list[int] = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        signal.signal(signal.SIGINT, before)
    if pressed:
        raise KeyboardInterrupt


def holding(method: F) -> F:
    """``method`` runs under ``held()``, its own nested calls too."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with held():
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
