"""What ipyparallel's client keeps of a rank's printed output, bounded, and read chunk by chunk.

ipyparallel's client keeps every stream of a request whole in its record of it
(``metadata['stdout']``, ``['stderr']``): on each chunk its I/O thread copies the whole text to
append the chunk, and on each chunk holding a ``\\r`` (a tqdm bar's every redraw) runs its
carriage-return regex over all of it. The cost of a chunk grows with what the rank has printed
on that stream: a rank that put 5 MB of log lines on its bar's stream made the next 4 s of bar
cost the kernel 35 s of CPU, its output read 40 s late.

``bounded(client)`` is the hook ``fanout`` hands each request it sends: before the request
leaves, its record becomes a ``Streams``. The client's handler reads ``md[name]``, adds the
chunk and writes it back; from a ``Streams`` it reads a marker, so it handles (and runs its regex
over) the chunk alone, and the write hands the chunk over. A chunk costs what its own size
does, however long the cell has run, and the kernel keeps, per stream:

- the chunks not taken yet (``take``: what the supervisor reads as it shows a rank's output),
  at most ``PENDING`` characters: a reader that fell further behind (a kernel busy elsewhere)
  loses the oldest, said in a line of their own, and a single chunk over that (a rank writing
  megabytes at once) loses its middle, said where it was;
- the stream's last ``KEEP`` to ``2 * KEEP`` characters as the client would have kept them
  (``md.get(name)``, which the board reads for a rank's last lines).

So a request's record holds at most ``HELD_MOST`` characters of its streams, however much the
rank prints and however late the supervisor reads.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ipyparallel.client.client import Metadata

KEEP = 100_000  # characters of a stream's end kept in the record (the board's last lines)
#: characters of a stream arrived and not taken yet, at most: over twice what a cell shows of
#: a rank's lines as they come (``run.output.SHOWN_LIMIT``), so one write of megabytes keeps
#: all of its start that is shown, and its end (the last lines)
PENDING = 2_200_000
STREAMS = ("stdout", "stderr")
HELD_MOST = len(STREAMS) * (2 * KEEP + PENDING)  # characters one record holds, at most
#: What the client's handler reads of a stream: the chunk it appends comes back behind it,
#: unless its regex ate it with the chunk's first line (that line was redrawn with ``\\r``).
_MARK = "\ue001\ue002"


def bounded(client: Any) -> Callable[[Any], None]:
    """The ``message_future_hook`` for ``client.send_apply_request``: the request's record, in
    the client and on its future, a ``Streams`` before the request is sent (so no chunk can
    arrive before it)."""

    def hook(future: Any) -> None:
        output = getattr(future, "output", None)
        if output is None:  # a request without output (not an apply): nothing to bound
            return
        md = Streams(output.metadata)
        client.metadata[future.msg_id] = output.metadata = md

    return hook


class Streams(Metadata):
    """ipyparallel's record of one request (a ``Metadata``), its streams bounded: ``take(name)``
    gives what arrived on stream ``name`` since the last take; ``get(name)`` its end.
    ``md[name]`` is the client's handler's door, and reads a marker: read streams otherwise."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Metadata takes attributes for keys: these are the object's own
        object.__setattr__(self, "_pending", {name: _Pending() for name in STREAMS})

    def __getitem__(self, key: str) -> Any:
        if key in STREAMS:  # the client's handler, about to append a chunk
            return _MARK
        return super().__getitem__(key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in STREAMS or not isinstance(value, str):
            super().__setitem__(key, value)
            return
        if value.startswith(_MARK):
            chunk, redrawn = value[len(_MARK) :], False
        else:  # the regex took the chunk's first line up to its last redraw: a redraw
            chunk, redrawn = value, True
        if chunk:
            self._keep(key, chunk, redrawn)
            self._pending[key].put("\r" + chunk if redrawn else chunk)

    def _keep(self, key: str, chunk: str, redrawn: bool) -> None:
        """The stream's end as the client would keep it: a redrawn line shows its last state."""
        text = dict.get(self, key) or ""
        if redrawn:
            text = text[: text.rfind("\n") + 1]
        text += chunk
        if len(text) > 2 * KEEP:
            text = text[-KEEP:]
        dict.__setitem__(self, key, text)

    def take(self, name: str) -> str:
        """What arrived on stream ``name`` since the last take, in order; a line first saying
        how much was dropped if the taker fell over ``PENDING`` characters behind."""
        return self._pending[name].take()

    def held(self) -> int:
        """Characters kept of its streams: their ends, and what waits to be taken."""
        return sum(len(dict.get(self, n) or "") + self._pending[n].size for n in STREAMS)


class _Pending:
    """One stream's chunks not taken yet: put on the client's I/O thread, taken on the
    kernel's; at most ``PENDING`` characters, the oldest dropped."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.chunks: deque[str] = deque()
        self.size = 0
        self.lost = 0  # characters dropped untaken

    def put(self, chunk: str) -> None:
        with self.lock:
            if len(chunk) > PENDING:  # one write of megabytes: its start and its end
                half = (PENDING - 200) // 2
                note = f"nbdist: … ({len(chunk) - 2 * half:,} characters of this rank's output"
                note += " left out: the notebook fell behind) …"
                chunk = f"{chunk[:half]}\n{note}\n{chunk[-half:]}"
            self.chunks.append(chunk)
            self.size += len(chunk)
            while self.size > PENDING and len(self.chunks) > 1:
                gone = self.chunks.popleft()
                self.size -= len(gone)
                self.lost += len(gone)

    def take(self) -> str:
        with self.lock:
            chunks, lost = list(self.chunks), self.lost
            self.chunks.clear()
            self.size = self.lost = 0
        text = "".join(chunks)
        if lost:
            note = f"nbdist: … ({lost:,} characters of this rank's output left out: "
            text = f"\n{note}the notebook fell behind) …\n{text}"
        return text
