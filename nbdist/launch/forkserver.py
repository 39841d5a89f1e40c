"""A process that loads ipyparallel's engine and torch once, then forks engines from itself.

Why: importing torch costs about 2 s of CPU per process. Engines forked from one warm process
share that cost, so a 2-engine cluster is ready (process group included) in about half the time
of engines started one by one, and a dead engine is replaced in a fraction of a second. The
cluster's controller is forked from it too (ipyparallel's imports are 1.2-1.5 s of a fresh
controller's start), as soon as those imports are done, while torch's are still to come.

Forking is safe here because the server has no other thread when it forks and never touches
CUDA: one loop waits on stdin, on a pipe that SIGCHLD wakes, and on the kernel's pidfd, readable
when the kernel ends (``lifeline``; a timer where the OS has no pidfds). A fork from a
multi-threaded process can deadlock the child on a lock another thread held (Python 3.12 warns
about it); this one has no other thread to hold one. Only while it imports torch (seconds, more on
a busy machine), before any engine's fork, a watcher thread ends it if the kernel goes meanwhile,
and is gone before the loop starts.

Protocol, lines on stdin/stdout: the server says ``ready`` once its imports are done (a
``controller`` request already waiting is served halfway, before torch's import); ``cluster
[PROFILE_DIR, CLUSTER_ID, LOG_DIR]`` (JSON) ties it to a cluster, before any spawn; ``spawn ID``
→ ``pid PID ID``; ``controller ID {args, env, cwd, log}`` (JSON) → ``pid PID ID``, the cluster's
controller forked (its imports are the server's: see ``ForkedController`` in the kernel's end,
``forks``). ``ID`` (a number; a request without one is answered without) matches an answer to
its request: ``cancel ID`` (the kernel stopped waiting for it) → the server kills the process it
forked for that request, if it still runs (a child not yet reaped: its pid is not anyone else's);
``warm`` → the server imports what a
first training cell imports (``_WARM``), so engines forked later (a lost rank's replacement)
start with it; ``exit`` → the server reaps its engines (told to leave) and leaves. When an
engine ends, the server says ``exit PID STATUS`` at once (STATUS as ``os.waitstatus_to_exitcode``:
negative for a signal), which is how the notebook learns of a dead engine within milliseconds.
Runs as ``python -m nbdist.launch.forkserver IDLE``: a server that no ``cluster`` has claimed
within IDLE seconds leaves (the kernel starts one ahead of need, at ``%load_ext nbdist``: see
``nbdist.notebook.cluster.engines.forks``). As it starts, it removes the shared-memory
segments whose maker is gone (``nbdist.worker.collectives.segments``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator

from nbdist.launch import title

_LIFELINE_PERIOD = 0.5  # seconds between checks that the kernel is still there, without pidfds
_EXIT_WAIT = 5.0  # seconds the server waits at its exit for its engines (told to leave) to end
#: The children forked and not yet reaped: pid -> the id of the request it was forked for.
_children: dict[int, bytes] = {}


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _reap() -> None:
    """Collect every engine that has ended and report it (no zombies, no silent deaths)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _children.pop(pid, None)
        _say(f"exit {pid} {os.waitstatus_to_exitcode(status)}")


