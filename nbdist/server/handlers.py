"""The sidebar's endpoints, under ``/nbdist/api/``; every verb requires Jupyter's authentication
and its authorization (``@authorized``, on resource ``nbdist.clusters`` or ``nbdist.runs``).

    GET    clusters                       clusters on this machine and their engines
    POST   clusters            {"n": N}   start a local cluster of N engines (202, at once)
    DELETE clusters/ID                    stop a cluster started from the sidebar (202)
    GET    runs?offset=K&limit=N&q=TEXT&status=a,b&sort=KEY&order=asc|desc&all=0|1
                                          a page of the runs (N <= 1000, 100 by default),
                                          newest first: ``q`` a part of the name (any case),
                                          ``status`` any of these, ``sort`` time, duration,
                                          name, status, step or a summary metric (``loss``,
                                          ``min:loss``), ``all=1`` the session's other cells
                                          too (``telemetry.listing``); ``total``: every run
                                          found, ``metrics``: what runs can be sorted by
    GET    runs/ID                        one run, with its options, source and failures
    GET    runs/ID/metrics?since_id=K&limit=N  its metric rows after row K, at most N (1,000;
                                          up to 10,000); ``next``: the since_id of the next
                                          page (null: none yet), ``last_id``: where to poll on
    GET    runs/ID/health                 each rank's latest health (``telemetry.events.STATES``)
    GET    runs/ID/events?since_id=K&limit=N  its events, oldest first: after K (paged as
                                          metrics), or the latest N (at most 1,000); ``total``
    GET    runs/ID/curves?points=N&ranks=0|1&metrics=a,b
                                          every metric's curve: the mean over ranks (and each
                                          rank's, ranks=1), at most N points a line (N <= 2000)
    GET    runs/ID/health/history?points=N  each rank's health measures over time, its states
                                          (N <= 2000 a line; a wide run's lines share a budget)

Errors are JSON ``{"message": ...}``, one line that names the problem and the fix: 400 for a bad
id, parameter or body, 404 for what is not there, 503 when nbdist's data folder or run store
cannot be used (``datadir``: someone else's folder, one you cannot write, a damaged store).
A GET writes nothing.

The curves are folded once per run and kept (``curves.SeriesCache``): polling a live run reads
only its new rows, and the first read of a long one reads a bounded number of rows at a time
(``complete: false`` until it has caught up). No answer grows with a run's length: raw rows go
out in pages (``pages``), curves decimated. Answers are strict JSON: a number that is not finite
is null (the store keeps them out; ``pages.encode``).

Nothing blocks the server's event loop: the run store is read on a small pool of threads
(``nbdist-store``; while a run is live the sidebar polls its health and curves four times a second,
and a read that waits on the kernel's writer must not hold up every other request), and the
cluster actions (listing reads files and processes; starting spawns one) run on a thread of
their own (``nbdist-clusters``), one at a time (``Clusters`` keeps state). A run's answer is
encoded to JSON on the reader thread too: the event loop only sends the text.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado.ioloop import IOLoop

from ..errors import UsageError, trim_repr
from ..records.limits import parse_count
from ..telemetry.listing import RunQuery
from ..telemetry.series import MAX_METRICS
from ..telemetry.store import RunStore
from . import pages
from .clusters import ClusterError, Clusters
from .curves import MAX_POINTS, SeriesCache

#: ``auth_resource`` of the handlers, for Jupyter's authorizer (actions: read, write, execute).
CLUSTERS_RESOURCE = "nbdist.clusters"
RUNS_RESOURCE = "nbdist.runs"

_SETTINGS_KEY = "nbdist"
_POOLS: dict[str, ThreadPoolExecutor] = {}  # one of each per process, made on first use
_RUN_ID = re.compile(r"[0-9]{1,18}")
_CLUSTER_ID = re.compile(r"[A-Za-z0-9_.-]{1,100}")
_MAX_NAME = 200  # characters of a metric name asked for
_MAX_ID = 2**63 - 1  # a row id: SQLite's INTEGER
#: What ``GET runs`` takes (and Jupyter's own: a token, a cache-buster, or a bare number).
_RUNS_ARGS = ("offset", "limit", "q", "status", "sort", "order", "all")
_JUPYTER_ARGS = ("token", "_")


def _pool(name: str, workers: int) -> ThreadPoolExecutor:
    if name not in _POOLS:
        _POOLS[name] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
    return _POOLS[name]


class _Base(APIHandler):
    async def prepare(self) -> None:
        """Authentication first, for every request: a verb a route lacks is 403 too, not 405."""
        await super().prepare()
        if self.current_user is None and self.request.method != "OPTIONS":  # CORS preflight
            raise tornado.web.HTTPError(403)

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
        value = int(raw) if re.fullmatch(r"[0-9]{1,19}", raw) else None
        if value is None or not low <= value <= high:
            raise tornado.web.HTTPError(
                400, f"{name} must be a whole number from {low} to {high}, not {trim_repr(raw)}"
            )
        return value

    async def _answer(self, read: Callable[[RunStore], dict]) -> None:
        """Send ``read(store)``, read and encoded as JSON on a reader thread (an HTTPError it
        raises reaches tornado)."""
        store = self.store
        try:
            text = await IOLoop.current().run_in_executor(
                _pool("nbdist-store", 2), lambda: pages.encode(read(store))
            )
        except UsageError as e:  # the data folder
            raise tornado.web.HTTPError(503, str(e)) from None
        except (sqlite3.Error, OSError) as e:
            raise tornado.web.HTTPError(
                503,
                f"the run store {store.path} cannot be read ({type(e).__name__}: "
                f"{_one_line(e)}): try again, or move it aside if it is damaged",
            ) from None
        self.finish(text)

    async def _act(self, action: Callable[..., Any], *args: Any) -> Any:
        """``action(*args)`` (a ``Clusters`` method) on the cluster thread; its refusals as
        HTTP errors."""
        try:
            return await IOLoop.current().run_in_executor(
                _pool("nbdist-clusters", 1), action, *args
            )
        except ClusterError as e:
            raise tornado.web.HTTPError(e.status, str(e)) from None
        except UsageError as e:  # the data folder
            raise tornado.web.HTTPError(503, str(e)) from None
        except OSError as e:
            raise tornado.web.HTTPError(
                503, f"nbdist could not do that ({type(e).__name__}: {_one_line(e)})"
            ) from None

    @property
    def series(self) -> SeriesCache:
        return self.settings[_SETTINGS_KEY]["series"]

    def _names_arg(self) -> list[str] | None:
        """``metrics=a,b``: the metrics to send (None: all of them)."""
        raw = self.get_query_argument("metrics", "")
        names = [n for n in raw.split(",") if n] if raw else []
        if len(names) > MAX_METRICS or any(len(n) > _MAX_NAME for n in names):
            raise tornado.web.HTTPError(
                400,
                f"metrics must be at most {MAX_METRICS} names of at most {_MAX_NAME} characters, "
                f"separated by commas, not {trim_repr(raw)}",
            )
        return names or None

    def _send(self, data: dict, status: int = 200) -> None:
        """Send a small answer (the clusters'), encoded here."""
        self.set_status(status)
        self.finish(pages.encode(data))


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


class ClustersHandler(_Base):
    auth_resource = CLUSTERS_RESOURCE

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        self._send({"clusters": await self._act(self.clusters.list)})

    @tornado.web.authenticated
    @authorized("execute")  # starts processes that will run the notebooks' code
    async def post(self) -> None:
        try:
            body = json.loads(self.request.body or b"{}")
        except (ValueError, RecursionError):
            raise tornado.web.HTTPError(400, 'the body must be JSON like {"n": 2}') from None
        if not isinstance(body, dict) or "n" not in body:
            raise tornado.web.HTTPError(400, 'say how many engines to start: {"n": 2}')
        try:
            n = parse_count(body["n"])
        except UsageError as e:
            raise tornado.web.HTTPError(400, str(e)) from None
        self._send(await self._act(self.clusters.start, n), status=202)


class ClusterHandler(_Base):
    auth_resource = CLUSTERS_RESOURCE

    @tornado.web.authenticated
    @authorized
    async def delete(self, cluster_id: str) -> None:
        if not _CLUSTER_ID.fullmatch(cluster_id):
            raise tornado.web.HTTPError(
                400,
                f"{trim_repr(cluster_id)} is not a cluster id: use one that GET "
                "/nbdist/api/clusters lists",
            )
        self._send(await self._act(self.clusters.stop, cluster_id), status=202)


class RunsHandler(_Base):
    auth_resource = RUNS_RESOURCE

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        query = self._query()
        await self._answer(lambda store: pages.runs_page(store, query))

    def _query(self) -> RunQuery:
        """The page asked for, or a 400 that names what is wrong and what is taken."""
        unknown = sorted(
            k
            for k in set(self.request.query_arguments) - {*_RUNS_ARGS, *_JUPYTER_ARGS}
            if not k.isdigit()  # JupyterLab's cache-buster: ?1795870490515
        )
        if unknown:
            raise tornado.web.HTTPError(
                400, f"runs takes {', '.join(_RUNS_ARGS)}, not {trim_repr(unknown[0])}"
            )
        arg = self.get_query_argument
        try:
            return RunQuery(
                offset=self._int_arg("offset", 0, 0, 2**62),
                limit=self._int_arg("limit", 100, 1, pages.MAX_RUNS),
                name=arg("q", ""),
                status=arg("status", ""),
                sort=arg("sort", "time"),
                order=arg("order", ""),
                all=self._int_arg("all", 0, 0, 1) == 1,
            )
        except UsageError as e:
            raise tornado.web.HTTPError(400, str(e)) from None


class RunHandler(_Base):
    auth_resource = RUNS_RESOURCE

    @tornado.web.authenticated
    @authorized
    async def get(self, run_id: str) -> None:
        rid = _run_id(run_id)
        await self._answer(lambda store: {"run": _run(store, rid)})


class MetricsHandler(_Base):
    auth_resource = RUNS_RESOURCE

    @tornado.web.authenticated
    @authorized
    async def get(self, run_id: str) -> None:
        rid = _run_id(run_id)
        since = self._int_arg("since_id", 0, 0, _MAX_ID)
        limit = self._int_arg("limit", pages.METRICS_PAGE, 1, pages.MAX_PAGE)
        await self._answer(
            lambda store: pages.metrics_page(store, _run(store, rid)["id"], since, limit)
        )


class HealthHandler(_Base):
    auth_resource = RUNS_RESOURCE

    @tornado.web.authenticated
    @authorized
    async def get(self, run_id: str) -> None:
        rid = _run_id(run_id)
        await self._answer(lambda store: {"workers": store.health(_run(store, rid)["id"])})


class EventsHandler(_Base):
    auth_resource = RUNS_RESOURCE

    @tornado.web.authenticated
    @authorized
    async def get(self, run_id: str) -> None:
        rid = _run_id(run_id)
        since = None
        if self.get_query_argument("since_id", None) is not None:
            since = self._int_arg("since_id", 0, 0, _MAX_ID)
        limit = self._int_arg("limit", pages.EVENTS_PAGE, 1, pages.MAX_EVENTS)
        await self._answer(
            lambda store: pages.events_page(store, _run(store, rid)["id"], since, limit)
        )


class CurvesHandler(_Base):
    auth_resource = RUNS_RESOURCE

    @tornado.web.authenticated
    @authorized
    async def get(self, run_id: str) -> None:
        rid = _run_id(run_id)
        points = self._int_arg("points", 400, 2, MAX_POINTS)
        ranks = self._int_arg("ranks", 0, 0, 1) == 1
        names = self._names_arg()
        cache = self.series
        await self._answer(
            lambda store: cache.curves(store, _run(store, rid), points, ranks, names)
        )


class HealthHistoryHandler(_Base):
    auth_resource = RUNS_RESOURCE

    @tornado.web.authenticated
    @authorized
    async def get(self, run_id: str) -> None:
        rid = _run_id(run_id)
        points = self._int_arg("points", 400, 2, MAX_POINTS)
        cache = self.series
        await self._answer(lambda store: cache.health(store, _run(store, rid), points))


def _run_id(run_id: str) -> int:
    """The run id in a path, or a 400 that says what a run id looks like."""
    if not _RUN_ID.fullmatch(run_id):
        raise tornado.web.HTTPError(
            400,
            f"{trim_repr(run_id)} is not a run id: run ids are the numbers GET "
            "/nbdist/api/runs lists",
        )
    return int(run_id)


def _run(store: RunStore, run_id: int) -> dict:
    """The run ``run_id`` or a 404 that says where run ids come from."""
    run = store.get_run(run_id)
    if run is None:
        raise tornado.web.HTTPError(
            404, f"no run '{run_id}': run ids are the numbers GET /nbdist/api/runs lists"
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
    ("runs/" + _ID.format("run_id") + "/curves", CurvesHandler),
    ("runs/" + _ID.format("run_id") + "/health/history", HealthHistoryHandler),
]


def setup_routes(web_app) -> None:
    """Register nbdist's endpoints on the Jupyter server's tornado application."""
    web_app.settings.setdefault(
        _SETTINGS_KEY, {"clusters": Clusters(), "store": None, "series": SeriesCache()}
    )
    base = url_path_join(web_app.settings["base_url"], "nbdist", "api")
    web_app.add_handlers(
        ".*$", [(url_path_join(base, path) + "/?$", handler) for path, handler in ROUTES]
    )
