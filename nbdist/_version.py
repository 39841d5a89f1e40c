"""nbdist's version, as the installed package reports it.

The number is written in one place, ``extension/package.json``; at build time hatch reads it from
there (``hatch-nodejs-version``, see ``pyproject.toml``) into the package's metadata, and the lab
extension built from that file carries it too.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def _version() -> str:
    try:
        return version("nbdist")
    except PackageNotFoundError:
        # A source tree on sys.path that was never installed: read the number where it is written.
        import json

        package_json = Path(__file__).resolve().parent.parent / "extension" / "package.json"
        try:
            npm = str(json.loads(package_json.read_text(encoding="utf-8"))["version"])
        except (OSError, ValueError, KeyError):
            return "0+unknown"
        try:  # the form hatch gives it: 0.2.0-rc.1 -> 0.2.0rc1
            from packaging.version import Version

            return str(Version(npm))
        except Exception:
            return npm


__version__ = _version()
