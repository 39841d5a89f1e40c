"""One environment across hosts: the versions each host runs, in one table, and what differs.

Pure: it reads the inventories that ``nbdist.worker.api.setup()`` returned (one
``protocol.Inventory`` per engine: host, python, torch, nbdist, gpus) and says which hosts
differ from the first host (rank 0's).
Engines on hosts with different Python or torch versions can unpickle each other's objects
wrongly, and a host without CUDA beside hosts with it cannot join an NCCL group: better refused
at start, with the hosts named, than met as a strange error in the middle of training.
"""

from __future__ import annotations

import warnings

from ...errors import UsageError
from ...protocol import Inventory

#: What must match across hosts, as (column, what the message calls it).
CHECKED = (("python", "Python"), ("torch", "torch"), ("nbdist", "nbdist"), ("cuda", "CUDA"))


def _cuda(inv: Inventory) -> str:
    gpus = inv.gpus
    return f"yes ({len(gpus)} GPU{'s' if len(gpus) != 1 else ''})" if gpus else "no"


def host_rows(inventory: dict[int, Inventory]) -> list[dict]:
    """One row per host, in rank order of hosts: host, engines, python, torch, nbdist, cuda.

    Engines of one host normally agree; where they do not, the row shows every value seen."""
    rows: dict[str, dict] = {}
    for eid in sorted(inventory):
        inv = inventory[eid]
        row = rows.setdefault(
            inv.host, {"host": inv.host, "engines": 0, **{c: [] for c, _ in CHECKED}}
        )
        row["engines"] += 1
        values = {
            "python": inv.python or "?",
            "torch": inv.torch or "?",
            "nbdist": inv.nbdist or "?",
            "cuda": _cuda(inv),
        }
        for col, _ in CHECKED:
            if values[col] not in row[col]:
                row[col].append(values[col])
    return [
        {**r, **{c: " / ".join(str(v) for v in r[c]) for c, _ in CHECKED}} for r in rows.values()
    ]


def _cuda_available(value: str) -> str:
    return "no" if value == "no" else "yes"  # the GPU count may differ; availability must not


def differences(rows: list[dict]) -> list[str]:
    """What differs from the first host, one phrase per setting: ``torch 2.3.1 on gpu2 (2.4.0
    on gpu1)``. Empty when every host runs the same."""
    if not rows:
        return []
    first = rows[0]
    out = []
    for col, name in CHECKED:
        norm = _cuda_available if col == "cuda" else str
        odd = [r for r in rows if norm(r[col]) != norm(first[col]) or " / " in r[col]]
        if not odd:
            continue
        if col == "cuda":
            hosts = ", ".join(r["host"] for r in odd)
            have = "has" if norm(first[col]) == "yes" else "lacks"
            out.append(f"CUDA differs on {hosts} ({first['host']} {have} it)")
        else:
            where = "; ".join(f"{r[col]} on {r['host']}" for r in odd)
            out.append(f"{name} {where} ({first[col]} on {first['host']})")
    return out


def table(rows: list[dict]) -> str:
    """The hosts' environments as a text table (engine strings stay text)."""
    cols = ["host", "engines", "python", "torch", "nbdist", "cuda"]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def check(inventory: dict[int, Inventory], policy: str = "refuse") -> None:
    """Compare the hosts. When they differ: raise a UsageError naming the hosts that differ
    (``policy="refuse"``), or warn and go on (``"warn"``)."""
    diffs = differences(host_rows(inventory))
    if not diffs:
        return
    what = "; ".join(diffs)
    if policy == "refuse":
        raise UsageError(
            f"the hosts' environments differ: {what}. Install the same versions everywhere, "
            "or start with --env-check warn to train anyway"
        )
    warnings.warn(f"nbdist: the hosts' environments differ: {what}", UserWarning, stacklevel=2)
