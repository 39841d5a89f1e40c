"""Where every rank is, folded: one compact block per group of ranks stopped in the same place.

When a cell is stopped (the interrupt button, ``--timeout``, the progress deadline), the
supervisor first asks each running rank where it is (``collect``): a signal makes its engine
write every thread's stack, even from C code, and send it tied to the cell
(``worker.debug.stacks``); a rank that cannot answer (its interpreter held in C code) is read
from outside with ``py-spy`` where it is installed and the engine runs on this machine.
``%nbdist stacks`` asks the same of every engine between cells.

``fold`` writes them as a person wants to read them: the person's lines (the cell's, a script's,
their modules') as they are, each run of nbdist's, ipyparallel's, torch's or Python's own
frames folded into one line (``… in torch.distributed barrier``), and ranks that stand in the
same place grouped (``ranks 0, 2:``).
"""

from __future__ import annotations

import linecache
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from typing import Any

from ...frames import cell_name, is_user, package
from ...protocol import STACKS_KEY, STACKS_SIGNAL, FrameRecord, Program, RankStacks, ThreadStack
from ...worker import api
from ..cluster import fanout

_WAIT = 1.5  # seconds the ranks get to send their stacks
_PYSPY_TIMEOUT = 10.0
_PYSPY_FRAME = re.compile(r"^\s+(.+?) \((.+?):(\d+)\)$")
_PYSPY_THREAD = re.compile(r'^Thread (\S+) \((\w+)\): "(.*)"$')
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def collect(
    engines: Any, ranks: Mapping[int, tuple[int, Any]], wait: float = _WAIT
) -> dict[int, RankStacks | str]:
    """Each rank's stacks now, or why there are none. ``ranks``: rank -> (its engine's pid, the
    running cell's reply (its metadata), where the engine sends them)."""
    for _, ar in ranks.values():  # anything sent before this request is not the answer
        _pop(ar)
    engines.signal([pid for pid, _ in ranks.values()], sig=STACKS_SIGNAL)
    got: dict[int, RankStacks | str] = {}
    deadline = time.monotonic() + wait
    while len(got) < len(ranks) and time.monotonic() < deadline:
        for r, (_, ar) in ranks.items():
            if r not in got and (stacks := _pop(ar)) is not None:
                got[r] = stacks
        time.sleep(0.02)
    for r, (pid, _) in ranks.items():
        if r not in got:
            got[r] = from_outside(engines, r, pid)
    return got


def between_cells(cluster: Any, timeout: float = 5.0) -> dict[int, RankStacks | str]:
    """Every rank's stacks, asked of its engine (``%nbdist stacks``); a busy engine is read
    from outside where it can be, and a lost one is said to be."""
    got = fanout.on_ranks(cluster, api.stacks, timeout=timeout)
    out: dict[int, RankStacks | str] = dict(got.values)
    for r, why in got.failures.items():  # a lost engine: what happened to it, in one line
        out[r] = why if r in got.lost else from_outside(cluster.engines, r, cluster.slots[r].pid)
    return out


def from_outside(engines: Any, rank: int, pid: int) -> RankStacks | str:
    """``py-spy dump`` of an engine on this machine, or why it cannot be read. Read without
    pausing the engine (``--nonblocking``): a paused engine's heart does not answer either, and
    the controller gives up an engine silent for its heartbeat's few beats."""
    local = bool(getattr(engines, "engine_pids", None))  # engines on this machine
    spy = shutil.which("py-spy")
    if not local or spy is None:
        where = "install py-spy to read it from outside" if local else "it runs on another host"
        return f"no answer: its interpreter is busy in C code ({where})"
    try:
        text = subprocess.run(
            [spy, "dump", "--nonblocking", "--full-filenames", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=_PYSPY_TIMEOUT,
            env={**os.environ, "NO_COLOR": "1", "CLICOLOR": "0", "CLICOLOR_FORCE": "0"},
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"no answer, and py-spy could not read it ({type(e).__name__})"
    threads = _parse_pyspy(_ANSI.sub("", text))  # colours, where the kernel's TERM asks for them
    return RankStacks(rank, threads, how="py-spy") if threads else "no answer, nor from py-spy"


def fold(stacks: Mapping[int, RankStacks | str], program: Program | None = None) -> str:
    """The ranks' stacks as a person reads them: one block per group of ranks in one place."""
    groups: dict[str, list[int]] = {}
    for rank, got in sorted(stacks.items()):
        groups.setdefault(_block(got, program), []).append(rank)
    return "\n".join(f"{fanout.targets_text(ranks)}:\n{block}" for block, ranks in groups.items())


def _block(got: RankStacks | str, program: Program | None) -> str:
    if isinstance(got, str):
        return f"  {got}"
    main = [t for t in got.threads if t.main]
    others = [t for t in got.threads if not t.main and any(f.user for f in t.frames)]
    lines = []
    for thread in main + others:
        if not thread.main:
            lines.append(f"  thread {thread.name}:")
        lines += _lines(thread, program)
    if got.how == "py-spy":
        lines.append("  (read by py-spy: the engine was busy in C code)")
    if not lines and got.how == "engine":
        return "  idle: no cell running, no thread of the person's code"
    return "\n".join(lines) or "  (no Python frames)"


def _lines(thread: ThreadStack, program: Program | None) -> list[str]:
    """A thread's frames from the person's first: theirs as they are, each run of others
    (nbdist's, a library's, Python's) as one line naming where it ends."""
    frames = list(thread.frames)
    first = next((i for i, f in enumerate(frames) if f.user), None)
    if first is not None:
        frames = frames[first:]  # what runs the person's code (engine, nbdist) is not theirs
    out: list[str] = []
    run: list[FrameRecord] = []
    for f in [*frames, None]:
        if f is not None and not f.user:
            run.append(f)
            continue
        if run:
            out.append(f"    … in {package(run[-1].file)} {run[-1].function}")
            run = []
        if f is not None:
            source = f.source or _source(f, program)
            out.append(f"    {_where(f, program)}, line {f.line}, in {f.function}: {source}")
    return [line.rstrip(": ") for line in out]


def _where(f: FrameRecord, program: Program | None) -> str:
    if program is not None and f.file == program.filename and not program.script:
        return "the cell"
    return cell_name(f.file) or os.path.basename(f.file)


def _source(f: FrameRecord, program: Program | None) -> str:
    if program is not None and f.file == program.filename:
        lines = program.source.splitlines()
        return lines[f.line - 1].strip() if 0 < f.line <= len(lines) else ""
    return linecache.getline(f.file, f.line).strip()


def _pop(ar: Any) -> RankStacks | None:
    data = ar.metadata.get("data") or {}
    found = None
    for k in [k for k in list(data) if k.startswith(STACKS_KEY)]:
        found = data.pop(k, None)
    return found if isinstance(found, RankStacks) else None


def _parse_pyspy(text: str) -> tuple[ThreadStack, ...]:
    """``py-spy dump``'s text (innermost frame first) as stacks, outermost first."""
    threads, name, frames = [], None, []
    for line in text.splitlines() + ['Thread end (x): ""']:
        head = _PYSPY_THREAD.match(line)
        if head:
            if name is not None:
                threads.append(ThreadStack(name, tuple(reversed(frames)), name == "MainThread"))
            name, frames = head.group(3), []
            continue
        frame = _PYSPY_FRAME.match(line)
        if frame and name is not None:
            function, file, number = frame.groups()
            frames.append(FrameRecord(file, int(number), function, user=is_user(file)))
    return tuple(threads)
