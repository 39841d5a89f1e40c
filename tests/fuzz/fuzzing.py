"""What the fuzz tests share: hostile values, the bounded example budget, the verdicts.

Every fuzz test throws values at one way in (a magic option, a public function's argument, a
cluster file, a server endpoint) and accepts two outcomes only: success, or one ``UsageError``
line (a 4xx with a one-line message for the server). Anything else (a traceback from inside
nbdist, a hang, a dead kernel, an unusable cluster afterwards) fails the test.

The number of examples is bounded so CI stays fast: ``NBDIST_FUZZ_EXAMPLES`` (default 25 per
test) raises it for a longer hunt, e.g. ``NBDIST_FUZZ_EXAMPLES=500 pytest tests/fuzz``.
"""

from __future__ import annotations

import os
import shlex

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("NBDIST_FUZZ_EXAMPLES", "25"))

#: Settings of every fuzz test: a bounded budget, no per-example deadline (a cell takes tens of
#: milliseconds, a cluster start seconds), fixtures shared across examples on purpose.
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=os.environ.get("NBDIST_FUZZ_RANDOM") is None,  # CI: the same examples each run
    database=None,  # nothing written into the checkout
)

#: What Python's str.splitlines() breaks lines at: in a magic's line, IPython would end the line
#: there and read the rest as the cell's next line, before nbdist sees it.
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"

#: Values people type by mistake, and values an attacker would try.
NASTY = [
    "",
    " ",
    "0",
    "-0",
    "-1",
    "1",
    "2",
    "7",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e309",
    "1e-320",
    "0.5",
    "1e9",
    "99999999999999999999",
    "0x10",
    "1_000",
    "²",
    "٣",
    "0,0",
    ",",
    "1,,2",
    "-1,0",
    "--help",
    "-h",
    "--",
    "-oProxyCommand=touch /tmp/nbdist-pwned",
    "*",
    "0.0.0.0",
    "::",
    "localhost",
    "'",
    '"',
    "\\",
    "$(id)",
    "`id`",
    ";id",
    "a b",
    "\t",
    "é",
    "😀",
    "x" * 300,
    "../..",
    "/",
    "/dev/null",
    "/etc/passwd",
    "None",
    "True",
    "[]",
    "{}",
    "__import__('os')",
]

text_values = st.one_of(
    st.sampled_from(NASTY),
    st.integers(-(2**63), 2**63).map(str),
    st.floats().map(repr),
    st.text(st.characters(exclude_characters=_LINE_BREAKS + "\x00"), max_size=12),
)

#: Python values for keyword arguments of public functions.
py_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(),
    st.sampled_from(NASTY),
    st.text(max_size=8),
    st.lists(st.integers(-3, 3), max_size=3),
    st.tuples(st.integers(-3, 3)),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def token(value: str, quoted: bool) -> str:
    """``value`` as it would be typed on a magic's line: quoted (one argument) or raw."""
    return shlex.quote(value) if quoted else value


def one_line_usage_error(error: dict | None) -> bool:
    """A kernel's error content that is one UsageError line."""
    return error is not None and error["ename"] == "UsageError" and len(error["traceback"]) <= 1


def describe(error: dict | None) -> str:
    if error is None:
        return "no error"
    return f"{error['ename']}: {error['evalue']}\n" + "\n".join(error["traceback"])[-3000:]
