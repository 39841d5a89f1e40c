"""What the boards and a rank's output meet in a test process, where no front end shows anything.

``FrontEnd`` stands for ``IPython.display.display`` (the ``no_front_end`` fixture puts it there):
it keeps what each call showed and hands every display the one ``Handle``, which keeps what each
update sent. ``Clock`` is a clock the test moves, so that what is due when does not depend on the
machine's load.
"""

from __future__ import annotations


class Handle:
    """A display's handle: ``updates``, what each update sent, in order."""

    def __init__(self) -> None:
        self.updates: list = []

    def update(self, data, **kwargs) -> None:
        self.updates.append(data)


class FrontEnd:
    """``IPython.display.display`` with no front end: ``shown``, each call's objects and keywords
    (``(data, kw)`` for one object), in order; every call returns ``handle``."""

    def __init__(self) -> None:
        self.shown: list[tuple] = []
        self.handle = Handle()

    def __call__(self, *objs, **kwargs) -> Handle:
        self.shown.append((*objs, kwargs))
        return self.handle


class Clock:
    """A clock the test moves by setting ``now``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
