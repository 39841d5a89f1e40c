"""The launcher's settings of a ``config.RemoteConfig``, checked when it is built: the launcher's
name, hosts for ssh only, and the scheduler's words in nbdist's (``partition``, ``time``,
``gpus_per_node``: Slurm's ``--partition``, ``--time`` and ``--gpus-per-node``).

Pure: nothing here runs a command. What only the scheduler can judge (a partition that does not
exist, GPUs on a cluster without them) is asked of it before submitting
(``notebook.engines.remote.slurm.precheck``).
"""

from __future__ import annotations

import re
from typing import Any

from .errors import UsageError

LAUNCHERS = ("ssh", "slurm", "mpi", "local")
#: Slurm's time formats: MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS,
#: DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS; or UNLIMITED.
_TIME = re.compile(r"(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|unlimited|infinite)\Z", re.I)
_PARTITION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}(,[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})*\Z")
TIME_FORMATS = "MINUTES, HH:MM:SS or DAYS-HH[:MM[:SS]] (e.g. 30, 1:30:00, 2-00)"


def check(
    launcher: Any,
    hosts: Any,
    launcher_options: Any,
    partition: Any,
    time: Any,
    gpus_per_node: Any,
) -> str | None:
    """Refuse, in one line with the fix, a launcher setting that cannot work; return ``time``
    as Slurm's text (minutes given as a number normalised), or None when not given."""
    if not isinstance(launcher, str) or launcher not in LAUNCHERS:
        raise UsageError(f"--launcher must be one of {', '.join(LAUNCHERS)}, not {launcher!r}")
    if launcher == "ssh" and not hosts:
        raise UsageError("the ssh launcher needs hosts: --hosts user@gpu1:4,user@gpu2:4")
    if launcher != "ssh" and hosts:
        raise UsageError(f"hosts are for the ssh launcher; {launcher} finds its own")
    if not isinstance(launcher_options, dict):
        raise UsageError("launcher options must be a table of KEY = value")
    scheduler = {"partition": partition, "time": time, "gpus_per_node": gpus_per_node}
    given = [name for name, value in scheduler.items() if value is not None]
    if given and launcher != "slurm":
        flags = ", ".join("--" + g.replace("_", "-") for g in given)
        raise UsageError(
            f"{flags}: for the slurm launcher, not {launcher} (add --launcher slurm, or drop them)"
        )
    if partition is not None and not (isinstance(partition, str) and _PARTITION.match(partition)):
        raise UsageError(
            f"--partition {partition!r} is not a partition name (see sinfo -s for the names)"
        )
    text = None if time is None else slurm_time(time)
    g = gpus_per_node
    if g is not None and (type(g) is not int or g < 1):
        raise UsageError(f"--gpus-per-node must be a whole number >= 1, not {g!r}")
    return text


def slurm_time(value: object) -> str:
    """``value`` (Slurm's time text, or whole minutes) as Slurm's time text; else one line."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    if isinstance(value, str) and _TIME.match(value.strip()) and value.strip() not in ("0",):
        return value.strip()
    raise UsageError(f"--time {value!r} is not a Slurm time limit: write {TIME_FORMATS}")
