"""A real ``jupyter lab`` for the browser tests, in a process of its own.

    from lab import running_lab

    with running_lab(base, root, env={"NBDIST_DATA_DIR": ...}) as lab:
        page.goto(lab.page_url("lab"))       # http://127.0.0.1:PORT/lab?token=...
        lab.api("nbdist/api/runs")           # JSON from an endpoint, with the token

The lab listens on a free loopback port with a token of its own, keeps its settings and
workspaces under ``base`` (with JupyterLab's news toast turned off, so it never covers a
screenshot) and serves ``root``. On leaving, the lab is stopped and every process it started
(kernels included) must be gone within 30 s, or the test fails.

``serving(base, "name.ipynb", notebook(cells))`` is a lab serving one notebook, its kernels
keeping their records apart; ``need_chromium()`` skips a test where the browser is absent.

``chromium_page(lab)`` opens it in Debian's Chromium (``CHROMIUM``) under Playwright; nothing
downloads a browser of its own. Screenshots go to ``SHOTS``, which the docs site shows
(docs/conf.py).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from paths import ARTIFACTS
from processes import assert_gone, wait_until

#: Seconds a lab has to answer /api/status after it starts.
START_TIMEOUT = 90.0
#: The browser the tests drive (``scripts/install-system-deps.sh`` installs it), its flags, and
#: where the screenshots go.
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = ARTIFACTS / "screenshots"
#: The front ends ``running_lab`` can serve: (module run, its application's config class).
APPS = {"lab": ("jupyterlab", "LabApp"), "notebook": ("notebook", "JupyterNotebookApp")}


@dataclass
class Lab:
    """A running lab: its base ``url`` (ending in /), ``token``, process and log file."""

    url: str
    token: str
    proc: subprocess.Popen
    log: Path

    def api(self, path: str, method: str = "GET", body: Any = None, timeout: float = 10) -> Any:
        """The JSON answer of ``path`` (relative to ``url``, e.g. ``"api/status"``)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"null")

    def page_url(self, path: str = "lab") -> str:
        """A browser address under the lab that logs in with the token."""
        return f"{self.url}{path}?token={self.token}"


def notebook(cells: list[str], markdown: str | None = None) -> dict:
    """A notebook (nbformat 4, the python3 kernel) of these code cells, unrun, and a markdown
    cell after them if given."""
    code = [
        {"cell_type": "code", "metadata": {}, "source": c, "outputs": [], "execution_count": None}
        for c in cells
    ]
    tail = [{"cell_type": "markdown", "metadata": {}, "source": markdown}] if markdown else []
    return {
        "cells": code + tail,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


@contextmanager
def running_lab(
    base: Path, root: Path, env: Mapping[str, str] | None = None, app: str = "lab"
) -> Iterator[Lab]:
    """Start ``jupyter lab`` serving ``root`` (settings under ``base``); stop it on leaving.

    ``env`` is added to this process's environment for the lab (and so for its kernels).
    ``app="notebook"`` starts Jupyter Notebook 7 instead (``/tree``, ``/notebooks/...``).
    """
    base, root = Path(base), Path(root)
    root.mkdir(parents=True, exist_ok=True)
    news = base / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True, exist_ok=True)  # no "get notified about news?" toast
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    token, port = secrets.token_hex(16), _free_port()
    module, cls = APPS[app]
    cmd = [
        sys.executable,
        "-m",
        module,
        "--no-browser",
        "--allow-root",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--{cls}.user_settings_dir={base / 'settings'}",
        f"--{cls}.workspaces_dir={base / 'workspaces'}",
        f"--{cls}.expose_app_in_browser=True",  # window.jupyterapp, for commands (themes)
    ]
    log_path = base / "lab.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    lab = Lab(f"http://127.0.0.1:{port}/", token, proc, log_path)

    def up() -> bool:
        assert proc.poll() is None, f"jupyter lab exited:\n{log_path.read_text()[-3000:]}"
        try:
            return lab.api("api/status", timeout=5) is not None
        except OSError:
            return False

    try:
        wait_until(up, START_TIMEOUT, interval=0.25, what="jupyter lab to answer")
        yield lab
    finally:
        _stop(proc)


@contextmanager
def serving(base: Path, name: str, nb: dict, app: str = "lab") -> Iterator[tuple[Lab, Path]]:
    """``running_lab`` (``app``) serving the notebook ``nb`` as ``name`` in ``base / "root"``,
    its kernels keeping their records in ``base / "data"``: yields the lab and that root."""
    root = base / "root"
    with running_lab(base, root, env={"NBDIST_DATA_DIR": str(base / "data")}, app=app) as lab:
        (root / name).write_text(json.dumps(nb))
        yield lab, root


def need_chromium() -> None:
    """Skip the calling test where Chromium or Python's Playwright is absent."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent: run scripts/install-system-deps.sh")
    pytest.importorskip("playwright.sync_api")


@contextmanager
def chromium_page(
    lab: Lab,
    path: str = "lab",
    width: int = 1280,
    height: int = 860,
    scale: float = 1,
    ready: str = "#jp-main-dock-panel",
) -> Iterator[Any]:
    """A Playwright page in Chromium on ``path`` of the lab (``scale``: its pixel ratio), once
    the ``ready`` selector is on it (JupyterLab's main area); the browser is closed on leaving."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page = browser.new_page(
                viewport={"width": width, "height": height}, device_scale_factor=scale
            )
            page.set_default_timeout(60_000)
            page.goto(lab.page_url(path))
            page.wait_for_selector(ready)
            yield page
        finally:
            browser.close()


def _stop(proc: subprocess.Popen) -> None:
    """Terminate the lab; it and everything it started must be gone within 30 s."""
    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    assert_gone(procs, timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
