"""What ipyparallel's client keeps of a rank's streams is bounded, and the cell shows the same:
chunks go through the client's own handler (``Client._dispatch_iopub``) into its record, plain
(``Metadata``, as ipyparallel keeps it) or bounded (``Streams``, as nbdist's requests keep it),
and are read as the supervisor reads them (tests/integration/cells/test_output_cost.py runs a
tqdm bar on real engines)."""

from __future__ import annotations

import io
import random
import time
from types import SimpleNamespace

from ipyparallel.client.client import Client, Metadata

from nbdist.notebook.board.lines import last_lines
from nbdist.notebook.cluster import streams
from nbdist.notebook.cluster.streams import HELD_MOST, KEEP, PENDING, Streams
from nbdist.notebook.run import output
from nbdist.notebook.run.output import RankStreams
from nbdist.worker.console import _LineKeeper

_HANDLE = Client._dispatch_iopub.__wrapped__  # the client's handler, its message unpacked


def _client(md: dict) -> SimpleNamespace:
    """What the client's handler uses of its client, holding the one record ``md``."""
    return SimpleNamespace(session=SimpleNamespace(session="s"), metadata={"m": md}, _futures={})


def _deliver(client: SimpleNamespace, name: str, text: str) -> None:
    """One stream chunk from the engine, as the client's I/O thread handles it."""
    msg = {
        "parent_header": {"session": "s", "msg_id": "m"},
        "header": {"msg_type": "stream"},
        "content": {"name": name, "text": text},
        "metadata": {},
    }
    _HANDLE(client, msg)


def _bar(n: int, width: int = 40) -> list[str]:
    """A tqdm bar's writes: each redraw behind a ``\\r``, a newline when it closes."""
    out = []
    for i in range(n + 1):
        done = width * i // n
        out.append(f"\r{100 * i // n:3d}%|{'#' * done}{' ' * (width - done)}| {i}/{n}")
    return out + ["\n"]


def _transcripts() -> list[list[tuple[str, str]]]:
    """What ranks write, as (stream, text) writes: bars, lines between redraws (tqdm.write's
    clearing of the bar), trailing-\\r progress, \\r\\n endings, a print after a redraw."""
    bar = [("stderr", w) for w in _bar(30)]
    between = []
    for i, w in enumerate(_bar(20)):
        between.append(("stderr", w))
        if i % 4 == 3:
            between.append(("stderr", "\r" + " " * 50 + "\r" + f"log step {i}\n"))
    trailing = [("stdout", f"step {i}\r") for i in range(12)] + [("stdout", "done\n")]
    crlf = [("stdout", f"line {i}\r\n") for i in range(5)] + [("stdout", "x\r\ny\r\n")]
    after = [("stdout", f"\rbatch {i}") for i in range(11)] + [("stdout", "WARNING: diverged\n")]
    mixed = bar[:10] + [("stdout", "epoch 1\n")] + bar[10:] + after + [("stdout", "end")]
    return [bar, between, trailing, crlf, after, mixed]


def _chunks(writes: list[tuple[str, str]], rng: random.Random) -> list[tuple[str, str]]:
    """The writes as the engine sends them: through its console (a write after a redrawn
    line that neither redraws nor ends it starts a line: ``worker.console``), consecutive
    writes to a stream joined at random (what was written since its last flush; a write is
    never split, and a chunk may end between a ``\r`` and what it redraws)."""
    out: list[tuple[str, str]] = []
    consoles = {name: _LineKeeper(lambda text: text) for name in streams.STREAMS}
    for name, text in writes:
        text = consoles[name](text)
        if out and out[-1][0] == name and rng.random() < 0.5:
            out[-1] = (name, out[-1][1] + text)
        else:
            out.append((name, text))
    return out


def _shown(md: dict, chunks: list[tuple[str, str]], polls: set[int], monkeypatch) -> tuple:
    """What the cell shows of a rank whose chunks arrive in ``md``, read after each chunk whose
    index is in ``polls`` and at the end: its printed streams and each in-place line's final
    state."""
    displays: list[list[str]] = []

    def show(text):
        states = [text]
        displays.append(states)
        return SimpleNamespace(update=states.append)

    monkeypatch.setattr(output, "_display", show)
    printed = {"stdout": io.StringIO(), "stderr": io.StringIO()}
    reader, client = RankStreams("", printed), _client(md)
    for i, (name, text) in enumerate(chunks):
        _deliver(client, name, text)
        if i in polls:
            reader.read(md)
    reader.read(md, final=True)
    finals = [states[-1] for states in displays]
    return printed["stdout"].getvalue(), printed["stderr"].getvalue(), finals


