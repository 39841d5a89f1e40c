"""The sidebar's server against what goes wrong: a data folder that is not the user's, bad ids and
bodies on every route, Jupyter's authorizer saying no, and cluster actions that take their time.

A real Jupyter server (pytest-jupyter) with nbdist loaded; real folders, owned and moded as a
user would find them (the tests run as root, so "another user" is ``nobody``, and a folder the
user cannot write is tried from a process running as ``nobody``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from jupyter_server.auth.authorizer import Authorizer
from test_server import fetch_error, fetch_json

import nbdist
from nbdist import datadir
from nbdist.errors import UsageError
from nbdist.records import limits
from nbdist.server import clusters, handlers
from nbdist.telemetry.store import RunStore

#: (action, resource) pairs the test authorizer refuses; tests set it, the fixture clears it.
DENIED: set[tuple[str, str]] = set()


class Gate(Authorizer):
    """Jupyter's authorizer, as a deployment might configure it: some resources refused."""

    def is_authorized(self, handler, user, action, resource):
        return (action, resource) not in DENIED and ("*", resource) not in DENIED


@pytest.fixture
def jp_server_config(data_dir):
    DENIED.clear()
    yield {"ServerApp": {"jpserver_extensions": {"nbdist": True}, "authorizer_class": Gate}}
    DENIED.clear()


def nobody() -> tuple[int, int]:
    import pwd

    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")
    return entry.pw_uid, entry.pw_gid


def foreign_folder(path: Path) -> Path:
    """``path``, made and given to another user (mode 0700, as that user would keep it)."""
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    path.mkdir(mode=0o700)
    os.chown(path, *nobody())
    return path


def snapshot(path: Path) -> tuple[int, int, list[str]]:
    st = path.stat()
    return st.st_mode, st.st_uid, sorted(os.listdir(path))


ROUTES = [  # (method, path parts, body): every verb of every route
    ("GET", ("clusters",), None),
    ("POST", ("clusters",), json.dumps({"n": 1})),
    ("DELETE", ("clusters", "nbdist-x"), None),
    ("GET", ("runs",), None),
    ("GET", ("runs", "1"), None),
    ("GET", ("runs", "1", "metrics"), None),
    ("GET", ("runs", "1", "health"), None),
    ("GET", ("runs", "1", "events"), None),
    ("GET", ("runs", "1", "curves"), None),
    ("GET", ("runs", "1", "health", "history"), None),
]


# -- the data folder ------------------------------------------------------------------------------


def test_a_folder_of_another_user_is_refused_and_left_alone(tmp_path, monkeypatch):
    folder = foreign_folder(tmp_path / "theirs")
    monkeypatch.setenv("NBDIST_DATA_DIR", str(folder))
    before = snapshot(folder)
    for call in (datadir.ensure, datadir.check, lambda: nbdist.start(n=1)):
        with pytest.raises(UsageError) as e:
            call()
        line = str(e.value)
        assert "\n" not in line and str(folder) in line
        assert "belongs to another user" in line and "set NBDIST_DATA_DIR" in line
    assert snapshot(folder) == before  # not chmod'ed, nothing made in it


def test_a_folder_others_can_write_is_refused_not_chmoded(tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    monkeypatch.setenv("NBDIST_DATA_DIR", str(folder))
    with pytest.raises(UsageError, match=r"can be written by other users \(mode 777\): chmod go-w"):
        datadir.ensure()
    assert snapshot(folder) == (0o40777, os.geteuid(), [])


def test_a_missing_folder_is_made_private_and_an_existing_ones_mode_is_kept(tmp_path):
    made = datadir.ensure(tmp_path / "a" / "b")
    assert made.stat().st_mode & 0o777 == 0o700
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o750)
    os.chmod(mine, 0o750)
    datadir.ensure(mine)
    datadir.private_dir(mine / "profile")
    assert mine.stat().st_mode & 0o777 == 0o750  # the user's folder, the user's mode
    assert (mine / "profile").stat().st_mode & 0o777 == 0o700  # nbdist's own


UNWRITABLE = """
import os, sys
from nbdist import datadir
from nbdist.errors import UsageError
try:
    datadir.ensure()
except UsageError as e:
    print("UsageError:", e)
"""


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_a_folder_the_user_cannot_write_is_one_line(tmp_path):
    """Run as ``nobody`` (root writes anywhere): its own folder, mode 0500, and root's folder.
    The process may read and search everything (CAP_DAC_READ_SEARCH), so Python starts; it
    still cannot write."""
    uid, gid = nobody()
    own = tmp_path / "own"
    own.mkdir()
    os.chown(own, uid, gid)
    os.chmod(own, 0o500)
    roots = tmp_path / "roots"
    roots.mkdir(mode=0o755)
    os.chmod(roots, 0o755)
    root = str(Path(nbdist.__file__).parents[1])
    for folder, words in [(own, "is not writable by you (mode 500)"), (roots, "another user")]:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "PYTHONPATH": root,
            "PYTHONDONTWRITEBYTECODE": "1",
            "NBDIST_DATA_DIR": str(folder),
        }
        cmd = [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={gid}",
            "--clear-groups",
            "--inh-caps=+dac_read_search",
            "--ambient-caps=+dac_read_search",
            sys.executable,
            "-c",
            UNWRITABLE,
        ]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        if p.returncode != 0 and "setpriv" in p.stderr:
            pytest.skip(f"setpriv cannot drop to nobody here: {p.stderr.strip()}")
        assert p.returncode == 0, p.stderr
        [line] = p.stdout.splitlines()
        assert line.startswith("UsageError: nbdist's data folder") and words in line, line
        assert str(folder) in line


