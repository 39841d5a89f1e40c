"""Where this rank's threads are, even while its code is stuck in C (a collective, a kernel call).

``install()`` (at the engine's setup) registers ``faulthandler`` for ``STACKS_SIGNAL``: on that
signal the interpreter itself writes every thread's Python stack into a pipe, from the signal
handler, whatever the main thread is doing (it needs no lock and no bytecode to run). A daemon
thread (``nbdist-stacks``) reads the pipe, turns the text into ``RankStacks`` and sends it to the
notebook tied to the running cell (``reporting.sender.publish``), where the supervisor reads it
before it stops the rank. Between cells, ``current()`` answers the same from
``sys._current_frames()``.

When the main thread holds the interpreter's lock in C code, the reading thread cannot run: the
notebook then reads the process from outside (``py-spy``, where installed) or says so.
"""

from __future__ import annotations

import faulthandler
import itertools
import linecache
import os
import re
import select
import sys
import threading
import time

from ...frames import is_user
from ...protocol import STACKS_KEY, STACKS_SIGNAL, FrameRecord, RankStacks, ThreadStack
from .. import state
from ..reporting import sender

_QUIET = 0.1  # seconds without more text that end one dump
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
_seq = itertools.count(1)
_installed_in: int | None = (
    None  # the process that answers STACKS_SIGNAL (a fork must install anew)
)


def install() -> None:
    """Answer ``STACKS_SIGNAL`` with every thread's stack (once per engine process)."""
    global _installed_in
    if _installed_in == os.getpid():
        return
    read, write = os.pipe()
    faulthandler.register(STACKS_SIGNAL, file=os.fdopen(write, "w"), all_threads=True, chain=False)
    threading.Thread(target=_serve, args=(read,), name="nbdist-stacks", daemon=True).start()
    _installed_in = os.getpid()


def current() -> RankStacks:
    """Every thread's stack now but the main thread's (between cells it runs no cell: it is
    answering this very request), asked through the API."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    program = _program()
    threads = []
    for ident, frame in sys._current_frames().items():
        if ident == main:
            continue
        frames = []
        while frame is not None:
            code = frame.f_code
            frames.append(_frame(code.co_filename, frame.f_lineno, code.co_name, program))
            frame = frame.f_back
        threads.append(
            ThreadStack(names.get(ident, hex(ident)), tuple(reversed(frames)), ident == main)
        )
    return RankStacks(_rank(), tuple(threads), how="engine")


def parse(text: str, program: str = "") -> list[ThreadStack]:
    """faulthandler's dump as stacks, outermost frame first (it writes innermost first)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    threads: list[ThreadStack] = []
    ident, frames = None, []

    def close() -> None:
        if ident is not None:
            threads.append(
                ThreadStack(names.get(ident, hex(ident)), tuple(reversed(frames)), ident == main)
            )

    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            close()
            ident, frames = int(head.group(2), 16), []
            continue
        frame = _FRAME.match(line)
        if frame and ident is not None:
            file, number, function = frame.groups()
            frames.append(_frame(file, int(number), function, program))
    close()
    return threads


def _serve(read: int) -> None:
    """Read dumps from the pipe, one at a time, and send each to the notebook."""
    while True:
        chunks = [os.read(read, 65536)]
        while select.select([read], [], [], _QUIET)[0]:
            chunks.append(os.read(read, 65536))
        text = b"".join(chunks).decode("utf-8", "replace")
        try:
            stacks = RankStacks(
                _rank(),
                tuple(parse(text, _program())),
                collectives=state.engine.collective_calls,
                in_collective=state.engine.in_collective,
            )
            sender.publish({f"{STACKS_KEY}{os.getpid()}:{next(_seq)}": stacks})
        except Exception:  # never let a dump kill the thread: the next one is read
            time.sleep(_QUIET)


def _frame(file: str, line: int, function: str, program: str) -> FrameRecord:
    """A frame, its source line read here (the cells' sources are in this engine's linecache)."""
    user = is_user(file, program)
    source = linecache.getline(file, line).strip() if user else ""
    return FrameRecord(file, line, function, source=source, user=user)


def _rank() -> int:
    info = state.engine.rank_info
    return info.rank if info is not None else -1


def _program() -> str:
    """The running cell's (or script's) file name: its frames are the person's."""
    return state.engine.program_file or ""
