"""Shell scripts run on a host over ssh: the last lines of its engine logs, and the cleanup of
one cluster there (only processes whose command line names the cluster are killed)."""

from __future__ import annotations

import shlex
import subprocess

from .....config import HostSpec
from ...hosts import ssh_command


def run_script(host: HostSpec, script: str, connect_timeout: float) -> str:
    """Run a POSIX shell script on ``host`` (sent on stdin: the login shell may be any); its
    output, or "" when the host could not be reached."""
    try:
        r = subprocess.run(
            [*ssh_command(host, connect_timeout), "--", host.location, "sh -s"],
            input=script,
            capture_output=True,
            text=True,
            timeout=3 * connect_timeout,
        )
        return r.stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def log_tail(host: HostSpec, cluster_dir: str, connect_timeout: float) -> str:
    """The last lines the engines of this cluster wrote on ``host``, as one line."""
    script = f"tail -qn 2 {shlex.quote(cluster_dir)}/log/*.out 2>/dev/null"
    return one_line(run_script(host, script, connect_timeout))


def cleanup_script(pids: list[int], cluster_id: str, cluster_dir: str, remote_root: str) -> str:
    """Kill those of ``pids`` that belong to ``cluster_id`` (by their command line), remove the
    cluster's folder, and its parent folder when empty."""
    ids = " ".join(str(p) for p in pids if p and p > 0)
    d = shlex.quote(cluster_dir)
    return (
        f"for p in {ids}; do\n"
        f'  case "$(ps -o args= -p $p 2>/dev/null)" in *{cluster_id}*) kill -9 $p;; esac\n'
        "done\n"
        f"rm -rf -- {d}\n"
        f"rmdir -- {shlex.quote(remote_root)} 2>/dev/null\n"
        "exit 0\n"
    )


def one_line(value: object, limit: int = 200) -> str:
    """``value`` as one line of at most ``limit`` characters (for error messages)."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
