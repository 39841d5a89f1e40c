"""Hostile values at every magic option, in a real kernel with a real 2-engine cluster.

Each example is one cell. It must succeed or end in one UsageError line; after it the kernel is
alive and the cluster still runs a collective on both ranks.
"""

from __future__ import annotations

import pytest
from fuzzing import FUZZ, describe, one_line_usage_error, text_values, token
from hypothesis import given
from hypothesis import strategies as st

ALIVE_CHECK = (
    "%%distributed\nimport torch\nt = torch.ones(1)\ntorch.distributed.all_reduce(t)\nt.item()"
)


@pytest.fixture(scope="module")
def nb(kernel, tmp_path_factory):
    """The module's kernel, in a scratch folder (options may name paths), with a cluster and
    a few notebook variables to scatter."""
    home = tmp_path_factory.mktemp("fuzz-home")
    kernel.ok(
        f"import os\nos.chdir({str(home)!r})\nimport numpy as np\n"
        "X = np.arange(40, dtype=np.float32).reshape(20, 2)\ny = np.arange(20) % 3\n"
        "yf = np.linspace(0, 1, 20)\nyn = y.astype(float)\nyn[3] = np.nan\nshort = y[:5]\n"
        "s = 'text'\n"
    )
    kernel.ok("%nbdist start -n 2")
    kernel.ok("%%distributed\nz = nbdist.rank()")
    yield kernel
    kernel.ok("%nbdist stop")


def _verdict(nb, code: str, also_ok: tuple[str, ...] = ()) -> None:
    r = nb.run(code, timeout=90)
    assert nb.km.is_alive(), f"the kernel died on {code!r}"
    if r.error is not None and not one_line_usage_error(r.error):
        shown = describe(r.error)
        assert any(text in shown for text in also_ok), f"{code!r} gave\n{shown}"
    assert nb.ok(ALIVE_CHECK, timeout=60).result == "2.0", f"cluster broken after {code!r}"


CELL_OPTIONS = [
    "--timeout",
    "--ranks",
    "--restarts",
    "--min-workers",
    "--progress-timeout",
    "--total",
    "--name",
    "--tensorboard",
]


@FUZZ
@given(
    options=st.lists(
        st.tuples(st.sampled_from(CELL_OPTIONS), text_values, st.booleans()), max_size=3
    ),
    flags=st.lists(st.sampled_from(["--all-output", "--no-dashboard", "--stop-on-nan"])),
)
def test_distributed_cell_options(nb, options, flags):
    line = " ".join([*flags, *(f"{o} {token(_inside(o, v), q)}" for o, v, q in options)])
    # a tiny --timeout may stop even this cell: that is the option working, said in one line
    _verdict(nb, f"%%distributed {line}\nimport time\ntime.sleep(0.01)\n1", ("past --timeout",))


def _inside(option: str, value: str) -> str:
    """A --tensorboard folder kept inside the scratch folder (the fuzzer would write event
    files to / as root), except two paths that must be refused: a file and a device."""
    if option != "--tensorboard" or value in ("/dev/null", "/etc/passwd"):
        return value
    return "tb-" + value.replace("/", "_").replace("..", "_").lstrip("~")


@FUZZ
@given(
    name=st.one_of(st.sampled_from(["X", "y", "s", "X,y", "missing"]), text_values),
    stratify=st.one_of(st.none(), st.sampled_from(["y", "yf", "yn", "short", "s"]), text_values),
    remainder=st.one_of(st.none(), st.sampled_from(["drop", "pad", "uneven"]), text_values),
    seed=st.one_of(st.none(), text_values),
    target=st.one_of(st.none(), text_values),
    quoted=st.booleans(),
)
def test_scatter_options(nb, name, stratify, remainder, seed, target, quoted):
    parts = ["%nbdist scatter", token(name, quoted)]
    for option, value in [
        ("--stratify", stratify),
        ("--remainder", remainder),
        ("--seed", seed),
        ("--as", target),
    ]:
        if value is not None:
            parts.append(f"{option} {token(value, quoted)}")
    _verdict(nb, " ".join(parts))


@FUZZ
@given(
    name=st.one_of(st.sampled_from(["z", "nbdist", "missing"]), text_values),
    rank=st.one_of(st.none(), text_values),
    target=st.one_of(st.none(), text_values),
    quoted=st.booleans(),
)
def test_pull_options(nb, name, rank, target, quoted):
    line = f"%nbdist pull {token(name, quoted)}"
    if rank is not None:
        line += f" --rank {token(rank, quoted)}"
    if target is not None:
        line += f" --as {token(target, quoted)}"
    _verdict(nb, line)


@FUZZ
@given(
    file=st.one_of(st.sampled_from([".", "/", "/dev/null", "/etc/passwd", "x.py"]), text_values),
    args=st.lists(text_values, max_size=3),
    quoted=st.booleans(),
)
def test_run_options(nb, file, args, quoted):
    # no script file exists in the scratch folder: every example is refused before any engine
    # runs anything, except /dev/null (an empty script) and what the fuzzer names that exists
    line = "%nbdist run --timeout 30 " + " ".join(token(a, quoted) for a in [file, *args])
    _verdict(nb, line)


@FUZZ
@given(
    option=st.sampled_from(
        ["-n", "--threads", "--backend", "--ip", "--launcher", "--env-check", "--hosts"]
    ),
    value=text_values,
    quoted=st.booleans(),
)
def test_start_options_with_a_cluster_running(nb, option, value, quoted):
    # options are checked before the "already running" refusal: every way in is exercised
    # without starting engines
    _verdict(nb, f"%nbdist start {option} {token(value, quoted)}")


@FUZZ
@given(
    option=st.sampled_from(["--keep-checkpoints", "--keep-runs", "--keep-days", "--keep-logs"]),
    value=text_values,
    quoted=st.booleans(),
)
def test_gc_options(nb, option, value, quoted):
    # without --yes: the plan is shown, nothing is freed
    _verdict(nb, f"%nbdist gc {option} {token(value, quoted)}")
