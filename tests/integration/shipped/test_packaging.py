"""``pip install .`` brings the sidebar: the prebuilt lab extension, the server extension enabled.

Installs the package into a fresh virtual environment (``--system-site-packages``, so nothing is
downloaded again but the build tools) and asks that environment's ``jupyter`` what it sees.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

# The repository root, wherever under tests/ this file sits.
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# The one place the version is written; everything else reports it.
VERSION = json.loads((ROOT / "extension" / "package.json").read_text())["version"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _run(cmd: list[str], **kw) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=800, **kw)
    out = ANSI.sub("", p.stdout + p.stderr)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{out[-4000:]}"
    return out


def _under(listing: str, heading: re.Pattern, line: re.Pattern) -> list[str]:
    """The headings (config dirs, extension dirs) under which a line matching ``line`` is."""
    found, current = [], None
    for text in listing.splitlines():
        if heading.match(text):
            current = text
        elif line.search(text):
            found.append(current)
    return found


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pkg") / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(path)])
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_USER", "PYTHONPATH")}
    _run(
        [str(path / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--quiet", str(ROOT)],
        env=env,
    )
    return path


def _jupyter(venv: Path, module: str, *args: str) -> str:
    """``jupyter ...`` as that environment's Python runs it (its scripts live outside it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER") and k != "PYTHONPATH"}
    return _run([str(venv / "bin" / "python"), "-m", module, *args], env=env)


def test_files_land_in_the_environment(venv):
    lab = venv / "share" / "jupyter" / "labextensions" / "nbdist"
    meta = json.loads((lab / "package.json").read_text())
    assert meta["name"] == "nbdist" and meta["jupyterlab"]["_build"]["load"].startswith("static/")
    assert (lab / meta["jupyterlab"]["_build"]["load"]).is_file()
    assert json.loads((lab / "install.json").read_text())["packageName"] == "nbdist"
    conf = venv / "etc" / "jupyter" / "jupyter_server_config.d" / "nbdist.json"
    assert json.loads(conf.read_text())["ServerApp"]["jpserver_extensions"] == {"nbdist": True}


def test_lab_extension_enabled_and_ok(venv):
    listing = _jupyter(venv, "jupyterlab.labextensions", "list")
    where = _under(
        listing,
        re.compile(r"^/\S+$"),
        re.compile(rf"nbdist v{re.escape(VERSION)} enabled\s+OK \(python, nbdist\)"),
    )
    assert str(venv / "share" / "jupyter" / "labextensions") in where, listing


def test_server_extension_enabled_and_ok(venv):
    listing = _jupyter(venv, "jupyter_server.extension.serverextension", "list")
    heading = re.compile(r"^Config dir: ")
    conf = f"Config dir: {venv / 'etc' / 'jupyter'}"
    assert conf in _under(listing, heading, re.compile(r"^\s+nbdist enabled$")), listing
    assert conf in _under(listing, heading, re.compile(r"^\s+nbdist \S+ OK$")), listing


def test_one_version_everywhere(venv, tmp_path):
    """extension/package.json holds the version; the package metadata, ``nbdist.__version__`` and
    the installed lab extension all report that one."""
    from packaging.version import Version

    report = _run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.metadata, json, nbdist; print(json.dumps("
            "[importlib.metadata.version('nbdist'), nbdist.__version__, nbdist.__file__]))",
        ],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    metadata, attribute, where = json.loads(report.strip().splitlines()[-1])
    assert Path(where).is_relative_to(venv), where  # the installed copy, not the source tree
    lab = venv / "share" / "jupyter" / "labextensions" / "nbdist" / "package.json"
    labextension = json.loads(lab.read_text())["version"]
    assert labextension == VERSION, (
        f"the installed lab extension says {labextension}, extension/package.json {VERSION}: "
        "rebuild it (cd extension && jlpm build:prod)"
    )
    assert metadata == attribute == str(Version(VERSION)), (metadata, attribute, VERSION)