async def test_every_endpoint_says_503_in_one_line_on_a_foreign_folder(
    jp_fetch, tmp_path, monkeypatch
):
    folder = foreign_folder(tmp_path / "theirs")
    monkeypatch.setenv("NBDIST_DATA_DIR", str(folder))
    before = snapshot(folder)
    for method, parts, body in ROUTES:
        for _ in range(2):  # every poll, the same clear answer
            code, message = await fetch_error(jp_fetch, *parts, method=method, body=body)
            assert code == 503, (method, parts, code, message)
            assert "belongs to another user" in message and "\n" not in message
    assert snapshot(folder) == before


async def test_gets_write_nothing(jp_fetch, data_dir):
    for method, parts, _ in ROUTES:
        if method == "GET":
            await jp_fetch("nbdist", "api", *parts, raise_error=False)
    assert not data_dir.exists()  # not made, and so nothing in it
    data_dir.mkdir(mode=0o700)
    for method, parts, _ in ROUTES:
        if method == "GET":
            await jp_fetch("nbdist", "api", *parts, raise_error=False)
    assert os.listdir(data_dir) == []


async def test_a_damaged_run_store_is_503_not_500(jp_fetch, data_dir):
    datadir.ensure()
    (data_dir / "runs.sqlite").write_bytes(b"this is not a database" * 100)
    code, message = await fetch_error(jp_fetch, "runs")
    assert code == 503 and "the run store" in message and "\n" not in message


# -- bad ids, parameters and bodies, on every route -------------------------------------------


@pytest.mark.parametrize(
    "method,parts,params,body,words",
    [
        ("GET", ("runs", "²"), None, None, "'²' is not a run id"),
        ("GET", ("runs", "²", "metrics"), None, None, "is not a run id"),
        ("GET", ("runs", "²", "health"), None, None, "is not a run id"),
        ("GET", ("runs", "²", "events"), None, None, "is not a run id"),
        ("GET", ("runs", "9" * 40), None, None, "is not a run id"),
        ("GET", ("runs", "-1"), None, None, "is not a run id"),
        ("GET", ("runs",), {"limit": "²"}, None, "limit must be a whole number"),
        ("GET", ("runs",), {"limit": "9" * 400}, None, "limit must be a whole number"),
        ("GET", ("runs", "1", "metrics"), {"since_id": "²"}, None, "since_id must be"),
        ("GET", ("runs", "1", "metrics"), {"limit": "10001"}, None, "from 1 to 10000"),
        ("GET", ("runs", "1", "events"), {"limit": "1001"}, None, "from 1 to 1000"),
        ("GET", ("runs", "1", "events"), {"since_id": "-1"}, None, "since_id must be"),
        ("GET", ("runs", "1", "metrics"), {"since_id": "9" * 19}, None, "to 9223372036854775807"),
        ("GET", ("runs", "²", "curves"), None, None, "is not a run id"),
        ("GET", ("runs", "²", "health", "history"), None, None, "is not a run id"),
        ("GET", ("runs", "1", "curves"), {"points": "1"}, None, "points must be"),
        ("GET", ("runs", "1", "curves"), {"points": "2001"}, None, "from 2 to 2000"),
        ("GET", ("runs", "1", "curves"), {"points": "9" * 400}, None, "points must be"),
        ("GET", ("runs", "1", "curves"), {"ranks": "yes"}, None, "ranks must be"),
        ("GET", ("runs", "1", "curves"), {"metrics": ",".join("m" * 51)}, None, "at most 50"),
        ("GET", ("runs", "1", "curves"), {"metrics": "x" * 201}, None, "at most 200 char"),
        ("GET", ("runs", "1", "health", "history"), {"points": "0"}, None, "points must be"),
        ("POST", ("clusters",), None, json.dumps({"n": "²"}), "not '²'"),
        ("POST", ("clusters",), None, json.dumps({"n": "1" * 5000}), "whole number from 1 to"),
        ("POST", ("clusters",), None, json.dumps({"n": -3}), "not -3"),
        ("POST", ("clusters",), None, json.dumps({"n": [2]}), "not [2]"),
        ("POST", ("clusters",), None, json.dumps({"n": None}), "not None"),
        ("POST", ("clusters",), None, '{"n": NaN}', "not nan"),
        ("POST", ("clusters",), None, "[" * 100_000, "the body must be JSON"),
        ("POST", ("clusters",), None, b"\xff\xfe\x00", "the body must be JSON"),
        ("POST", ("clusters",), None, json.dumps([1, 2]), "say how many engines"),
        ("DELETE", ("clusters", "²"), None, None, "'²' is not a cluster id"),
        ("DELETE", ("clusters", "x" * 500), None, None, "is not a cluster id"),
    ],
)
async def test_bad_input_is_400_in_one_line(jp_fetch, data_dir, method, parts, params, body, words):
    code, message = await fetch_error(jp_fetch, *parts, method=method, params=params, body=body)
    assert code == 400 and words in message, (code, message)
    assert "\n" not in message and len(message) < 300


