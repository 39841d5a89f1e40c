"""Local engines: an ipyparallel controller here, with engines forked on this machine.

Each cluster lives in nbdist's own profile directory (``records.profile.profile_dir``: mode 0700, so
connection files are readable by their owner alone), whose config files tie the controller and
the engines to this kernel's life.

Local engines are forked from a warm fork server (see ``nbdist.launch.forkserver``): torch is
imported once for all of them, and the server reports an engine's death the moment it happens.
The server is the spare started at ``%load_ext nbdist`` where it still fits (``forks``).
"""

from __future__ import annotations

import queue
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import ipyparallel as ipp
import psutil

from .... import config
from ....errors import NbdistError
from ....records.profile import profile_dir
from . import forks
from .base import EngineExit, OnThisMachine
from .logs import LogCap, cluster_logs, rotated
from .processes import (
    Pids,
    close_quietly,
    controller_config,
    owner_only,
    private_dir,
    reap,
    remove_cluster_files,
    tree,
)


class LocalEngines(OnThisMachine):
    """An ipyparallel controller with local engines, owned by this kernel (an ``EngineSet``)."""

    cfg: config.ClusterConfig
    cluster_id: str
    log_dir: Path
    owns_engines = True
    client: ipp.Client | None

    def __init__(self, cfg: config.ClusterConfig, say: Callable[[str], None] | None = None):
        self.cfg = cfg
        self._say = say or (lambda text: None)  # the start's live line (cluster.progress)
        self.cluster_id = "nbdist-" + uuid.uuid4().hex[:8]
        profile = profile_dir()
        self.log_dir = private_dir(profile / "log" / self.cluster_id)
        # The fork server's imports are the long pole: the spare of %load_ext has done them,
        # else they start before anything else.
        self._forks = forks.take(profile, self.cluster_id, self.log_dir)
        self._ipp = ipp.Cluster(
            n=0,
            engines="local",
            profile_dir=str(profile),
            cluster_id=self.cluster_id,
            controller_ip=cfg.ip,
            controller_args=[
                f"--HeartMonitor.period={cfg.heartbeat}",
                f"--HeartMonitor.max_heartmonitor_misses={cfg.heartbeat_misses}",
                # an engine has the whole start to answer its first ping (ipyparallel's 30 s
                # purged engines still starting, many to a busy core, and they never came)
                f"--IPController.registration_timeout={max(30, int(cfg.start_timeout))}",
            ],
            shutdown_atexit=True,
            log_level=40,
            config=controller_config(),
            controller_launcher_class=forks.ForkedController,
        )
        self.client: ipp.Client | None = None
        self.engine_pids = Pids()  # each engine as first seen: signals never reach a reused pid
        self._warm = False  # whether the fork server was asked to import _WARM
        # its logs kept to a size while it runs (see engines.logs)
        self.log_cap = LogCap(self._logs, config.Retention().log_bytes)

    @property
    def cluster_file(self) -> str:
        """ipyparallel's record of this cluster (read by the sidebar)."""
        return self._ipp.cluster_file

    @property
    def server_pid(self) -> int:
        """The fork server's pid (engines are its children)."""
        return self._forks.proc.pid

    @property
    def exits(self) -> queue.Queue[EngineExit]:
        """Engine deaths, as they happen."""
        return self._forks.exits

    def start(self) -> ipp.Client:
        """Start the controller and the engines; return a client once all have registered."""
        try:
            self._ipp.start_controller_sync(server=self._forks)  # forks.ForkedController
            self.client = self._ipp.connect_client_sync()
            owner_only(Path(self._ipp.profile_dir) / "security")
            self.log_cap.start()
            self.add_engines(self.cfg.n, known=set())
        except BaseException as exc:
            self.stop()
            if isinstance(exc, (KeyboardInterrupt, NbdistError)):
                raise
            raise NbdistError(f"the cluster did not start: {exc}") from exc
        return self.client

    def add_engines(self, n: int, known: set[int]) -> list[int]:
        """Start ``n`` more engines; return their ids once they have registered. An engine
        that dies first (the fork server says so at once) fails this at once, with its error."""
        if not self._forks.ready():
            self._say("the fork server imports torch, once for every engine")
        pids = []
        for i in range(n):
            pids.append(self._forks.spawn(self.cfg.start_timeout))
            self._say(f"0/{n} engines registered; waiting for {n} ({i + 1} forked)")
        self.engine_pids.update(pids)
        deadline = time.monotonic() + self.cfg.start_timeout
        while time.monotonic() < deadline:
            new = sorted(set(self.client.ids) - known)
            if len(new) >= n:
                return new[:n]
            dead = [p for p in pids if p in self._forks.ended]
            if dead:
                raise NbdistError(self._died_starting(dead[0]))
            self._say(
                f"{len(new)}/{n} engines registered; waiting for {n - len(new)} "
                "(forked, starting their kernels and connecting)"
            )
            time.sleep(0.02)
        raise NbdistError(
            f"{n} engine(s) did not register within {self.cfg.start_timeout:.0f} s; "
            f"their logs are in {self.log_dir}"
        )

    def expect_replacements(self) -> None:
        """Have the fork server import what a fresh engine's first cell imports (once, 2-3 s
        of its CPU), so that a replacement forked after prepares its model in milliseconds.
        Asked for by the first run, not at start (a cluster that never runs a cell never
        spends it): asked only by a run with restarts, a recovery in the first second of that
        run waited for it (0.85 s of the fork server's, measured), whatever ran before."""
        if not self._warm:
            self._warm = True
            self._forks.warm()

    def _died_starting(self, pid: int) -> str:
        """One line: the engine that died while starting, how, and the last line it logged."""
        self.engine_pids.discard(pid)
        how = EngineExit(pid, self._forks.ended[pid]).describe()
        log = self.log_dir / f"engine-{pid}.log"
        try:
            last = log.read_text(errors="replace").strip().splitlines()[-1:]
        except OSError:
            last = []
        said = f": {last[0].strip()[-300:]}" if last else " (it logged nothing)"
        return f"an engine (pid {pid}) {how} while starting{said}; its log: {log}"

    def _logs(self) -> list[Path]:
        controller = getattr(self._ipp.controller, "output_file", None)
        return cluster_logs(self.log_dir, controller)

    def processes(self) -> list[psutil.Process]:
        """Every process of this cluster: controller, fork server, engines and their children."""
        roots = [self._forks.proc.pid]
        ctl = getattr(self._ipp.controller, "process", None)
        if ctl is not None:
            roots.append(ctl.pid)
        return tree(roots) + tree(self.engine_pids)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop everything; what does not leave within ``timeout`` is killed, by PID.

        Every process is told at once and all are waited for together: engines leave at their
        SIGTERM (``worker.script.end_on_term``), the fork server at its "exit", the controller
        at its SIGTERM; a stop takes as long as the slowest of them, not their sum.
        """
        procs = self.processes()
        self.log_cap.stop()
        controller_log = getattr(self._ipp.controller, "output_file", None)
        close_quietly(self.client)
        self.client = None
        for p in procs:
            if p.pid in self.engine_pids:
                try:
                    p.terminate()
                except psutil.NoSuchProcess:
                    pass
        self._forks.close()
        controller = self._ipp.controller
        if controller is not None and getattr(controller, "process", None) is not None:
            try:
                controller.signal(signal.SIGTERM)
            except Exception:
                pass
        reap(procs, timeout)
        self._forks.wait()
        try:
            self._ipp.stop_controller_sync()  # gone already: ipyparallel's records only
        except Exception:
            pass
        remove_cluster_files(Path(self._ipp.profile_dir), self.cluster_id)  # the hub's state too
        if controller_log and not Path(controller_log).exists():  # ipyparallel removed it
            rotated(Path(controller_log)).unlink(missing_ok=True)  # so its older part goes too
        self.engine_pids.clear()
