"""A fork request and its answer: a request that timed out is cancelled, and its late pid answers
nothing. A real fork server, made slow by a real ``warm`` (it imports torch._dynamo, seconds in
which it forks nothing)."""

from __future__ import annotations

import signal

import psutil
import pytest
from processes import assert_gone, wait_until

from nbdist.errors import NbdistError
from nbdist.notebook.cluster.engines import forks


def test_a_fork_that_timed_out_does_not_answer_the_next_request(tmp_path):
    (tmp_path / "profile" / "security").mkdir(parents=True)
    (tmp_path / "log").mkdir()
    server = forks.ForkServer(idle=120)
    engines: list[psutil.Process] = []
    try:
        server.claim(tmp_path / "profile", "nbdist-none", tmp_path / "log")
        wait_until(server.ready, 120, what="the fork server's imports")
        server.warm()  # the next request waits behind seconds of imports
        with pytest.raises(NbdistError, match="did not fork within 0.05 s"):
            server.spawn(timeout=0.05)
        pid = server.spawn(timeout=120)
        engines.append(psutil.Process(pid))

        def killed() -> list[int]:
            return [p for p, status in server.ended.items() if status == -signal.SIGKILL]

        # the engine forked for the request that timed out is killed, and is not the answer
        late = wait_until(killed, 60, what="the late engine to be killed")
        assert len(late) == 1 and late[0] != pid, (late, pid)
        assert server.ended.get(pid) != -signal.SIGKILL
        deaths = []
        while not server.exits.empty():
            deaths.append(server.exits.get_nowait().pid)
        assert late[0] not in deaths  # never an engine's death to the cluster
    finally:
        for engine in engines:
            try:
                engine.kill()
            except psutil.NoSuchProcess:
                pass
        server.close()
        server.wait(30)
    assert_gone([server.proc.pid, *engines])
