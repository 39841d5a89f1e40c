"""How many engines a cluster on this machine may have, and a requested count read against it.

The sidebar's start (the server) and a cluster host's spawn (asked by an attached notebook)
refuse the same counts in the same words: both read them here.
"""

from __future__ import annotations

import re

from .. import config
from ..errors import UsageError, trim_repr


def max_engines() -> int:
    """The most engines a cluster on this machine may have (``config.engine_limit``)."""
    return config.engine_limit(config.cpu_count())


def parse_count(value: object, high: int | None = None) -> int:
    """The engine count from a request (1 to ``high``, default ``max_engines()``), or a one-line
    UsageError that names the problem and the fix."""
    high = max_engines() if high is None else high
    n = None
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str) and re.fullmatch(r"\s*[0-9]{1,9}\s*", value):
        n = int(value)
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    if n is None or not 1 <= n <= high:
        raise UsageError(
            f"the number of engines must be a whole number from 1 to {high} (this machine's "
            f"CPUs x {config.ENGINES_PER_CPU}, at least {config.MIN_ENGINE_LIMIT}), not "
            f"{trim_repr(value)}"
        )
    return n
