"""``%nbdist run FILE``: what is not a regular file, or is too large, is refused in one line,
and nothing blocks (a FIFO with no writer) or reads forever (``/dev/zero``)."""

from __future__ import annotations

import os
import threading

import pytest

from nbdist.errors import UsageError
from nbdist.notebook.run import programs


def _refused(path) -> str:
    """``programs.load(path)``'s one line, from a thread that must end within seconds."""
    got: list[BaseException | object] = []
    t = threading.Thread(target=lambda: got.append(_load(path)), daemon=True)
    t.start()
    t.join(10)
    if t.is_alive() and os.path.exists(path):  # blocked: release it, then fail
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    assert not t.is_alive(), f"loading {path} blocked"
    (err,) = got
    assert isinstance(err, UsageError), err
    assert "\n" not in str(err)
    return str(err)


def _load(path) -> BaseException | object:
    try:
        return programs.load(path)
    except BaseException as e:
        return e


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    assert _refused(fifo) == (
        f"%nbdist run: {str(fifo)!r} is a FIFO (a named pipe), not a file: name a .py script"
    )


def test_a_device_is_refused_without_reading_it():
    assert _refused("/dev/zero") == (
        "%nbdist run: '/dev/zero' is a character device, not a file: name a .py script"
    )


def test_a_script_over_the_limit_is_refused_in_one_line(tmp_path):
    big = tmp_path / "big.py"
    with open(big, "wb") as f:
        f.truncate(programs.MAX_SCRIPT_BYTES + 1_000_000)  # sparse: nothing written
    assert _refused(big) == (
        f"%nbdist run: {str(big)!r} is 11.0 MB, over the 10 MB a script may be (it is sent "
        "whole to every rank): keep data in files the script reads"
    )


def test_a_script_within_the_limit_reads_as_python_reads_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_bytes(b"# -*- coding: latin-1 -*-\r\nname = '\xe9'\r\nprint(name)\r\n")
    program = programs.load("train.py", ["--lr", "0.1"])
    assert program.source == "# -*- coding: latin-1 -*-\nname = '\u00e9'\nprint(name)\n"
    assert program.argv == ("train.py", "--lr", "0.1") and program.script
    (tmp_path / "nul.py").write_bytes(b"x = 1\n\0")
    with pytest.raises(UsageError, match="is not a Python script"):
        programs.load("nul.py")
