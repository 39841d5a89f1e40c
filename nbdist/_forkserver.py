"""A process that loads ipyparallel's engine and torch once, then forks engines from itself.

Why: importing torch costs about 2 s of CPU per process. Engines forked from one warm process
share that cost, so a 2-engine cluster is ready (process group included) in about half the time
of engines started one by one, and a dead engine is replaced in a fraction of a second. Forking
is safe here because nothing has touched CUDA or started a thread when the fork happens.

Protocol, lines on stdin/stdout: ``spawn`` → ``pid PID``; ``exit`` → the server leaves. When an
engine ends, the server says ``exit PID STATUS`` at once (STATUS as ``os.waitstatus_to_exitcode``:
negative for a signal), which is how the notebook learns of a dead engine within milliseconds.
Runs as ``python -m nbdist._forkserver PROFILE_DIR CLUSTER_ID LOG_DIR``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

_write_lock = threading.Lock()


def _say(line: str) -> None:
    with _write_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _reap(has_children: threading.Event) -> None:
    """Collect every engine that ends and report it (no zombies, no silent deaths)."""
    while True:
        has_children.wait()
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            has_children.clear()
            continue
        _say(f"exit {pid} {os.waitstatus_to_exitcode(status)}")


def _preload() -> None:
    import ipyparallel.engine.app  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    import nbdist._lifeline  # noqa: F401
    import nbdist.worker.runner  # noqa: F401
    import nbdist.worker.setup  # noqa: F401


def _engine(profile_dir: str, cluster_id: str, log_dir: str) -> None:
    """The child: become an ipyparallel engine in a session of its own. Never returns."""
    code = 1
    try:
        os.setsid()  # a notebook interrupt to our group must not reach the engines
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log = os.open(
            os.path.join(log_dir, f"engine-{os.getpid()}.log"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o600,
        )
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        from ipyparallel.engine.app import IPEngine

        IPEngine.launch_instance(
            [
                f"--profile-dir={profile_dir}",
                f"--cluster-id={cluster_id}",
                "--log-level=WARN",
                # The fork server reports deaths itself, at once: no nanny process to start.
                "--IPEngine.enable_nanny=False",
                "--HistoryManager.enabled=False",
            ]
        )
        code = 0
    finally:
        os._exit(code)


def main() -> None:
    profile_dir, cluster_id, log_dir = sys.argv[1:4]
    import nbdist._lifeline as lifeline

    _preload()
    lifeline.exit_with_parent()
    has_children = threading.Event()
    threading.Thread(target=_reap, args=(has_children,), name="reaper", daemon=True).start()
    _say("ready")
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "spawn":
            with _write_lock:  # no thread may hold this lock in the child
                pid = os.fork()
            if pid == 0:
                _engine(profile_dir, cluster_id, log_dir)
            has_children.set()
            _say(f"pid {pid}")
        elif cmd == "exit":
            break


if __name__ == "__main__":
    main()
