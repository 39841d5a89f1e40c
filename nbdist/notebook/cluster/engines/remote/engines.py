"""``RemoteEngines``: an ipyparallel controller here, engines on other hosts (an ``EngineSet``).

Networking: the controller listens on the address the hosts reach (``checks.choose_ip``); messages
are signed (checked at start); the connection info reaches the engines in their environment,
through ssh's standard input: no key is written on the hosts, none shows on a command line.
MASTER_ADDR is rank 0's host address as the other hosts reach it (``address_of``): the host's
``address``, else its ``interface``'s, else the address it reaches the controller from.

Lifetime: ``stop`` asks the engines to leave, kills the stragglers (through their nanny, then
over ssh: only processes of this cluster), stops the controller, and removes this cluster's
folder on every host and its files here. If the kernel dies instead, the engines leave after
missing the controller's heartbeats (about 10 s); only their log folder stays on the host. A
Slurm job is cancelled at once by its guard (``jobs``), even one still in the queue.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import signal
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ipyparallel as ipp
import psutil

from .....config import ClusterConfig, RemoteConfig
from .....errors import NbdistError, UsageError
from .....protocol import Inventory
from .....records import profile, slurm
from .....worker import api
from ... import fanout
from ...hosts import remote_dir_of, ssh_command
from .. import processes
from ..base import EngineExit
from . import checks, jobs, launchers, shell
from .roster import Roster


class RemoteEngines:
    """A controller here, engines started by ipyparallel's launchers (ssh, slurm, mpi, local)."""

    cfg: ClusterConfig
    cluster_id: str
    log_dir: Path
    owns_engines = True  # this kernel started them: %nbdist stop stops them
    exits: queue.Queue[EngineExit]
    client: ipp.Client | None

    def __init__(self, cfg: ClusterConfig):
        if cfg.remote is None:
            raise ValueError("RemoteEngines needs a ClusterConfig with remote settings")
        self.cfg = cfg
        self.remote: RemoteConfig = cfg.remote
        self._options = launchers.launcher_options(
            self.remote.launcher,
            {**self.remote.launcher_options, **launchers.scheduler_options(self.remote)},
        )  # a mistake there is one line, before anything is made
        self.jobs = jobs.SchedulerJobs(self.remote.launcher)  # a scheduler's jobs, if any
        self.job_line = self.jobs.status_line  # for %nbdist status: the job, its time left
        self.cluster_id = "nbdist-" + uuid.uuid4().hex[:8]
        processes.tie_to_this_process()  # the local launcher's engines: nbdist.launch.lifeline
        self._profile = profile.profile_dir()
        self.log_dir = processes.private_dir(self._profile / "log" / self.cluster_id)
        self.remote_dir = remote_dir_of(self.remote, self.cluster_id)
        self.client = None
        self.exits = queue.Queue()
        self.preflight: dict[str, checks.HostFacts] = {}  # what each host has
        self.location = ""  # the controller's address as the engines reach it
        self._hosts = {h.name: h for h in self.remote.hosts}
        self.roster = Roster(self._hosts)  # which engine is which, and which have left
        self._ipp: ipp.Cluster | None = None
        self._sets = 0
        self._set_host: dict[str, str | None] = {}  # engine set id -> its host
        self._stopping = False
        self._stopped = False

    # -- start ------------------------------------------------------------------------------
    def start(self) -> ipp.Client:
        """Check the hosts, start the controller and the engines; return a connected client
        once every engine has registered. On failure, everything started is stopped."""
        try:
            if self.remote.launcher == "slurm":  # would Slurm take the job? Its reason if not
                slurm.precheck(self.cfg.n, self._options)
            ip, self.location = checks.choose_ip(self.remote)
            with ThreadPoolExecutor(1) as pool:  # the hosts are checked while the controller starts
                checked = pool.submit(checks.preflight, self.remote, self.location)
                try:
                    self._start_controller(ip)
                finally:
                    self.preflight = checked.result()
            threads = checks.threads_per_engine(self.cfg, self.preflight)
            self.cfg = dataclasses.replace(self.cfg, ip=ip, threads_per_engine=threads)
            plan = (
                Counter({h.name: h.engines for h in self.remote.hosts})
                if self.remote.launcher == "ssh"
                else Counter({None: self.cfg.n})
            )
            self._launch_and_wait(plan, known=set())
        except BaseException as exc:
            self.stop()
            if isinstance(exc, (KeyboardInterrupt, NbdistError)):
                raise
            raise NbdistError(f"the remote engines did not start: {exc}") from exc
        return self.client

    def _start_controller(self, ip: str) -> None:
        # listening everywhere: tell the engines the one address to use
        location = {"controller_location": self.location} if ip == "0.0.0.0" else {}
        self._ipp = ipp.Cluster(
            n=0,
            engines=launchers.LAUNCHER_CLASSES[self.remote.launcher],
            profile_dir=str(self._profile),
            cluster_id=self.cluster_id,
            controller_ip=ip,
            controller_args=[
                f"--HeartMonitor.period={self.cfg.heartbeat}",
                f"--HeartMonitor.max_heartmonitor_misses={self.cfg.heartbeat_misses}",
                # an engine has the whole start to answer its first ping (ipyparallel's 30 s
                # purged engines still starting, many to a busy core, and they never came)
                f"--IPController.registration_timeout={max(30, int(self.cfg.start_timeout))}",
            ],
            shutdown_atexit=False,  # the session stops us at exit: one stop, in order
            log_level=40,
            config=processes.controller_config(),
            **location,
        )
        self._ipp.start_controller_sync()
        self.client = self._ipp.connect_client_sync()  # waits for the connection files
        security = Path(self._ipp.profile_dir) / "security"
        processes.owner_only(security)
        info = json.loads((security / f"ipcontroller-{self.cluster_id}-engine.json").read_text())
        if not info.get("key") or not str(info.get("signature_scheme", "")).startswith("hmac-"):
            raise NbdistError("the controller does not sign its messages: refusing to start")
        # ipyparallel calls these on its own thread when an engine registers or leaves.
        self.client._registration_callbacks.append(self._on_registration)

    @property
    def cluster_file(self) -> str:
        """ipyparallel's record of this cluster (read by the sidebar)."""
        return self._ipp.cluster_file if self._ipp is not None else ""

    @property
    def engine_pids(self) -> set[int]:
        """The pids of the engines this cluster started (on their hosts), ours to signal."""
        return self.roster.pids

    # -- engines ----------------------------------------------------------------------------
    def _launch(self, host: str | None, n: int) -> str:
        """Start ``n`` engines on ``host`` (None: wherever the launcher puts them); return the
        engine set's id. Over ssh the engines start in the background (see launchers)."""
        set_id = f"{host or self.remote.launcher}-{self._sets}"
        self._sets += 1
        self._set_host[set_id] = host
        # the cluster id on the command line: how the cleanup over ssh knows our processes
        args = [*launchers.ENGINE_ARGS, f"--cluster-id={self.cluster_id}"]
        kwargs = dict(self._options, engine_args=args)
        if launchers.has_batch_file(self.remote.launcher):
            # the batch script goes with the logs, not into the notebook's folder
            kwargs.setdefault("batch_file_name", str(self.log_dir / f"{set_id}.batch"))
        if host is not None:
            h = self._hosts[host]
            kwargs.update(
                engines={h.location: {"n": n, "to_send": []}},  # connection info: environment
                ssh_args=ssh_command(h, self.remote.connect_timeout)[1:],
                remote_python=h.python,
                remote_profile_dir=self.remote_dir,
                environment={**h.environment, "NBDIST_HOST": h.name},
                delay=0.0,
            )
        try:
            self._ipp.start_engines_sync(n, engine_set_id=set_id, **kwargs)
        except Exception as exc:
            raise NbdistError(self._launch_failed(host, exc)) from exc
        self.jobs.launched(set_id, self._ipp.engines[set_id])  # its guard cancels it if we die
        return set_id

    def _launch_failed(self, host: str | None, exc: BaseException) -> str:
        where = f"host {host}" if host else f"the {self.remote.launcher} launcher"
        return f"{where}: starting engines failed ({shell.one_line(launchers.why(exc))})"

    def _launch_and_wait(self, plan: Counter, known: set[int]) -> list[int]:
        sets = {self._launch(host, n): host for host, n in plan.items()}
        want = sum(plan.values())
        deadline = time.monotonic() + self.cfg.start_timeout
        while True:
            new = self.roster.unknown(set(self.client.ids) - known)
            if len(new) >= want:
                break
            for set_id, host in sets.items():
                error = getattr(self._ipp.engines.get(set_id), "error", None)
                if error is not None:
                    raise NbdistError(self._launch_failed(host, error))
            self.jobs.waiting(list(sets), self.cfg.start_timeout, time.monotonic() > deadline)
            if time.monotonic() > deadline:
                self.roster.identify(self.client, new, self.cfg.start_timeout)
                raise NbdistError(self._not_registered(plan, new))
            time.sleep(0.02)
        new = new[:want]
        self.roster.identify(self.client, new, self.cfg.start_timeout)
        self.jobs.assign(new, list(sets))
        self.jobs.watch(self._job_ended)  # a job ended under a cell: known within seconds
        return new

    def _not_registered(self, plan: Counter, new: list[int]) -> str:
        came, parts = Counter(self.roster.host_of[e] for e in new), []
        for host, wanted in plan.items():
            missing = wanted - came[host]
            if missing <= 0:
                continue
            if host is None:
                parts.append(f"{missing} engine(s) from the {self.remote.launcher} launcher")
                continue
            last = shell.log_tail(self._hosts[host], self.remote_dir, self.remote.connect_timeout)
            said = f" (last output: {last})" if last else ""
            parts.append(f"{missing} engine(s) on host {host}{said}")
        return (
            f"{', '.join(parts)} did not register within {self.cfg.start_timeout:g} s: check "
            f"that the hosts reach this machine at {self.cfg.ip}"
        )

    def add_engines(self, n: int, known: set[int]) -> list[int]:
        """Start ``n`` more engines (where engines left, first); their ids once registered."""
        if self.remote.launcher != "ssh":
            self.jobs.announce_ended()
            return self._launch_and_wait(Counter({None: n}), known)
        return self._launch_and_wait(Counter(self.roster.hosts_for(n)), known)

    def _job_ended(self, job: jobs.Job) -> None:
        """(The watcher's thread.) The scheduler ended ``job``: its engines are lost now, and
        killed, even those outliving its SIGTERM, so none goes on writing beside a new job."""
        eids = self.roster.live(job.engines)
        self.signal([self.roster.pid_of[e] for e in eids], signal.SIGKILL)
        for e in eids:
            self.exits.put(self.roster.exit_of(e, job.end))

    def _on_registration(self, event: dict) -> None:
        if event.get("event") != "unregister" or self._stopping:
            return
        eid = int(event["id"])
        if self.roster.live([eid]):
            self.roster.leave(eid)
            self.exits.put(self.roster.exit_of(eid, self.jobs.why_gone(eid)))  # its job's end

    def signal(self, pids: list[int], sig: int = signal.SIGINT) -> None:
        """Send ``sig`` to these engines (ours only), relayed by each engine's nanny."""
        eids = self.roster.engines_of(pids)
        if self.client is None or not eids:
            return
        if sig == signal.SIGKILL:
            for eid in eids:
                self.roster.leave(eid)
        targets = [e for e in eids if e in self.client.ids]
        if targets:
            try:
                self.client.send_signal(signal.Signals(sig).name, targets=targets, block=False)
            except Exception:
                pass  # the engine left meanwhile

    def expect_replacements(self) -> None:
        """Nothing to prepare: remote engines start as ipyparallel's launchers start them."""

    def retire(self, pids: list[int]) -> None:
        """Kill these engines and forget them: fresh engines take their ranks (same hosts first)."""
        self.signal(pids, signal.SIGKILL)
        self.engine_pids.difference_update(pids)

    def address_of(self, engine_id: int) -> str:
        """The address of this engine's host as the other hosts reach it (for MASTER_ADDR)."""
        host = self._hosts.get(self.roster.host_of.get(engine_id) or "")
        if host is not None and host.address:
            return host.address
        interface = host.interface if host else None
        found = fanout.call(
            self.client,
            {engine_id: engine_id},
            api.host_address,
            self.location,
            interface,
            timeout=self.cfg.start_timeout,
        )
        if engine_id in found.failures:
            where = host.name if host else f"engine {engine_id}"
            raise UsageError(f"host {where}: {shell.one_line(found.failures[engine_id])}")
        return found.values[engine_id]

    def check(self, inventory: dict[int, Inventory]) -> dict[int, Inventory]:
        """One environment across hosts: show the hosts' versions in one table, then refuse
        (or warn, by option) when they differ. Returns the inventory with each engine's host
        position (``host_index``) set."""
        return checks.check_environments(inventory, self.remote.hosts, self.remote.env_check)

    def remote_pids(self) -> dict[str, list[int]]:
        """Engine pids on each host (for the engines that registered and have not left)."""
        return self.roster.pids_by_host()

    def processes(self) -> list[psutil.Process]:
        """This cluster's processes on this machine: the controller, and the launcher's local
        processes (local engines, mpiexec). Engines on other hosts are in ``remote_pids()``."""
        if self._ipp is None:
            return []
        roots = []
        ctl = getattr(self._ipp.controller, "process", None)
        if ctl is not None:
            roots.append(ctl.pid)
        for es in self._ipp.engines.values():
            roots += launchers.local_roots(es)
        return processes.tree(roots + self.jobs.pids())

    # -- stop -------------------------------------------------------------------------------
    def stop(self, timeout: float = 5.0) -> None:
        """Stop every engine and the controller; remove this cluster's files here and on the
        hosts. Safe to call twice, and after a failed start."""
        if self._stopped:
            return
        self._stopping = True
        procs = self.processes()
        if self.client is not None:
            self._stop_engines(timeout)
            processes.close_quietly(self.client)
            self.client = None
        if self._ipp is not None:
            self._stop_launchers()
            self.jobs.stop()  # the jobs cancelled (by their guards too), the guards gone
            try:
                self._ipp.stop_controller_sync()
            except Exception:
                pass
        processes.reap(procs, timeout)
        processes.remove_cluster_files(self._profile, self.cluster_id)
        self.engine_pids.clear()
        self._stopped = True

    def _stop_engines(self, timeout: float) -> None:
        """Ask every engine to leave; kill (through its nanny) any still there after a while."""
        ids = list(self.client.ids)
        if not ids:
            return
        try:
            self.client.shutdown(targets=ids, hub=False, block=False)
        except Exception:
            pass
        if processes.wait_for(lambda: not set(ids) & set(self.client.ids), timeout / 2):
            return
        left = [e for e in ids if e in self.client.ids]
        try:
            self.client.send_signal("SIGKILL", targets=left, block=False)
        except Exception:
            pass
        processes.wait_for(lambda: not set(left) & set(self.client.ids), timeout / 2)

    def _stop_launchers(self) -> None:
        """Engines that never registered or would not leave: ended by their launcher. Over ssh,
        one call per host kills this cluster's processes there and removes its folder."""
        ssh_hosts: dict[str, list[int]] = {}
        for set_id, es in list(self._ipp.engines.items()):
            if isinstance(es, launchers.SSHEngineSetLauncher):
                es.wait(3 * self.remote.connect_timeout)  # no engine may start after this
                ssh_hosts.setdefault(self._set_host[set_id], []).extend(es.engine_pids())
            else:
                try:
                    self._ipp.stop_engines_sync(set_id)
                except Exception:
                    pass
        self._ipp.engines.clear()
        if not ssh_hosts:
            return
        t = self.remote.connect_timeout
        with ThreadPoolExecutor(min(16, len(ssh_hosts))) as pool:
            for name, pids in ssh_hosts.items():
                script = shell.cleanup_script(
                    pids, self.cluster_id, self.remote_dir, self.remote.remote_dir
                )
                pool.submit(shell.run_script, self._hosts[name], script, t)