def _reap_all(timeout: float) -> None:
    """Wait up to ``timeout`` s for every engine to end, reporting each (none left a zombie
    for whoever adopts it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap()
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)  # any child left?
        except ChildProcessError:
            return
        time.sleep(0.005)  # they leave within milliseconds of their SIGTERM


#: Imported at ``warm`` (the kernel asks when a run with restarts starts): DDP imports
#: torch._dynamo (2-3 s of CPU) when it is first made, in every process; a replacement engine
#: forked after this has it, and a recovered cell's ``prepare`` takes milliseconds, not
#: seconds. (It does not add a thread: the server stays safe to fork.)
_WARM = ("torch._dynamo",)


def _warm() -> None:
    """Import ``_WARM``; an engine that dies meanwhile is reported at once all the same (the
    import runs Python code, between whose lines the SIGCHLD handler reaps)."""
    import importlib

    quiet = signal.signal(signal.SIGCHLD, lambda *_: _reap())  # nothing else writes meanwhile
    try:
        for name in _WARM:
            try:
                importlib.import_module(name)
            except Exception:  # engines import it themselves, as without this
                traceback.print_exc()
                sys.stderr.flush()
    finally:
        signal.signal(signal.SIGCHLD, quiet)


def _preload_controller() -> None:
    """What the cluster's controller runs (ipyparallel's controller, nbdist's heart): imported
    first, so that a start already waiting gets its controller forked before torch's import."""
    import ipyparallel.controller.app  # noqa: F401

    import nbdist.launch.controller  # noqa: F401
    import nbdist.launch.heart  # noqa: F401

    # What is imported here lives as long as every child: out of the cyclic collector's reach,
    # so no collection in a child walks these objects (copying the pages they share with it).
    gc.freeze()


def _preload() -> None:
    """What every engine imports at its start (torch above all)."""
    import ipyparallel.engine.app  # noqa: F401

    # Every engine's kernel resolves its debugger class at start, importing debugpy (pydevd):
    # 0.25-0.7 s of CPU in each, 80 % of an engine's start from fork to registered (py-spy).
    # Imported once here, before any fork (it starts no thread); quiet about frozen modules.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    import ipykernel.debugger  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    import nbdist.worker.api  # noqa: F401
    import nbdist.worker.runner  # noqa: F401

    gc.freeze()  # see _preload_controller


