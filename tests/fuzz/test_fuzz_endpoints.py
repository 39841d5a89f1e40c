"""Hostile requests at every sidebar endpoint of a real Jupyter server (``jupyter lab``).

Every answer must be a success or a 4xx with a one-line JSON message: never a 500, never a hang.
Requests without the token are refused whatever they carry. POSTs that would start a cluster
host are sent with bodies the server must refuse, so no example starts engines.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

import pytest
from fuzzing import FUZZ, NASTY, py_values, text_values
from hypothesis import given
from hypothesis import strategies as st
from lab import running_lab
from paths import data_dir_env

from nbdist.telemetry.store import RunStore


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz-lab")
    data = base / "nbdist-data"
    with data_dir_env(data):  # a kept run, so that runs/1/... has something to read
        store = RunStore()
        store.end_run(store.start_run(name="fuzz", world_size=2, total=10), "ok")
    with running_lab(base, base / "root", env={"NBDIST_DATA_DIR": str(data)}) as lab:
        yield lab


def _request(lab, method: str, path: str, body: bytes | None, token: bool = True):
    headers = {"Authorization": f"token {lab.token}"} if token else {}
    if body is not None:
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(lab.url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _verdict(status: int, payload: bytes, what: str) -> None:
    assert status < 500, f"{what}: {status} {payload[:500]!r}"
    if 400 <= status < 500 and payload:
        try:
            message = json.loads(payload).get("message", "")
        except (ValueError, AttributeError):
            return  # tornado's own HTML page for a route that does not exist (404)
        assert "\n" not in str(message).strip(), f"{what}: a message of more than one line"


segments = st.one_of(st.sampled_from(NASTY), text_values, st.integers(-5, 2**70).map(str))
PATHS = [
    "clusters",
    "clusters/{}",
    "runs",
    "runs/{}",
    "runs/{}/metrics",
    "runs/{}/health",
    "runs/{}/events",
    "runs/{}/curves",
    "runs/{}/health/history",
]


@FUZZ
@given(
    path=st.sampled_from(PATHS),
    segment=segments,
    query=st.dictionaries(
        st.sampled_from(["n", "limit", "since", "after", "rank", "points", "ranks", "metrics"]),
        segments,
    ),
    method=st.sampled_from(["GET", "DELETE", "POST"]),
)
def test_paths_and_queries(lab, path, segment, query, method):
    quoted = urllib.parse.quote(segment, safe="") or "x"
    url = "nbdist/api/" + path.format(quoted)
    if query:
        url += "?" + urllib.parse.urlencode(query)
    # a POST gets a body the server must refuse: no example may start a cluster host
    body = json.dumps({"n": "²"}).encode() if method == "POST" else None
    status, payload = _request(lab, method, url, body)
    _verdict(status, payload, f"{method} {url}")
    status, _ = _request(lab, method, url, body, token=False)
    assert status in (401, 403), f"{method} {url} without the token: {status}"


#: Engine counts the server must refuse: a valid one would start engines in every example.
BAD_N = ["²", -1, 0, 10**9, 2.5, "", "two", [], {}, "1e3"]


@FUZZ
@given(
    body=st.one_of(
        st.builds(
            lambda n, rest: {**rest, "n": n},
            st.sampled_from(BAD_N),
            st.dictionaries(st.sampled_from(["threads", "name", "hosts", "x"]), py_values),
        ),
        py_values.filter(lambda v: not isinstance(v, dict)),
        st.binary(max_size=40),
    )
)
def test_cluster_start_bodies(lab, body):
    raw = body if isinstance(body, bytes) else json.dumps(body, default=str).encode()
    status, payload = _request(lab, "POST", "nbdist/api/clusters", raw)
    _verdict(status, payload, f"POST clusters {raw[:80]!r}")
    assert status >= 400, f"the server accepted {raw!r}"
