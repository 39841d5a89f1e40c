"""The three engine sets behind one interface, and the records they handle: no cluster started."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import signal
import subprocess
import sys

import pytest

from nbdist.errors import NbdistError, UsageError
from nbdist.notebook.cluster import attach
from nbdist.notebook.cluster.engines.base import EngineExit, EngineSet
from nbdist.notebook.cluster.engines.hosted import HostedEngines
from nbdist.notebook.cluster.engines.local import LocalEngines
from nbdist.notebook.cluster.engines.remote.checks import check_environments
from nbdist.notebook.cluster.engines.remote.engines import RemoteEngines
from nbdist.notebook.cluster.engines.remote.jobs import RemoteExit
from nbdist.notebook.cluster.hosts import cluster_config
from nbdist.notebook.cluster.ranks import for_config
from nbdist.protocol import EngineIdentity, GpuInfo, Inventory, RankInfo
from nbdist.records import registry
from nbdist.records.host import HostRecord, SlotRecord

ENGINE_SETS = [LocalEngines, RemoteEngines, HostedEngines]


def _protocol_members() -> set[str]:
    declared = set(EngineSet.__annotations__)
    defined = {n for n in vars(EngineSet) if not n.startswith("_")}
    return declared | defined


def _class_members(cls: type) -> set[str]:
    annotated = {n for klass in cls.__mro__ for n in getattr(klass, "__annotations__", {})}
    return set(dir(cls)) | annotated


def _parameters(fn) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("cls", ENGINE_SETS, ids=lambda c: c.__name__)
def test_every_engine_set_has_every_member_of_the_interface(cls):
    members = _protocol_members()
    assert {"cfg", "client", "start", "retire", "owns_engines"} <= members  # the check looks
    assert members - _class_members(cls) == set()
    for name in members:
        spec = getattr(EngineSet, name, None)
        if inspect.isfunction(spec):  # same parameters, same defaults
            assert _parameters(getattr(cls, name)) == _parameters(spec), name
    assert not hasattr(cls, "hosted")  # no probing for the kind: owns_engines says it


def test_only_hosted_engines_belong_to_someone_else():
    assert [c.owns_engines for c in ENGINE_SETS] == [True, True, False]


def test_for_config_picks_remote_engines_for_hosts_and_schedulers():
    with pytest.raises(UsageError, match="has no option 'acount'"):
        for_config(cluster_config(2, launcher="slurm", launcher_options={"acount": "ml"}))


# -- hosted engines, from their record ---------------------------------------------------------
def _record(pid: int = 4321, **over) -> HostRecord:
    slots = tuple(
        SlotRecord(
            rank=r, engine_id=10 + r, host="here", pid=1000 + r, local_rank=r, local_world_size=2
        )
        for r in range(2)
    )
    gpu = GpuInfo(name="NVIDIA A100-SXM4-80GB", memory=80 * 2**30)
    fields = dict(
        pid=pid,
        n=2,
        state="running",
        started=123.5,
        cluster_id="nbdist-abc",
        backend="gloo",
        master_port=29500,
        attempt=3,
        ip="127.0.0.1",
        threads=2,
        profile_dir="/p",
        log_dir="/p/log",
        socket="/p/host.sock",
        slots=slots,
        engines=({"pid": 1000, "rank": 0}, {"pid": 1001, "rank": 1}, {"pid": 1002, "rank": None}),
        inventory={10: Inventory(host="here", pid=1000, threads=2, gpus=(gpu,), python="3.11")},
    )
    return HostRecord(**{**fields, **over})


def test_hosted_engines_take_their_settings_from_the_record_and_connect_only_on_start():
    rec = _record()
    hosted = HostedEngines(rec)  # nothing listens at /p/host.sock: no connection yet
    assert (hosted.cfg.n, hosted.cfg.threads, hosted.cfg.ip) == (2, 2, "127.0.0.1")
    assert (hosted.cluster_id, str(hosted.log_dir), hosted.client) == ("nbdist-abc", "/p/log", None)
    assert hosted.check(dict(rec.inventory)) == rec.inventory
    assert hosted.address_of(10) == "127.0.0.1"
    with pytest.raises(OSError):
        hosted.start()
    hosted.stop()  # safe after a failed start


def test_retire_kills_and_forgets_only_the_sets_own_engines():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        hosted = HostedEngines(_record())
        hosted.engine_pids = {child.pid}
        hosted.retire([child.pid, os.getpid()])  # the test's own pid is not the set's
        assert child.wait(timeout=10) == -signal.SIGKILL
        assert hosted.engine_pids == set()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# -- the hosted-cluster record on disk ----------------------------------------------------------
def test_a_host_record_survives_the_registry(data_dir):
    rec = _record(pid=os.getpid())
    registry.write(rec)
    path = registry.record_path(rec.pid)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert json.loads(path.read_text())["inventory"]["10"]["gpus"][0]["memory"] == 80 * 2**30
    assert registry.read_all() == [rec]


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        '["a list"]',
        '{"pid": "7", "n": 2}',
        '{"pid": 7}',
        '{"pid": 7, "n": 2, "slots": [1]}',
        '{"pid": 7, "n": 2, "inventory": {"zero": {}}}',
        '{"pid": 7, "n": 2, "slots": [{"rank": 0}]}',
    ],
)
def test_records_that_are_not_host_records_are_skipped(data_dir, text):
    registry.write(_record(pid=8, started=1.0))
    (registry.records_dir() / "host-7.json").write_text(text)
    assert [r.pid for r in registry.read_all()] == [8]


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NBDIST_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


# -- remote engines -----------------------------------------------------------------------------
def test_a_remote_exit_is_an_engine_exit_that_names_its_host():
    ex = RemoteExit(pid=77, host="gpu2", engine_id=5)
    assert isinstance(ex, EngineExit) and ex.status is None
    assert (
        ex.describe() == "on host gpu2 left the cluster (it ended, or its host stopped answering)"
    )


def test_the_environment_check_orders_hosts_as_given_and_marks_each_engine(capsys):
    cfg = cluster_config(hosts="gpu1:1,gpu2:1")
    inv = {
        0: Inventory(host="gpu2", pid=1, threads=1, python="3.11.7", torch="2.4.0"),
        1: Inventory(host="gpu1", pid=2, threads=1, python="3.11.7", torch="2.4.0"),
    }
    out = check_environments(inv, cfg.remote.hosts, "refuse")
    assert {e: i.host_index for e, i in out.items()} == {0: 1, 1: 0}
    assert inv[0].host_index is None  # the inventory given is left as it was
    table = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in table] == ["host", "gpu1", "gpu2"]
    odd = {**inv, 1: dataclasses.replace(inv[1], torch="2.3.1")}
    with pytest.raises(UsageError, match=r"torch 2.3.1 on gpu1 \(2.4.0 on gpu2\)"):
        check_environments(odd, cfg.remote.hosts, "refuse")


# -- attaching: who holds which rank -------------------------------------------------------------
class _Answer:
    def __init__(self, value):
        self.value = value

    def wait(self, timeout=None):
        pass

    def ready(self):
        return True

    def get(self, timeout=None):
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


class _Client:
    """Engines that answer ``identity`` as given (an exception: the engine failed)."""

    def __init__(self, answers: dict):
        self.answers = answers
        self.ids = sorted(answers)
        self.asked = []

    def __getitem__(self, eid):
        client = self

        class View:
            def apply_async(self, fn, *args):
                client.asked.append(fn.__qualname__)
                return _Answer(client.answers[eid])

        return View()


def _who(rank: int, pid: int, attempt: int = 2, formed: bool = True, world: int = 2):
    info = RankInfo(
        rank=rank,
        world_size=world,
        local_rank=rank,
        local_world_size=world,
        group_rank=0,
        master_addr="127.0.0.1",
        master_port=1,
        backend="gloo",
        device="cpu",
        attempt=attempt,
    )
    return EngineIdentity(pid=pid, host="here", info=info, formed=formed)


def test_attach_finds_each_ranks_engine_by_asking_the_engines():
    client = _Client(
        {
            3: _who(1, 31),
            4: _who(0, 41),
            5: RuntimeError("gone"),
            6: EngineIdentity(pid=61, host="here", info=None, formed=False),
        }
    )
    slots, attempt, formed = attach._slots_from_engines(client, 2, timeout=1)
    assert [(s.rank, s.engine_id, s.pid, s.host) for s in slots] == [
        (0, 4, 41, "here"),
        (1, 3, 31, "here"),
    ]
    assert (attempt, formed) == (2, True)
    assert set(client.asked) == {"identity"}  # nbdist.worker.api.identity, nothing else


def test_attach_sees_a_group_to_re_form_and_refuses_ranks_held_twice():
    _, attempt, formed = attach._slots_from_engines(
        _Client({1: _who(0, 1, attempt=3), 2: _who(1, 2, attempt=2)}), 2, timeout=1
    )
    assert (attempt, formed) == (3, False)
    with pytest.raises(NbdistError, match=r"do not hold ranks 0..1 one each \(they hold \[0\]\)"):
        attach._slots_from_engines(_Client({1: _who(0, 1), 2: _who(0, 2)}), 2, timeout=1)
