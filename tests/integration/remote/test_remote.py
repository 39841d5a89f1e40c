"""Engines over SSH: a real sshd on 127.0.0.1 (and, where root and ``ip netns`` allow, two network
namespaces standing for two hosts with their own addresses), real DDP across them, and every way
of failing well, each timed.

The sshd and the namespaces come from ``tests/netns.py``. The sshd runs with a config, host key
and client key made for the test in a temp dir, on a free port, as a child of the test (tracked
by PID, stopped at the end); it authorizes a key for the current user from a file of its own,
never ~/.ssh. Engines started over ssh are not children of the test: they are tracked by the
PIDs the cluster reports, and checked gone after each stop.
"""

from __future__ import annotations

import ast
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import netns
import psutil
import pytest
from kernels import shutdown_kernel, start_kernel
from netns import Sshd, cluster_file, free_port
from paths import ROOT
from processes import assert_gone, wait_until

import nbdist
from nbdist.errors import NbdistError, UsageError
from nbdist.notebook.cluster.engines.remote.engines import RemoteEngines
from nbdist.notebook.cluster.engines.remote.launchers import launcher_options

NOTEBOOK = ROOT / "notebooks" / "remote_hosts.ipynb"

_DDP = textwrap.dedent(
    """
    import os, torch
    torch.manual_seed(0)
    model = nbdist.prepare(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(nbdist.rank())
    X = torch.randn(64, 4, generator=g)
    y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    losses = []
    for step in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(X), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.zeros_like(flat) for _ in range(nbdist.world_size())]
    torch.distributed.all_gather(everyone, flat)
    ({"identical": all(torch.equal(everyone[0], t) for t in everyone),
      "first": losses[0], "last": losses[-1],
      "master": os.environ["MASTER_ADDR"], "world": nbdist.world_size()})
    """
)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    netns.need_sshd()
    s = Sshd(tmp_path_factory.mktemp("sshd"))
    yield s
    s.stop()


def _remote_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("remote-home") / "nbdist"


def _security_files() -> list[str]:
    sec = Path(os.environ["NBDIST_DATA_DIR"]) / "profile" / "security"
    return sorted(p.name for p in sec.glob("*.json")) if sec.exists() else []