def test_the_cell_and_the_board_show_the_same_whichever_record_holds_the_streams(monkeypatch):
    """Every line a rank printed shows, printed or in place, whichever record holds its
    streams and however often they are read; the board shows the same last lines. (Which
    lines show in place can differ: ipyparallel's record, whose regex runs over what arrived
    between two reads, loses the ``\r`` of a line redrawn in it; the bounded record keeps the
    first line of each chunk's.)"""
    rng = random.Random(46)
    for writes in _transcripts():
        for _ in range(20):
            chunks = _chunks(writes, rng)
            every = set(range(len(chunks)))
            some = {i for i in every if rng.random() < 0.3}
            plain, bounded = Metadata(), Streams()
            lines = _lines(_shown(plain, chunks, every, monkeypatch))
            assert _lines(_shown(bounded, chunks, every, monkeypatch)) == lines, chunks
            assert _lines(_shown(Streams(), chunks, some, monkeypatch)) == lines, chunks
            for name in streams.STREAMS:  # the board: each rank's last lines
                kept = bounded.get(name)
                assert last_lines(kept, 5, 500) == last_lines(plain[name], 5, 500), chunks


def _lines(shown: tuple) -> list[str]:
    """Every line shown, printed or in place, in no particular order."""
    stdout, stderr, finals = shown
    return sorted(stdout.splitlines() + stderr.splitlines() + finals)


def test_a_bars_stream_keeps_a_bounded_end_and_a_redraw_costs_the_same_after_20_mb():
    md = Streams()
    client = _client(md)
    log = "".join(f"log line {i:06d} " + "y" * 183 + "\n" for i in range(100))  # 20 kB

    def redraws(n: int) -> float:
        """The least time the client's handler took over a redraw of the bar."""
        best = float("inf")
        for i in range(n):
            t0 = time.perf_counter()
            _deliver(client, "stderr", f"\r{i % 100:3d}%|{'#' * 40}| {i}/1000")
            best = min(best, time.perf_counter() - t0)
        return best

    first = redraws(50)
    taken = 0
    for i in range(1000):  # 20 MB of log lines on the bar's stream, read as they come
        _deliver(client, "stderr", log)
        if i % 10 == 0:
            taken += len(md.take("stderr"))
        assert md.held() <= 2 * KEEP + PENDING
    taken += len(md.take("stderr"))
    assert taken >= 1000 * len(log) == 20_000_000  # none of it lost
    assert len(md.get("stderr")) <= 2 * KEEP
    last = redraws(50)
    assert last < 5 * first + 0.001, (first, last)
    # ipyparallel's own record, for scale: a redraw there runs its regex over all it holds
    plain = Metadata()
    plain["stderr"] = log * 100  # 2 MB
    t0 = time.perf_counter()
    _deliver(_client(plain), "stderr", "\r 50%|####| 500/1000")
    assert time.perf_counter() - t0 > 10 * last


def test_a_reader_that_falls_behind_loses_the_oldest_and_is_told():
    md = Streams()
    client = _client(md)
    line = "z" * 999 + "\n"
    for i in range(2 * PENDING // len(line)):
        _deliver(client, "stdout", f"{i:09d}" + line[9:])
    assert md.held() <= 2 * KEEP + PENDING
    text = md.take("stdout")
    note, rest = text.lstrip("\n").split("\n", 1)
    lost = int(note.split("(")[1].split(" ")[0].replace(",", ""))
    assert note.endswith("the notebook fell behind) …")
    assert lost + len(rest) == 2 * PENDING // len(line) * len(line)  # every character told
    assert rest.endswith(f"{2 * PENDING // len(line) - 1:09d}" + line[9:])  # the newest kept
    assert md.take("stdout") == ""


def test_one_write_of_megabytes_keeps_its_start_and_end_and_tells_the_rest():
    """A rank that writes 5 MB at once arrives as one chunk: the record keeps its first and last
    ``PENDING / 2`` characters until taken, not all of it (CI's loaded kernel read it late)."""
    md = Streams()
    client = _client(md)
    line = "log " + "y" * 195 + "\n"
    _deliver(client, "stderr", "first\n" + line * 25_000)
    assert md.held() <= HELD_MOST
    text = md.take("stderr")
    assert text.startswith("first\n" + line)
    start = text.index("nbdist: … (")
    note = text[start : text.index("\n", start)]
    left = int(note.split("(")[1].split(" ")[0].replace(",", ""))
    assert left + len(text) - len(note) - 2 == len("first\n" + line * 25_000)
    assert text.endswith(line) and len(text) <= PENDING
