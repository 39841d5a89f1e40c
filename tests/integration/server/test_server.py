"""The sidebar's endpoints, against a real Jupyter server (pytest-jupyter) with nbdist loaded.

Every endpoint is called with the token and without it; bad input gets a 4xx with a one-line
message; the start and stop actions start and stop a real cluster host and its engines.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time

import psutil
import pytest
import tornado.web
from processes import assert_gone
from tornado.httpclient import HTTPClientError

from nbdist.records import registry
from nbdist.records.limits import max_engines
from nbdist.server import handlers
from nbdist.telemetry.store import RunStore

API = ("nbdist", "api")
VERBS = ("get", "head", "post", "put", "patch", "delete", "options")


@pytest.fixture
def store(data_dir):
    """A run store with two runs written through its writer API: one live, one finished."""
    s = RunStore()
    done = s.start_run(name="warmup", world_size=2, total=10, cluster_id="nbdist-x")
    now = time.time()
    s.add_metrics(
        done, [{"time": now, "rank": r, "step": 10, "loss": 0.5, "samples": 64} for r in (0, 1)]
    )
    s.update_run(done, step=10, loss=0.5, samples_per_s=1234.0)
    s.end_run(done, "ok")
    live = s.start_run(name="<b>train</b>", world_size=2, total=100, cluster_id="nbdist-x")
    s.add_metrics(
        live,
        [
            {"time": now + i, "rank": 0, "step": i, "loss": 1.0 / (i + 1), "samples": 32}
            for i in range(5)
        ],
    )
    s.put_health(
        live,
        [
            {
                "rank": 0,
                "time": now,
                "host": "node<1>",
                "state": "ok",
                "cpu": 97.0,
                "mesh": "dp 0/2",
            },
            {"rank": 1, "time": now, "host": "node<1>", "state": "dead", "mesh": "dp 1/2"},
        ],
    )
    s.add_event(live, "died", rank=1, message="engine process killed by SIGKILL")
    s.update_run(live, step=4, loss=0.2)
    yield {"done": done, "live": live}
    s.close()


async def fetch_json(jp_fetch, *parts, **kw):
    r = await jp_fetch(*API, *parts, **kw)
    return r.code, json.loads(r.body)


async def fetch_error(jp_fetch, *parts, **kw) -> tuple[int, str]:
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch(*API, *parts, **kw)
    body = e.value.response.body if e.value.response is not None else b"{}"
    return e.value.code, json.loads(body or b"{}").get("message", "")


# -- authentication ---------------------------------------------------------------------------


def test_every_handler_verb_requires_authentication():
    """Fails when someone adds a handler, or a verb, without @tornado.web.authenticated (the
    @authorized beneath it: test_server_hardening)."""
    checked = 0
    for _path, cls in handlers.ROUTES:
        for verb in VERBS:
            fn = cls.__dict__.get(verb)
            if fn is None:
                continue
            checked += 1
            wrapped = getattr(fn, "__wrapped__", None)
            assert wrapped is not None and fn.__code__.co_filename == tornado.web.__file__, (
                f"{cls.__name__}.{verb} lacks @tornado.web.authenticated"
            )
    assert checked >= len(handlers.ROUTES)


async def test_requests_without_a_token_are_refused(jp_fetch, store):
    anon = {"Authorization": ""}
    run = str(store["live"])
    for parts, method, body in [
        (("clusters",), "GET", None),
        (("clusters",), "POST", json.dumps({"n": 1})),
        (("clusters", "nbdist-x"), "DELETE", None),
        (("runs",), "GET", None),
        (("runs", run), "GET", None),
        (("runs", run, "metrics"), "GET", None),
        (("runs", run, "health"), "GET", None),
        (("runs", run, "events"), "GET", None),
        (("runs", run, "curves"), "GET", None),
        (("runs", run, "health", "history"), "GET", None),
    ]:
        code, _ = await fetch_error(jp_fetch, *parts, method=method, body=body, headers=anon)
        assert code == 403, (parts, method)
    assert not registry.live()  # the refused POST started nothing


# -- runs ---------------------------------------------------------------------------------------


async def test_runs_list_newest_first(jp_fetch, store):
    code, data = await fetch_json(jp_fetch, "runs")
    assert code == 200
    assert [r["id"] for r in data["runs"]] == [store["live"], store["done"]]
    live, done = data["runs"]
    assert (live["status"], live["step"], live["name"]) == ("running", 4, "<b>train</b>")
    assert (done["status"], done["loss"], done["samples_per_s"]) == ("ok", 0.5, 1234.0)
    _, data = await fetch_json(jp_fetch, "runs", params={"limit": 1})
    assert [r["id"] for r in data["runs"]] == [store["live"]]


async def test_run_detail_metrics_health_events(jp_fetch, store):
    rid = str(store["live"])
    _, data = await fetch_json(jp_fetch, "runs", rid)
    assert data["run"]["id"] == store["live"] and data["run"]["total"] == 100

    _, data = await fetch_json(jp_fetch, "runs", rid, "metrics")
    assert [m["step"] for m in data["metrics"]] == [0, 1, 2, 3, 4]
    assert data["last_id"] == data["metrics"][-1]["id"]
    since = data["metrics"][2]["id"]
    _, data = await fetch_json(jp_fetch, "runs", rid, "metrics", params={"since_id": since})
    assert [m["step"] for m in data["metrics"]] == [3, 4]
    _, data = await fetch_json(jp_fetch, "runs", rid, "metrics", params={"since_id": 10**9})
    assert data == {"metrics": [], "last_id": 10**9, "next": None}
    _, data = await fetch_json(jp_fetch, "runs", rid, "metrics", params={"limit": 2})
    assert [m["step"] for m in data["metrics"]] == [0, 1]  # a page; the next after last_id
    assert data["next"] == data["last_id"]
    _, data = await fetch_json(
        jp_fetch, "runs", rid, "metrics", params={"since_id": data["next"], "limit": 2}
    )
    assert [m["step"] for m in data["metrics"]] == [2, 3] and data["next"] is not None
    _, data = await fetch_json(
        jp_fetch, "runs", rid, "metrics", params={"since_id": data["next"], "limit": 2}
    )
    assert [m["step"] for m in data["metrics"]] == [4] and data["next"] is None  # the last page

    _, data = await fetch_json(jp_fetch, "runs", rid, "health")
    assert [(w["rank"], w["state"], w["host"], w["mesh"]) for w in data["workers"]] == [
        (0, "ok", "node<1>", "dp 0/2"),
        (1, "dead", "node<1>", "dp 1/2"),
    ]

    _, data = await fetch_json(jp_fetch, "runs", rid, "events")
    assert [(e["kind"], e["rank"]) for e in data["events"]] == [("died", 1)]
    assert data["total"] == 1 and data["next"] is None


async def test_store_reads_leave_the_server_free(jp_fetch, store, monkeypatch):
    """The sidebar polls a live run four times a second: a read that waits (on the kernel's
    writer, on a slow disk) runs on a reader thread and holds up no other request."""
    entered, release = threading.Event(), threading.Event()
    real = RunStore.health

    def waiting_health(self, run_id):
        entered.set()
        assert release.wait(30), "the test never let the read go on"
        return real(self, run_id)

    monkeypatch.setattr(RunStore, "health", waiting_health)
    pending = asyncio.ensure_future(fetch_json(jp_fetch, "runs", str(store["live"]), "health"))
    try:
        deadline = time.monotonic() + 30
        while not entered.is_set():
            assert time.monotonic() < deadline, "the health read never started"
            await asyncio.sleep(0.01)
        code, data = await fetch_json(jp_fetch, "runs")  # answered while health still waits
        assert code == 200 and len(data["runs"]) == 2 and not pending.done()
    finally:
        release.set()
    code, data = await pending
    assert code == 200 and [w["state"] for w in data["workers"]] == ["ok", "dead"]


async def test_runs_when_no_store_exists_yet(jp_fetch, data_dir):
    code, data = await fetch_json(jp_fetch, "runs")
    assert (code, data["runs"], data["total"], data["metrics"]) == (200, [], 0, [])


@pytest.mark.parametrize(
    "parts,params,status,words",
    [
        (("runs", "999"), None, 404, "no run '999'"),
        (("runs", "abc", "health"), None, 400, "'abc' is not a run id: run ids are the numbers"),
        (("runs", "999", "metrics"), None, 404, "no run"),
        (("runs",), {"limit": "lots"}, 400, "limit must be a whole number"),
        (("runs",), {"limit": "0"}, 400, "from 1 to 1000"),
    ],
)
async def test_runs_bad_input(jp_fetch, store, parts, params, status, words):
    code, message = await fetch_error(jp_fetch, *parts, params=params)
    assert code == status and words in message and "\n" not in message


async def test_metrics_bad_since_id(jp_fetch, store):
    code, message = await fetch_error(
        jp_fetch, "runs", str(store["live"]), "metrics", params={"since_id": "x"}
    )
    assert code == 400 and "since_id must be a whole number" in message


# -- clusters -----------------------------------------------------------------------------------


async def test_no_clusters_yet(jp_fetch, data_dir):
    assert await fetch_json(jp_fetch, "clusters") == (200, {"clusters": []})


@pytest.mark.parametrize(
    "body,words",
    [
        ({"n": "two"}, f"whole number from 1 to {max_engines()} (this machine's CPUs x 4"),
        ({"n": 0}, "not 0"),
        ({"n": 1.5}, "not 1.5"),
        ({"n": True}, "not True"),
        ({"n": 1000}, "not 1000"),
        ({}, 'say how many engines to start: {"n": 2}'),
        ("not json", "the body must be JSON"),
    ],
)
async def test_start_bad_engine_count(jp_fetch, data_dir, body, words):
    raw = body if isinstance(body, str) else json.dumps(body)
    code, message = await fetch_error(jp_fetch, "clusters", method="POST", body=raw)
    assert code == 400 and words in message
    assert not registry.live()


async def test_stop_unknown_cluster(jp_fetch, data_dir):
    code, message = await fetch_error(jp_fetch, "clusters", "nbdist-nope", method="DELETE")
    assert code == 404 and "no running cluster 'nbdist-nope'" in message


async def poll(predicate, timeout: float, what: str):
    """``wait_until`` for coroutines: the server runs on this thread's event loop."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.1)