def _stop_and_check_gone(c) -> None:
    """Stop ``c`` and check that its engines (and their nannies), controller and files left."""
    remote_pids = [p for pids in c.engines.remote_pids().values() for p in pids]
    nannies = []
    for pid in remote_pids:
        try:
            nannies += [k.pid for k in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    local = [p.pid for p in c.engines.processes()]
    cid, remote_dir = c.engines.cluster_id, Path(c.engines.remote_dir)
    c.stop()
    assert_gone(remote_pids + nannies + local, timeout=15)
    assert not remote_dir.exists(), "the cluster's folder on the host is left behind"
    assert not [f for f in _security_files() if cid in f], "stale cluster or connection files"


# -- engines over ssh on 127.0.0.1 -------------------------------------------------------------
@pytest.fixture(scope="module")
def ssh_cluster(sshd, tmp_path_factory):
    f = cluster_file(
        tmp_path_factory.mktemp("cf") / "cluster.toml",
        [sshd.host(engines=2)],
        remote_dir=str(_remote_dir(tmp_path_factory)),
    )
    c = nbdist.start(cluster_file=f)
    yield c
    if nbdist.current(required=False) is c:
        _stop_and_check_gone(c)


def test_engines_start_over_ssh_and_train_ddp_across_them(ssh_cluster):
    c = ssh_cluster
    assert isinstance(c.engines, RemoteEngines)
    assert [s.host for s in c.slots] == ["127.0.0.1", "127.0.0.1"]
    assert [(s.local_rank, s.local_world_size, s.device) for s in c.slots] == [
        (0, 2, "cpu"),
        (1, 2, "cpu"),
    ]
    out = c.run(_DDP)
    assert out["identical"] and out["world"] == 2
    assert out["last"] < out["first"] / 10, out
    assert out["master"] == "127.0.0.1" == c.master_addr


def test_engines_are_not_children_of_the_kernel_but_are_tracked(ssh_cluster):
    pids = ssh_cluster.engines.remote_pids()["127.0.0.1"]
    assert sorted(pids) == sorted(s.pid for s in ssh_cluster.slots)
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    assert not set(pids) & mine  # started by sshd: only their PIDs tie them to us
    for pid in pids:
        assert "ipyparallel.engine" in " ".join(psutil.Process(pid).cmdline())


def test_messages_are_signed_and_the_key_never_leaves_in_a_file_or_command_line(ssh_cluster):
    import json

    c = ssh_cluster
    sec = Path(os.environ["NBDIST_DATA_DIR"]) / "profile" / "security"
    assert sec.stat().st_mode & 0o077 == 0
    files = [f for f in sec.glob("*.json") if c.engines.cluster_id in f.name]
    assert files and all(f.stat().st_mode & 0o077 == 0 for f in files)
    info = json.loads((sec / f"ipcontroller-{c.engines.cluster_id}-engine.json").read_text())
    assert info["signature_scheme"] == "hmac-sha256" and len(info["key"]) >= 32
    written = [p for p in Path(c.engines.remote_dir).rglob("*") if p.is_file()]
    assert written  # the engines' logs and profile are there, yet no key
    assert not any(info["key"] in p.read_text(errors="replace") for p in written)
    for s in c.slots:
        assert info["key"] not in " ".join(psutil.Process(s.pid).cmdline())


def test_the_controller_listens_on_the_hosts_address_only(ssh_cluster):
    c = ssh_cluster
    assert c.cfg.ip == "127.0.0.1"  # the host is this machine: loopback is reachable enough
    ctl = [p for p in c.engines.processes() if ".controller" in " ".join(p.cmdline())]
    listening = [
        conn.laddr
        for p in ctl
        for conn in p.net_connections("inet")
        if conn.status == psutil.CONN_LISTEN
    ]
    assert listening and {a.ip for a in listening} == {"127.0.0.1"}, listening  # not 0.0.0.0


def test_status_shows_host_and_gpu_per_rank(ssh_cluster):
    rows = ssh_cluster.status()
    assert [(r["rank"], r["host"], r["gpu"], r["state"]) for r in rows] == [
        (0, "127.0.0.1", "-", "ready"),
        (1, "127.0.0.1", "-", "ready"),
    ]


def test_an_interrupt_reaches_a_remote_engine_through_its_nanny(ssh_cluster):
    t0 = time.monotonic()
    with pytest.raises(nbdist.DistributedCellError):
        ssh_cluster.run("import time\ntime.sleep(60)", nbdist.config.CellOptions(timeout=1))
    took = time.monotonic() - t0
    assert took < 8, f"the timeout took {took:.1f} s to stop both ranks"
    assert ssh_cluster.run("nbdist.world_size()") == 2  # both engines are still there


def test_a_dead_remote_engine_is_reported_and_replaced_on_its_host(ssh_cluster):
    c = ssh_cluster
    victim = c.slots[1]
    assert victim.pid not in c.drain_exits()
    os.kill(victim.pid, signal.SIGKILL)  # the host is this machine: kill it as a crash would
    t0 = time.monotonic()
    died = wait_until(
        lambda: c.drain_exits().get(victim.pid), 10, what="the engine's death to be reported"
    )
    assert time.monotonic() - t0 < 3
    assert (died.pid, died.host) == (victim.pid, "127.0.0.1")
    assert "left the cluster" in died.describe()
    c.replace([1])
    assert c.slots[1].pid != victim.pid and c.slots[1].host == "127.0.0.1"
    assert c.run(_DDP)["identical"]


def test_stop_leaves_no_engine_no_files_here_or_on_the_host(ssh_cluster):
    _stop_and_check_gone(ssh_cluster)


# -- failing well --------------------------------------------------------------------------------
def _fails_fast(limit: float, **options) -> str:
    """Start with ``options``; return the one-line error, checking the time and what is left."""
    before_files = _security_files()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    t0 = time.monotonic()
    with pytest.raises(NbdistError) as e:
        nbdist.start(**options)
    took = time.monotonic() - t0
    msg = str(e.value)
    assert took < limit, f"took {took:.1f} s to fail: {msg}"
    assert "\n" not in msg
    assert nbdist.current(required=False) is None
    assert _security_files() == before_files, "a stale cluster or connection file is left"
    wait_until(
        lambda: (
            not [
                p
                for p in psutil.Process().children(recursive=True)
                if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE
            ]
        ),
        10,
        what="the failed start's processes to exit",
    )
    return msg


def test_a_host_that_refuses_connections_is_named_within_seconds(sshd, tmp_path):
    port = free_port()
    f = cluster_file(tmp_path / "c.toml", [sshd.host(port=port)])
    msg = _fails_fast(5, cluster_file=f)
    assert msg == (
        f"host 127.0.0.1 refused the connection on port {port}: is sshd running there, on that "
        "port?"
    )


def test_a_host_that_does_not_answer_fails_within_the_connect_timeout(sshd, tmp_path):
    with socket.socket() as silent:  # accepts TCP, never speaks SSH
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        f = cluster_file(
            tmp_path / "c.toml", [sshd.host(port=silent.getsockname()[1])], connect_timeout=2
        )
        msg = _fails_fast(6, cluster_file=f)
    assert msg.startswith("host 127.0.0.1 did not answer within 2 s: check that it is up")


def test_a_wrong_user_is_named_with_the_fix(sshd, tmp_path):
    f = cluster_file(tmp_path / "c.toml", [sshd.host(user="nbdist-no-such-user")])
    msg = _fails_fast(5, cluster_file=f)
    assert msg.startswith("host 127.0.0.1 refused the login as user nbdist-no-such-user")
    assert msg.endswith("(ssh-copy-id nbdist-no-such-user@127.0.0.1)")


def test_a_wrong_key_is_named_with_the_fix(sshd, tmp_path):
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True
    )
    f = cluster_file(
        tmp_path / "c.toml", [sshd.host(ssh_options=sshd.ssh_options(key=tmp_path / "k"))]
    )
    msg = _fails_fast(5, cluster_file=f)
    assert msg.startswith(f"host 127.0.0.1 refused the login as user {sshd.user}")
    assert "Permission denied" in msg and "ssh-copy-id" in msg


