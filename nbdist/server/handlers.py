"""The sidebar's endpoints, under ``/nbdist/api/``; every verb requires Jupyter's authentication.

    GET    clusters                       clusters on this machine and their engines
    POST   clusters            {"n": N}   start a local cluster of N engines (202, at once)
    DELETE clusters/ID                    stop a cluster started from the sidebar (202)
    GET    runs?limit=N                   the latest runs, newest first
    GET    runs/ID                        one run, with its options, source and failures
    GET    runs/ID/metrics?since_id=K     its metric rows after row K (the sidebar polls this)
    GET    runs/ID/health                 each rank's latest health: ok, slow, silent or dead
    GET    runs/ID/events                 its events, oldest first

Errors are JSON ``{"message": ...}``, one line that names the problem and the fix.

The run store is read on a small pool of threads (``_READERS``), never on the server's event
loop: while a run is live the sidebar polls its health and metrics four times a second, and a
read that waits on the kernel's writer must not hold up every other request of the server.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado.ioloop import IOLoop

from ..telemetry.store import RunStore
from .clusters import ClusterError, Clusters, parse_count

_SETTINGS_KEY = "nbdist"
_READERS: ThreadPoolExecutor | None = None  # the run store's readers, one pool per process


def _readers() -> ThreadPoolExecutor:
    global _READERS
    if _READERS is None:
        _READERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="nbdist-store")
    return _READERS


class _Base(APIHandler):
    @property
    def clusters(self) -> Clusters:
        return self.settings[_SETTINGS_KEY]["clusters"]

    @property
    def store(self) -> RunStore:
        state = self.settings[_SETTINGS_KEY]
        if state.get("store") is None:
            state["store"] = RunStore()
        return state["store"]

    def _int_arg(self, name: str, default: int, low: int, high: int) -> int:
        raw = self.get_query_argument(name, str(default))
        try:
            value = int(raw)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise tornado.web.HTTPError(
                400, f"{name} must be a whole number from {low} to {high}, not {raw!r}"
            )
        return value

    async def _read(self, read: Callable[..., Any], *args: Any) -> Any:
        """``read(store, *args)`` on a reader thread (an HTTPError it raises reaches tornado)."""
        return await IOLoop.current().run_in_executor(_readers(), read, self.store, *args)

    def _send(self, data: dict, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))


class ClustersHandler(_Base):
    @tornado.web.authenticated
    def get(self) -> None:
        self._send({"clusters": self.clusters.list()})

    @tornado.web.authenticated
    def post(self) -> None:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            raise tornado.web.HTTPError(400, 'the body must be JSON like {"n": 2}') from None
        if not isinstance(body, dict) or "n" not in body:
            raise tornado.web.HTTPError(400, 'say how many engines to start: {"n": 2}')
        try:
            n = parse_count(body["n"])
        except ClusterError as e:
            raise tornado.web.HTTPError(e.status, str(e)) from None
        self._send(self.clusters.start(n), status=202)


class ClusterHandler(_Base):
    @tornado.web.authenticated
    def delete(self, cluster_id: str) -> None:
        try:
            self._send(self.clusters.stop(cluster_id), status=202)
        except ClusterError as e:
            raise tornado.web.HTTPError(e.status, str(e)) from None


class RunsHandler(_Base):
    @tornado.web.authenticated
    async def get(self) -> None:
        limit = self._int_arg("limit", 100, 1, 1000)
        self._send({"runs": await self._read(RunStore.list_runs, limit)})


class RunHandler(_Base):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        self._send({"run": await self._read(_run, run_id)})


class MetricsHandler(_Base):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        since = self._int_arg("since_id", 0, 0, 2**62)
        rows = await self._read(lambda store: store.metrics(_run(store, run_id)["id"], since))
        self._send({"metrics": rows, "last_id": rows[-1]["id"] if rows else since})


class HealthHandler(_Base):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        workers = await self._read(lambda store: store.health(_run(store, run_id)["id"]))
        self._send({"workers": workers})


class EventsHandler(_Base):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        events = await self._read(lambda store: store.events(_run(store, run_id)["id"]))
        self._send({"events": events})


def _run(store: RunStore, run_id: str) -> dict:
    """The run ``run_id`` or a 404 that says what a run id looks like."""
    run = store.get_run(int(run_id)) if run_id.isdigit() else None
    if run is None:
        raise tornado.web.HTTPError(
            404, f"no run {run_id!r}: run ids are the numbers GET /nbdist/api/runs lists"
        )
    return run


_ID = r"(?P<{}>[^/]+)"

#: (path under /nbdist/api/, handler): the whole API, for setup_routes and the tests.
ROUTES = [
    ("clusters", ClustersHandler),
    ("clusters/" + _ID.format("cluster_id"), ClusterHandler),
    ("runs", RunsHandler),
    ("runs/" + _ID.format("run_id"), RunHandler),
    ("runs/" + _ID.format("run_id") + "/metrics", MetricsHandler),
    ("runs/" + _ID.format("run_id") + "/health", HealthHandler),
    ("runs/" + _ID.format("run_id") + "/events", EventsHandler),
]


def setup_routes(web_app) -> None:
    """Register nbdist's endpoints on the Jupyter server's tornado application."""
    web_app.settings.setdefault(_SETTINGS_KEY, {"clusters": Clusters(), "store": None})
    base = url_path_join(web_app.settings["base_url"], "nbdist", "api")
    web_app.add_handlers(
        ".*$", [(url_path_join(base, path) + "/?$", handler) for path, handler in ROUTES]
    )