async def test_start_and_stop_a_cluster(jp_fetch, data_dir):
    t0 = time.monotonic()
    code, started = await fetch_json(jp_fetch, "clusters", method="POST", body='{"n": 1}')
    assert code == 202 and started["state"] == "starting"
    assert time.monotonic() - t0 < 2.0  # the server does not wait for engines
    host = started["pid"]
    try:

        async def running():
            _, data = await fetch_json(jp_fetch, "clusters")
            ready = [c for c in data["clusters"] if c["state"] == "running"]
            return ready[0] if ready else None

        c = await poll(running, 90, "the cluster to run")
        assert (c["owner"], c["pid"], c["n"], c["backend"]) == ("sidebar", host, 1, "gloo")
        assert [(e["rank"], e["alive"]) for e in c["engines"]] == [(0, True)]
        rec = registry.read_all()[0]
        assert os.stat(registry.record_path(host)).st_mode & 0o777 == 0o600
        assert rec.cluster_id == c["cluster_id"] and rec.slots[0].pid > 0
        pids = [host, rec.slots[0].pid] + [
            p.pid for p in psutil.Process(host).children(recursive=True)
        ]

        code, stopping = await fetch_json(jp_fetch, "clusters", c["cluster_id"], method="DELETE")
        assert code == 202 and stopping["state"] == "stopping"

        async def gone():
            _, data = await fetch_json(jp_fetch, "clusters")
            return not data["clusters"]

        await poll(gone, 30, "the cluster to leave the list")
        assert_gone(pids, timeout=30)
        assert not registry.read_all()
    finally:
        if registry.host_alive(host):
            os.kill(host, 15)
            assert_gone([host], timeout=30)


async def test_a_kernels_cluster_is_listed_and_not_stopped_from_here(jp_fetch, data_dir):
    """A cluster a notebook kernel owns (here: this process) shows with its engines; the sidebar
    does not stop it."""
    import nbdist

    c = nbdist.start(n=1)
    try:
        _, data = await fetch_json(jp_fetch, "clusters")
        [entry] = data["clusters"]
        assert (entry["cluster_id"], entry["owner"]) == (c.engines.cluster_id, "kernel")
        assert [e["pid"] for e in entry["engines"] if e["alive"]] == [c.slots[0].pid]
        code, message = await fetch_error(
            jp_fetch, "clusters", c.engines.cluster_id, method="DELETE"
        )
        assert code == 409 and "%nbdist stop" in message
        assert c.client.ids  # still running
    finally:
        pids = [p.pid for p in c.engines.processes()]
        c.stop()
        assert_gone(pids)


def test_host_reports_a_failed_start(data_dir):
    """The host exits non-zero with a one-line reason when the cluster cannot start."""
    import subprocess

    p = subprocess.run(
        [sys.executable, "-m", "nbdist.host", "--n", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1
    assert "whole number >= 1" in p.stderr.strip().splitlines()[-1]
    assert not registry.read_all()