def test_an_unknown_host_key_is_never_accepted_silently(sshd, tmp_path):
    (tmp_path / "empty").write_text("")
    f = cluster_file(
        tmp_path / "c.toml",
        [sshd.host(ssh_options=sshd.ssh_options(known_hosts=tmp_path / "empty"))],
    )
    msg = _fails_fast(5, cluster_file=f)
    assert msg == (
        f"host 127.0.0.1: its SSH host key is not known here (or has changed): run ssh "
        f"{sshd.user}@127.0.0.1 once to check and accept it"
    )


def test_a_remote_python_that_does_not_exist_is_named(sshd, tmp_path):
    f = cluster_file(tmp_path / "c.toml", [sshd.host(python="/nonexistent/bin/python3")])
    msg = _fails_fast(5, cluster_file=f)
    assert msg.startswith("host 127.0.0.1: no Python at '/nonexistent/bin/python3'")


def test_a_remote_python_without_nbdist_or_torch_is_named_with_the_fix(sshd, tmp_path):
    bare = tmp_path / "bare-python"  # this Python without its site-packages
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    bare.chmod(0o755)
    f = cluster_file(tmp_path / "c.toml", [sshd.host(python=str(bare))])
    msg = _fails_fast(5, cluster_file=f)
    assert msg.startswith("host 127.0.0.1: the Python there (")
    assert "lacks ipyparallel, torch, nbdist: install them in that environment" in msg


def test_two_failing_hosts_are_both_named_at_once(sshd, tmp_path):
    port = free_port()
    f = cluster_file(
        tmp_path / "c.toml",
        [
            sshd.host(port=port),
            {**sshd.host(host="localhost", python="/nonexistent/python")},
        ],
    )
    msg = _fails_fast(6, cluster_file=f)
    assert msg.startswith("host 127.0.0.1 refused the connection")
    assert "; host localhost" in msg


