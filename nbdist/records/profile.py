"""nbdist's ipyparallel profile: where every nbdist cluster's files are, whoever started it.

The kernel's engine sets keep their cluster files, connection files and logs there
(``profile_dir``, made on first use with the config files that tie controller and engines to
the kernel that started them: ``nbdist.launch.lifeline``); the server reads them to list a
kernel's clusters (``profile_path``, which makes nothing). Imports no ipyparallel and no torch.
"""

from __future__ import annotations

from pathlib import Path

from .. import config, datadir

#: Written into the profile's controller and engine config files.
CONFIG_FILE = """\
# Written by nbdist: controller and engines leave when the kernel that started them is gone.
import nbdist.launch.lifeline
nbdist.launch.lifeline.exit_with_parent()
"""


def profile_path() -> Path:
    """Where nbdist's ipyparallel profile is, made or not (for readers: nothing is written);
    a one-line UsageError when the data folder is not fit (``datadir.check``)."""
    return (datadir.check() or config.data_dir()) / "profile"


def profile_dir() -> Path:
    """nbdist's ipyparallel profile (made if missing): cluster files, connection files, logs."""
    path = datadir.private_dir(datadir.ensure() / "profile")
    for name in ("ipcontroller_config.py", "ipengine_config.py"):
        f = path / name
        if not f.exists() or f.read_text() != CONFIG_FILE:
            f.write_text(CONFIG_FILE)
    return path
