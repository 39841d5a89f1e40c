"""The checks every setting's value goes through: whole numbers, seconds, flags, addresses.

Pure, beneath ``config`` and ``remote_config`` (both build their records with these), so that a
bad value reads the same one line wherever it is given.
"""

from __future__ import annotations

import ipaddress
import math
import numbers

from .errors import UsageError


def whole(value: object, what: str, low: int = 0, high: int | None = None) -> int:
    """``value`` as an int between ``low`` and ``high``, or a UsageError naming ``what``."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"between {low} and {high}"
        raise UsageError(f"{what} must be a whole number {span}, not {value!r}")
    return int(value)


def seconds(value: object, what: str, low: float = 0.0, fix: str = "", zero: bool = False) -> float:
    """``value`` as a finite number of seconds: > 0 (or >= 0 with ``zero``), or >= ``low``."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or (value == 0 and not zero):
        span = f"a number of seconds >= {low:g}" if low or zero else "a positive number of seconds"
        raise UsageError(f"{what} must be {span}{fix}, not {value!r}")
    return float(value)


def flag(value: object, what: str) -> None:
    if not isinstance(value, bool):
        raise UsageError(f"{what} must be True or False, not {value!r}")


def check_local_ip(ip: object) -> None:
    """Refuse a controller address other than loopback for engines that all run here: the
    controller and rank 0's rendezvous store (which has no authentication) would be open to
    every machine that reaches this one."""
    try:
        addr = ipaddress.ip_address(ip) if isinstance(ip, str) else None
    except ValueError:
        addr = None
    if addr is None and ip != "*":
        raise UsageError(f"--ip {ip!r} is not an IP address: leave --ip out (127.0.0.1)")
    if addr is None or not addr.is_loopback:
        raise UsageError(
            f"--ip {ip} would open the controller and the unauthenticated rendezvous store "
            "beyond this machine, but every engine runs here: leave --ip out (loopback); for "
            "engines on other hosts use --hosts or --cluster-file"
        )
    if addr.version != 4:
        raise UsageError(f"--ip {ip}: local clusters use IPv4: leave --ip out (127.0.0.1)")