def test_hosts_that_differ_are_shown_in_one_table_and_refused_by_name(sshd, tmp_path, capsys):
    import site
    import sysconfig

    system = "/usr/bin/python3"
    if not os.path.exists(system):
        pytest.skip("no system Python to stand for a host with another version")
    version = subprocess.run(
        [system, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    me = sys.version.split()[0]
    if version == me or version.rsplit(".", 1)[0] != sysconfig.get_python_version():
        pytest.skip(f"the system Python ({version}) cannot stand for another {me} here")
    other = tmp_path / "other-python"  # another Python version, with this one's packages
    paths = ":".join([*site.getsitepackages(), str(Path(nbdist.__file__).parents[1])])
    other.write_text(f'#!/bin/sh\nPYTHONPATH={paths} exec {system} "$@"\n')
    other.chmod(0o755)
    f = cluster_file(
        tmp_path / "c.toml",
        [sshd.host(), sshd.host(host="localhost", python=str(other))],
        remote_dir=str(tmp_path / "remote"),
    )
    msg = _fails_fast(30, cluster_file=f)
    # two hosts, one version each: either may be named as the odd one out
    assert msg.startswith("the hosts' environments differ: Python "), msg
    assert f"{version} on localhost" in msg and f"{me} on 127.0.0.1" in msg, msg
    assert "Install the same versions everywhere, or start with --env-check warn" in msg
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["host", "engines", "python", "torch", "nbdist", "cuda"]
    assert [row.split()[:3] for row in table[1:3]] == [
        ["127.0.0.1", "1", me],
        ["localhost", "1", version],
    ]
    assert not (tmp_path / "remote").exists()


def test_engines_that_start_but_never_register_are_killed_and_named(sshd, tmp_path):
    # an engine that hangs before registering: a stand-in for ipyparallel.engine on the path
    shadow = tmp_path / "shadow"
    (shadow / "ipyparallel" / "engine").mkdir(parents=True)
    (shadow / "ipyparallel" / "__init__.py").write_text("")
    (shadow / "ipyparallel" / "engine" / "__init__.py").write_text("")
    (shadow / "ipyparallel" / "engine" / "__main__.py").write_text(
        "import sys, time\nprint('stuck before registering', flush=True)\ntime.sleep(600)\n"
    )
    f = cluster_file(
        tmp_path / "c.toml",
        [sshd.host(engines=2, environment={"PYTHONPATH": str(shadow)})],
        start_timeout=6,
        remote_dir=str(tmp_path / "remote"),
    )

    def stuck():
        found = []
        for p in psutil.process_iter():
            try:
                if p.environ().get("PYTHONPATH") == str(shadow):
                    found.append(p.pid)
            except (psutil.Error, OSError):
                pass
        return found

    msg = _fails_fast(25, cluster_file=f)
    assert msg.startswith("2 engine(s) on host 127.0.0.1 (last output: stuck before registering")
    assert "did not register within 6 s" in msg
    assert not (tmp_path / "remote").exists()
    wait_until(
        lambda: not [p for p in stuck() if psutil.Process(p).status() != "zombie"],
        10,
        what="the half-started engines to be killed",
    )


def test_an_address_that_is_not_this_machines_is_refused_at_once(sshd, tmp_path):
    f = cluster_file(tmp_path / "c.toml", [sshd.host()])
    msg = _fails_fast(2, cluster_file=f, ip="192.0.2.77")
    assert msg.startswith("--ip 192.0.2.77 is not an address of this machine; its addresses:")


def test_a_scheduler_that_is_not_there_fails_well(tmp_path, monkeypatch):
    if shutil.which("sbatch"):
        pytest.skip("this machine has Slurm")
    monkeypatch.chdir(tmp_path)
    msg = _fails_fast(
        20,
        n=2,
        launcher="slurm",
        ip="127.0.0.1",
        launcher_options={"account": "ml", "timelimit": "0:10:00"},
    )
    assert msg.startswith("the slurm launcher: starting engines failed (")
    assert "sbatch" in msg
    assert list(tmp_path.iterdir()) == []  # no batch script left in the notebook's folder


# -- ipyparallel's own launchers, options passed through -----------------------------------------
def test_launcher_options_are_checked_and_converted():
    assert launcher_options("slurm", {"account": "ml", "timelimit": "1:00:00"}) == {
        "account": "ml",
        "timelimit": "1:00:00",
    }
    assert launcher_options("mpi", {"mpi_args": '["--hostfile", "hosts"]'}) == {
        "mpi_args": ["--hostfile", "hosts"],
    }
    assert launcher_options("local", {"delay": "0.5"}) == {"delay": 0.5}
    with pytest.raises(UsageError, match="the slurm launcher has no option 'acount'; its "):
        launcher_options("slurm", {"acount": "ml"})


def test_the_local_launcher_trains_and_leaves_nothing():
    c = nbdist.start(n=2, launcher="local", launcher_options={"delay": "0"})
    try:
        assert c.cfg.ip == "127.0.0.1"
        assert c.run(_DDP)["identical"]
        assert len(c.engines.processes()) >= 3  # the controller and the two engines, local
    finally:
        _stop_and_check_gone(c)


# -- through the magics, in a real kernel --------------------------------------------------------
def test_magic_mistakes_are_one_line_in_a_real_kernel():
    k = start_kernel()
    try:
        for line, words in [
            ("%nbdist start --hosts gpu1:0", "engines after ':' must be a number >= 1"),
            ("%nbdist start --launcher-opt nokey", "expected KEY=VALUE"),
            ("%nbdist start --env-check warn", "for engines on other hosts"),
            ("%nbdist start --launcher pbs", "invalid choice: 'pbs'"),
            ("%nbdist start --launcher slurm --launcher-opt acount=ml", "has no option 'acount'"),
        ]:
            r = k.run(line)
            assert r.error and r.error["ename"] == "UsageError", (line, r.error)
            assert words in r.error["evalue"] and "\n" not in r.error["evalue"]
            assert r.error["traceback"] == [f"UsageError: {r.error['evalue']}"]
    finally:
        shutdown_kernel(k)


def test_remote_engines_leave_when_their_kernel_dies(sshd, tmp_path):
    k = start_kernel()
    f = cluster_file(
        tmp_path / "c.toml", [sshd.host(engines=1)], remote_dir=str(tmp_path / "remote")
    )
    try:
        k.ok(f"import nbdist\nc = nbdist.start(cluster_file={f!r})", timeout=120)
        pids = ast.literal_eval(
            k.ok(
                "print([c.engines.remote_pids()['127.0.0.1'][0],"
                " *[p.pid for p in c.engines.processes()]])"
            ).stdout
        )
        os.kill(k.pid, signal.SIGKILL)  # no exit handler runs
        t0 = time.monotonic()
        assert_gone(pids, timeout=25)  # the controller at once, the engine on missed heartbeats
        assert time.monotonic() - t0 < 20
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)


# -- the remote-hosts notebook -------------------------------------------------------------------
def test_the_remote_hosts_notebook_runs_against_this_machine_over_ssh(sshd, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    f = cluster_file(
        tmp_path / "localhost.toml", [sshd.host(engines=2)], remote_dir=str(tmp_path / "remote")
    )
    monkeypatch.setenv("NBDIST_DEMO_CLUSTER", f)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    printed = {
        cell.source.splitlines()[0]: "".join(o.get("text", "") for o in cell.get("outputs", []))
        for cell in nb.cells
        if cell.cell_type == "code"
    }
    start = printed["%load_ext nbdist"].splitlines()
    assert start[0].split() == ["host", "engines", "python", "torch", "nbdist", "cuda"]
    assert start[1].split()[:2] == ["127.0.0.1", "2"] and "2 ranks ready" in start[2]
    status = printed["%nbdist status"].splitlines()
    assert status[0].split() == ["rank", "host", "pid", "device", "state"]
    assert [row.split()[1] for row in status[1:-1]] == ["127.0.0.1", "127.0.0.1"]
    results = [
        out["data"]["text/plain"]
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if out.get("output_type") == "execute_result"
    ]
    summary = next(ast.literal_eval(r) for r in results if "identical_parameters" in r)
    assert summary["identical_parameters"] is True
    assert summary["hosts"] == ["127.0.0.1", "127.0.0.1"]
    assert summary["final_loss"] < summary["first_loss"] / 10
    assert not (tmp_path / "remote").exists()


# -- two hosts with their own addresses: network namespaces ------------------------------------
@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    if reason := netns.unavailable():
        pytest.skip(reason)
    hosts = netns.TwoHosts(tmp_path_factory.mktemp("netns"), fast_link=True)
    yield hosts
    hosts.close()


def _rank_network(c) -> list[dict]:
    c.run(
        "import os, torch.distributed as dist\n"
        "net = {'master': os.environ['MASTER_ADDR'], "
        "'gloo': os.environ.get('GLOO_SOCKET_IFNAME'), 'backend': dist.get_backend()}"
    )
    return [c.pull("net", rank=r) for r in range(len(c.slots))]


def test_two_hosts_rendezvous_at_rank0s_address_as_the_other_reaches_it(two_hosts, tmp_path):
    f = cluster_file(
        tmp_path / "c.toml",
        [two_hosts.host("a"), two_hosts.host("b")],
        remote_dir=str(tmp_path / "remote"),
    )
    c = nbdist.start(cluster_file=f)
    try:
        assert c.cfg.ip == "10.77.0.254"  # the bridge: the address both hosts reach
        assert [(s.host, s.local_rank, s.group_rank) for s in c.slots] == [
            ("10.77.0.1", 0, 0),
            ("10.77.0.2", 0, 1),
        ]
        assert c.master_addr == "10.77.0.1"  # rank 0's host, not this machine, not loopback
        net = _rank_network(c)
        assert [n["master"] for n in net] == ["10.77.0.1", "10.77.0.1"]
        # gloo on each host listens on the interface it reaches rank 0 through
        assert [n["gloo"] for n in net] == [two_hosts.iface["a"], two_hosts.iface["b"]]
        out = c.run(_DDP)
        assert out["identical"] and out["last"] < out["first"] / 10
        ctl = [p for p in c.engines.processes() if ".controller" in " ".join(p.cmdline())]
        listening = {
            conn.laddr.ip
            for p in ctl
            for conn in p.net_connections("inet")
            if conn.status == psutil.CONN_LISTEN
        }
        # the hosts' side on the bridge address alone (loopback: the controller's own parts)
        assert listening - {"127.0.0.1"} == {"10.77.0.254"}, listening
    finally:
        _stop_and_check_gone(c)


def test_a_named_interface_carries_the_ranks_traffic(two_hosts, tmp_path):
    hosts = [two_hosts.host(x, interface=two_hosts.fast_iface[x]) for x in "ab"]
    f = cluster_file(tmp_path / "c.toml", hosts, remote_dir=str(tmp_path / "remote"))
    c = nbdist.start(cluster_file=f)
    try:
        assert c.master_addr == "10.78.0.1"  # host A's address on the fast network
        net = _rank_network(c)
        assert [n["master"] for n in net] == ["10.78.0.1", "10.78.0.1"]
        assert [n["gloo"] for n in net] == [two_hosts.fast_iface["a"], two_hosts.fast_iface["b"]]
        assert c.run(_DDP)["identical"]
    finally:
        _stop_and_check_gone(c)


def test_a_controller_address_the_hosts_cannot_reach_is_refused_naming_the_host(
    two_hosts, tmp_path
):
    f = cluster_file(tmp_path / "c.toml", [two_hosts.host("a"), two_hosts.host("b")])
    msg = _fails_fast(10, cluster_file=f, ip="127.0.0.1")
    assert msg.startswith("host 10.77.0.1 cannot reach this machine at 127.0.0.1 (")
    assert "; host 10.77.0.2 cannot reach" in msg and msg.endswith("with --ip")


def test_a_missing_interface_is_named_with_the_ones_there(two_hosts, tmp_path):
    f = cluster_file(tmp_path / "c.toml", [two_hosts.host("a", interface="ib0")])
    msg = _fails_fast(6, cluster_file=f)
    assert msg.startswith("host 10.77.0.1 has no network interface 'ib0': name one of ")
    assert two_hosts.fast_iface["a"] in msg
