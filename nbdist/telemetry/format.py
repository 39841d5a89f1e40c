"""How nbdist writes numbers and durations in text the kernel makes (events, the board's picture).

The same rules as ``extension/src/format.ts``, which the sidebar and both boards use, so a run's
length reads "7.3 s" in its event, on its board and in the sidebar alike
(``tests/unit/test_format.py`` holds the two side by side).
"""

from __future__ import annotations

import math

MISSING = "–"


def _missing(v: float | None) -> bool:
    return v is None or not math.isfinite(v)


def _wants_exponent(v: float) -> bool:
    return v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e6)


def _js_exponent(v: float, digits: int) -> str:
    """``v.toExponential(digits)`` as JavaScript writes it: ``2.90e-4``, ``1.23e+6``."""
    mantissa, exponent = f"{v:.{digits}e}".split("e")
    return f"{mantissa}e{int(exponent):+d}"


def fmt(v: float | None, digits: int = 4) -> str:
    """A number in ``digits`` significant digits (exponent form when tiny or huge)."""
    if _missing(v):
        return MISSING
    if _wants_exponent(v):
        return _js_exponent(v, max(0, digits - 2))
    text = repr(float(f"{v:.{digits}g}"))  # the shortest form, as JavaScript's String()
    text = text[:-2] if text.endswith(".0") else text
    whole, dot, frac = text.partition(".")
    return f"{int(whole):,}{dot}{frac}" if whole != "-0" else text


def fmt_int(v: float | None) -> str:
    """A whole number with thousands separators: 3,080."""
    return MISSING if _missing(v) else f"{math.floor(v + 0.5):,}"  # JavaScript's Math.round


def fmt_duration(seconds: float | None) -> str:
    """Seconds as people read them: "7.3 s", "2 min 05 s", "1 h 02 min"."""
    if _missing(seconds):
        return MISSING
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f} s"
    whole = math.floor(s + 0.5)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    minutes = math.floor(whole / 60 + 0.5)
    return f"{minutes // 60} h {minutes % 60:02d} min"