async def test_the_engine_limit_is_this_machines(jp_fetch, data_dir):
    high = limits.max_engines()
    assert high == max(8, 4 * len(os.sched_getaffinity(0)))
    code, message = await fetch_error(
        jp_fetch, "clusters", method="POST", body=json.dumps({"n": high + 1})
    )
    assert code == 400 and f"from 1 to {high} (this machine's CPUs x 4, at least 8)" in message


# -- authorization -------------------------------------------------------------------------------


def test_every_handler_verb_checks_authorization():
    """Under @tornado.web.authenticated, each verb is wrapped by jupyter_server's @authorized
    and names its resource."""
    from jupyter_server.auth import decorator

    for _path, cls in handlers.ROUTES:
        assert cls.auth_resource in (handlers.CLUSTERS_RESOURCE, handlers.RUNS_RESOURCE)
        for verb in ("get", "post", "delete", "put", "patch"):
            fn = cls.__dict__.get(verb)
            if fn is not None:
                inner = fn.__wrapped__
                assert inner.__code__.co_filename == decorator.__file__, (cls, verb)


async def test_without_a_token_even_a_verb_a_route_lacks_is_403(jp_fetch, data_dir):
    anon = {"Authorization": ""}
    for method, parts in [("GET", ("clusters", "x")), ("PUT", ("runs",)), ("DELETE", ("runs",))]:
        body = "{}" if method == "PUT" else None
        code, _ = await fetch_error(jp_fetch, *parts, method=method, body=body, headers=anon)
        assert code == 403, (method, parts, code)
    code, _ = await fetch_error(jp_fetch, "clusters", "x", method="GET")  # with the token
    assert code == 405


async def test_the_authorizer_decides_per_resource_and_action(jp_fetch, data_dir):
    DENIED.add(("*", handlers.CLUSTERS_RESOURCE))
    for method, parts, body in ROUTES:
        if parts[0] == "clusters":
            code, message = await fetch_error(jp_fetch, *parts, method=method, body=body)
            assert code == 403 and "not authorized" in message, (method, parts)
    code, data = await fetch_json(jp_fetch, "runs")
    assert (code, data["runs"], data["total"]) == (200, [], 0)

    DENIED.clear()
    DENIED.add(("execute", handlers.CLUSTERS_RESOURCE))  # may look, may not start
    assert (await fetch_json(jp_fetch, "clusters"))[0] == 200
    code, _ = await fetch_error(jp_fetch, "clusters", method="POST", body='{"n": 1}')
    assert code == 403
    assert not clusters.Clusters().list()  # nothing was started

    DENIED.add(("read", handlers.RUNS_RESOURCE))
    code, _ = await fetch_error(jp_fetch, "runs", "1", "metrics")
    assert code == 403


# -- the event loop stays free ----------------------------------------------------------------


async def test_a_slow_cluster_listing_holds_up_no_other_request(jp_fetch, data_dir, monkeypatch):
    """Listing reads records and processes (and a start spawns one): on a thread of its own."""
    entered, release = threading.Event(), threading.Event()
    real = clusters.Clusters.list

    def slow_list(self):
        entered.set()
        assert release.wait(30), "the test never let the listing go on"
        return real(self)

    monkeypatch.setattr(clusters.Clusters, "list", slow_list)
    pending = asyncio.ensure_future(fetch_json(jp_fetch, "clusters"))
    try:
        deadline = time.monotonic() + 30
        while not entered.is_set():
            assert time.monotonic() < deadline, "the listing never started"
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        code, data = await fetch_json(jp_fetch, "runs")
        assert (code, data["runs"], data["total"]) == (200, [], 0)
        assert time.monotonic() - t0 < 5 and not pending.done()
    finally:
        release.set()
    assert await pending == (200, {"clusters": []})


async def test_store_reads_run_off_the_loop_while_a_writer_holds_the_lock(jp_fetch, data_dir):
    """A connection holding the store so that readers wait (their busy timeout is 10 s) never
    stalls the server: other requests are answered meanwhile, and the read ends once it can."""
    store = RunStore()
    rid = store.start_run(name="locked", world_size=1)
    store.close()
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")  # WAL readers wait on this one
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("UPDATE runs SET name = name")
    try:
        pending = asyncio.ensure_future(fetch_json(jp_fetch, "runs", str(rid)))
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        code, _ = await fetch_error(jp_fetch, "clusters", "nope", method="DELETE")
        assert code == 404 and time.monotonic() - t0 < 5  # answered while the read waits
        assert not pending.done()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    code, data = await pending
    assert code == 200 and data["run"]["name"] == "locked"
