"""A post-mortem on the rank that failed: pdb in the notebook, evaluated on that rank's engine.

``%nbdist debug [--rank R]`` opens a pdb session on the frames a failed cell left on its rank
(kept there until that rank's next cell: ``worker.debug.postmortem``), at the line that raised,
in the person's code. The prompt is the notebook's input box, as ``%debug``'s; each command
travels to the engine and runs there, in the frame, and what it printed comes back. ``q`` ends
it; the engine and its variables stay as they were. ``nbdist.post_mortem(rank=None)`` returns the
same frames as data (file, line, function, source line, each local's repr).

The rank, by default, is the one whose failure caused the others' (the first to fail by itself).
When there is nothing to look at, one line says why: no cell failed, the rank asked for did
not fail, or its engine died or was replaced since.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

from ...errors import RankFailure, UsageError, cause
from ...protocol import PostMortem
from ...worker import api
from ..cluster import fanout

_TIMEOUT = 120.0  # seconds one command may run on the engine (an expression the person typed)


def pick(cluster: Any, rank: int | None) -> tuple[int, RankFailure]:
    """The rank to look at and its failure, or a UsageError line saying why there is none."""
    failed: dict[int, tuple[RankFailure, int]] = cluster.failed
    n = len(cluster.slots)
    if rank is not None and not (isinstance(rank, int) and 0 <= rank < n):
        raise UsageError(f"--rank {rank!r}: the cluster has ranks 0 to {n - 1}")
    if not failed:
        raise UsageError("nothing to debug: the last %%distributed cell did not fail")
    if rank is None:
        root = cause(f for f, _ in failed.values())
        rank = root.failure.rank if root else min(failed, key=lambda r: (failed[r][0].at, r))
    if rank not in failed:
        others = ", ".join(map(str, sorted(failed)))
        raise UsageError(
            f"rank {rank} did not fail in the last cell (rank {others} did): "
            f"%nbdist debug --rank {min(failed)}"
        )
    failure, pid = failed[rank]
    if failure.kind in ("died", "hung"):
        raise UsageError(
            f"rank {rank}'s engine was lost ({failure.summary}): its frames went with it"
        )
    if rank >= n or cluster.slots[rank].pid != pid:
        raise UsageError(f"rank {rank}'s engine was replaced since it failed: its frames are gone")
    return rank, failure


def post_mortem(cluster: Any, rank: int | None = None) -> PostMortem:
    """The failed rank's frames (``rank``: by default the one that failed first by itself)."""
    rank, _ = pick(cluster, rank)
    got = _answer(
        rank, fanout.on_ranks(cluster, api.post_mortem, rank, ranks=[rank], timeout=_TIMEOUT)
    )
    if got is None:
        raise UsageError(f"rank {rank} keeps no failed cell: a cell ran there since")
    return got


def debug(
    cluster: Any,
    rank: int | None = None,
    ask: Callable[[str], str] | None = None,
    say: Callable[[str], None] = print,
) -> None:
    """pdb on the failed rank, one command at a time: ``ask`` reads a command (by default the
    notebook's input box, ``input`` as the kernel has it while a cell runs), ``say`` shows what
    it printed, until ``q``."""
    ask = ask or (lambda prompt: builtins.input(prompt))
    rank, failure = pick(cluster, rank)
    say(
        f"nbdist: post-mortem of rank {rank} ({failure.summary}); commands run on its engine, "
        "in the frame: p EXPR, l, u, d, w, a; q leaves"
    )
    reply = _answer(rank, fanout.on_ranks(cluster, api.debug, None, ranks=[rank], timeout=_TIMEOUT))
    while True:
        if reply.output:
            say(reply.output.rstrip("\n"))
        if reply.done:
            return
        try:
            line = ask(f"(Pdb rank {rank}) ")
        except (EOFError, KeyboardInterrupt):
            line = "q"
        got = fanout.on_ranks(cluster, api.debug, line, ranks=[rank], timeout=_TIMEOUT)
        reply = _answer(rank, got)


def _answer(rank: int, got: fanout.Results) -> Any:
    """The engine's answer, or one line saying why there is none."""
    got.check(f"the post-mortem of rank {rank}", UsageError)
    return got.values[rank]