@contextlib.contextmanager
def _watched_while(kernel, lifeline) -> Iterator[None]:
    """Within the block, a thread that ends the server (and what it started) the moment the
    kernel ends; the thread is joined at the block's end, so no fork sees it."""
    if kernel is None:
        yield
        return
    stop_r, stop_w = os.pipe()

    def watch() -> None:
        if kernel.wait(_LIFELINE_PERIOD, until=stop_r):
            lifeline.kill_descendants()
            os._exit(0)

    watcher = threading.Thread(target=watch, name="nbdist-kernel-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        os.write(stop_w, b"x")
        watcher.join()
        os.close(stop_r)
        os.close(stop_w)


def _detach(inherited: list[int], log_path: str) -> None:
    """In a child just forked: a session of its own (a notebook interrupt to the kernel's group
    must not reach it), the server's signal handling and descriptors dropped, its output to
    ``log_path``."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in inherited:  # the server's wake-up pipe and watch are not the child's
        os.close(fd)
    os.setsid()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)


def _controller(spec: dict, inherited: list[int]) -> None:
    """The child: become the cluster's ipyparallel controller (``nbdist.launch.controller``),
    as ipyparallel's launcher would start it: ``spec`` has its arguments, environment additions,
    working directory and log file. Never returns."""
    code = 1
    try:
        _detach(inherited, spec["log"])
        title.name(title.of("controller", spec.get("cluster", "")))  # its schedulers' too
        os.chdir(spec["cwd"])
        os.environ.update(spec["env"])
        sys.argv = ["ipcontroller", *spec["args"]]
        from nbdist.launch.controller import main as controller

        controller()  # leaves by os._exit
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _engine(profile_dir: str, cluster_id: str, log_dir: str, inherited: list[int]) -> None:
    """The child: become an ipyparallel engine in a session of its own. Never returns."""
    code = 1
    try:
        _detach(inherited, os.path.join(log_dir, f"engine-{os.getpid()}.log"))
        title.name(title.of("engine", cluster_id))  # and its rank, once it has one
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
    except Exception:
        traceback.print_exc()  # into the engine's log: os._exit below would lose it
        sys.stderr.flush()
    finally:
        os._exit(code)


class _Requests:
    """The kernel's requests (lines on stdin, see the protocol above), acted on as they come."""

    def __init__(self, inherited: list[int]) -> None:
        self.inherited = inherited  # the server's descriptors: no child keeps them
        self.cluster: list[str] | None = None  # profile dir, cluster id, log dir, once claimed
        self._pending = b""

    def take(self, chunk: bytes) -> bool:
        """Act on every complete line read so far; False once the server must leave."""
        if not chunk:  # the kernel closed our stdin without "exit": it is gone
            import nbdist.launch.lifeline as lifeline

            lifeline.kill_descendants()
            return False
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            word, _, rest = line.strip().partition(b" ")
            ident = b""
            if rest[:1].isdigit():  # the request's id
                ident, _, rest = rest.partition(b" ")
            if word == b"cluster":
                self.cluster = json.loads(rest)
                title.name(title.of("forkserver", self.cluster[1]))
            elif word == b"controller":
                cluster = self.cluster[1] if self.cluster else ""
                self._fork(ident, _controller, {**json.loads(rest), "cluster": cluster})
            elif word == b"spawn":
                if self.cluster is None:  # the kernel's end always claims first
                    sys.exit("nbdist fork server: spawn before cluster")
                self._fork(ident, _engine, *self.cluster)
            elif word == b"cancel" and ident:
                _cancel(ident)
            elif word == b"warm":
                _warm()
            elif word == b"exit":  # the engines were told to leave: reap them as they do
                _reap_all(_EXIT_WAIT)
                return False
        return True

    def _fork(self, ident: bytes, child, *args: object) -> None:
        pid = os.fork()
        if pid == 0:
            child(*args, self.inherited)
        _children[pid] = ident
        _say(f"pid {pid} {ident.decode()}".rstrip())


def _cancel(ident: bytes) -> None:
    """Kill what was forked for request ``ident`` (its answer came too late to be taken); its
    exit is reported as any other's."""
    for pid, of in list(_children.items()):
        if of == ident:
            os.kill(pid, signal.SIGKILL)


def _sweep() -> None:
    """Remove the shared-memory segments whose maker is gone (a rank 0 killed while its group
    formed): on a container's small /dev/shm the next group would find no room."""
    try:
        from nbdist.worker.collectives import segments

        segments.sweep()
    except Exception:  # the server starts all the same
        traceback.print_exc()
        sys.stderr.flush()


def main() -> None:
    unclaimed_until = time.monotonic() + float(sys.argv[1])
    title.name(title.of("forkserver"))  # a spare, until a cluster claims it
    _sweep()
    import nbdist.launch.lifeline as lifeline

    kernel = lifeline.parent_check()
    watched = kernel.fd if kernel is not None else None
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)  # SIGCHLD writes a byte here: the loop wakes at once
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stdin = sys.stdin.fileno()
    sel = selectors.DefaultSelector()
    sel.register(stdin, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    if watched is not None:  # readable when the kernel ends: no timer needed
        sel.register(watched, selectors.EVENT_READ)
    period = _LIFELINE_PERIOD if kernel is not None and watched is None else None
    requests = _Requests([fd for fd in (wake_r, wake_w, watched) if fd is not None])
    _preload_controller()
    # A start already waiting (the kernel asks for its controller at once) has the controller
    # forked now, to start beside torch's import rather than after it.
    if stdin in {key.fd for key, _ in sel.select(0)} and not requests.take(os.read(stdin, 4096)):
        return
    with _watched_while(kernel, lifeline):
        _preload()
    _say("ready")
    while True:
        wait = period
        if requests.cluster is None:  # a spare nobody claimed leaves in time: its memory back
            left = unclaimed_until - time.monotonic()
            if left <= 0:
                return
            wait = left if wait is None else min(wait, left)
        ready = {key.fd for key, _ in sel.select(wait)}
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        _reap()
        if kernel is not None and not kernel.alive():
            # SIGKILL by PID: an engine wedged in C with the GIL held cannot run its own
            # watcher thread, but it dies all the same
            lifeline.kill_descendants()
            return
        if stdin in ready and not requests.take(os.read(stdin, 4096)):
            return


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # the interpreter's teardown of torch takes most of a second, and frees nothing
