"""Every bad input is one UsageError line, said where it enters, before any engine starts or is
sent anything: magics in a real kernel (which stays alive, its cluster usable), the Python API
directly, and what a scatter leaves in the recovery journal."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from netns import Sshd, cluster_file, need_sshd

import nbdist
from nbdist import config
from nbdist.config import CellOptions, ClusterConfig
from nbdist.errors import UsageError
from nbdist.notebook.cluster import hosts

CPUS = config.cpu_count()
LIMIT = config.engine_limit(CPUS)
ALIVE = "%%distributed\nimport torch\nt = torch.ones(1)\ntorch.distributed.all_reduce(t)\nt.item()"
DATA = (
    "import gc, weakref\nimport numpy as np\nimport nbdist\n"
    "X = np.arange(40, dtype=np.float32).reshape(20, 2)\ny = np.arange(20) % 3\n"
    "yf = np.linspace(0, 1, 20)\nyn = y.astype(float)\nyn[3] = np.nan\nshort = y[:5]\n"
)


def one_line(nb, code: str, expected: str):
    """Run ``code``: it must fail with one UsageError line containing ``expected``."""
    r = nb.run(code, timeout=60)
    assert r.error is not None, f"{code!r} was accepted"
    assert r.error["ename"] == "UsageError", (code, r.error["ename"], r.error["evalue"])
    assert expected in r.error["evalue"], (code, r.error["evalue"])
    assert len(r.error["traceback"]) <= 1, r.error["traceback"]
    assert nb.km.is_alive()
    return r


@pytest.fixture
def nb(kernel):
    """The module's kernel with a running 2-engine cluster and a few notebook variables."""
    if kernel.ok("import nbdist\nnbdist.current(required=False) is None").result == "True":
        kernel.ok("%nbdist start -n 2")
        kernel.ok(DATA)
    return kernel


# -- in a real kernel --------------------------------------------------------------------------
START = [
    (
        "%nbdist start -n 100000",
        f"100000 engines: this machine has {CPUS} CPU(s), enough for at most {LIMIT} (4 per "
        "CPU, at least 8): use fewer, or add --oversubscribe (oversubscribe=True) if you mean it",
    ),
    ("%nbdist start --threads 1000", f"1000 threads per engine: this machine has {CPUS} CPU(s)"),
    (
        "%nbdist start --ip 0.0.0.0",
        "--ip 0.0.0.0 would open the controller and the unauthenticated rendezvous store beyond "
        "this machine, but every engine runs here: leave --ip out (loopback); for engines on "
        "other hosts use --hosts or --cluster-file",
    ),
    ("%nbdist start --ip '*'", "--ip * would open the controller"),
    ("%nbdist start --ip nowhere", "--ip 'nowhere' is not an IP address"),
    ("%nbdist start --hosts=-oProxyCommand=x:1", "'-oProxyCommand=x' is not a host name"),
    ("%nbdist start --hosts='-oProxyCommand=x@gpu1'", "'-oProxyCommand=x' is not a user name"),
    ("%nbdist attach nbdist-nosuch", "no running cluster 'nbdist-nosuch'"),
    ("import nbdist\nnbdist.start(n=True)", "the number of engines must be a whole number >= 1"),
]


def test_start_refuses_in_one_line_and_starts_nothing(kernel):
    kernel.ok("%nbdist stop")
    before = set(kernel.descendants())  # the spare fork server of %load_ext, no more
    assert len(before) <= 1, before
    for code, expected in START:
        r = one_line(kernel, code, expected)
        assert r.seconds < 10, (code, r.seconds)
    assert set(kernel.descendants()) <= before, "a refused start left a process behind"


def test_cell_options_are_refused_before_any_rank_runs_the_cell(nb, tmp_path):
    mark = tmp_path / "ran"
    script = tmp_path / "script.py"
    script.write_text(f"open({str(mark)!r}, 'w')\n")
    cases = [
        ("--timeout nan", "--timeout must be a positive number of seconds (leave --timeout out "),
        ("--timeout inf", "not inf"),
        ("--timeout -1", "not -1.0"),
        ("--progress-timeout 0", "--progress-timeout must be a number of seconds >= 2"),
        ("--progress-timeout nan", "--progress-timeout must be a number of seconds >= 2"),
        ("--progress-timeout -5", "not -5.0"),
        ("--ranks 0,0", "--ranks names rank(s) 0 twice: name each rank once"),
        ("--ranks ''", "--ranks names no rank: name some, like 0,2"),
        ("--ranks 5", "--ranks must name ranks between 0 and 1"),
        (
            "--restarts 1 --min-workers 5",
            "--min-workers 5 but the cluster has 2 ranks: give at most 2",
        ),
        ("--min-workers 1", "--min-workers only acts when a lost worker is not replaced"),
        ("--restarts 100000", "--restarts must be a whole number between 0 and 100"),
        ("--total 99999999999999999999", "expected at most 1e+15 steps"),
    ]
    for options, expected in cases:
        one_line(nb, f"%%distributed {options}\nopen({str(mark)!r}, 'w')", expected)
    for options, expected in cases[:2] + cases[6:8]:
        one_line(nb, f"%nbdist run {options} {script}", expected)
    assert not mark.exists(), "a refused cell ran"
    assert nb.ok(ALIVE).result == "2.0"


def test_pull_scatter_and_start_arguments_are_one_line(nb):
    cases = [
        ("%nbdist pull X --rank 5", "rank must be a whole number between 0 and 1, not 5"),
        ("nbdist.pull('X', rank=True)", "rank must be a whole number between 0 and 1, not True"),
        ("nbdist.pull('X', rank='1')", "not '1'"),
        ("nbdist.pull(3)", "3 is not a variable name"),
        ("%nbdist pull X --as 'a b'", "--as 'a b' is not a variable name"),
        ("%nbdist scatter X --stratify yf", "stratify has labels that are not whole numbers"),
        ("%nbdist scatter X --stratify yn", "stratify has a NaN or infinite label (row 3)"),
        ("%nbdist scatter X --stratify short", "stratify has 5 labels but the data has 20 rows"),
        ("nbdist.scatter('X', [1, 2, 3])", "but the data is a list: convert it"),
        ("nbdist.scatter('X', X, seed=1.5)", "seed must be a whole number >= 0"),
        ("nbdist.start(n=2.0)", "the number of engines must be a whole number >= 1, not 2.0"),
        ("nbdist.start(threads_per_engine='2')", "threads_per_engine (--threads) must be"),
        # options are checked before "already running": the flag parses, the config takes it
        ("%nbdist start -n 2 --threads 64 --oversubscribe", "a cluster is already running"),
    ]
    for code, expected in cases:
        one_line(nb, code, expected)
    assert nb.ok(ALIVE).result == "2.0"


def test_repeated_scatters_do_not_pile_up_and_del_frees_the_array(nb):
    r = nb.ok(
        "big = np.ones((4000, 64), np.float32)\nref = weakref.ref(big)\n"
        "before = sum(callable(e) for e in nbdist.current().journal)\n"
        "for i in range(3):\n"
        "    nbdist.scatter('big', big if i % 2 else big[:2000])\n"
        "nbdist.scatter('small', big[:10])\n"
        "del big\ngc.collect()\n"
        "(ref() is None, sum(callable(e) for e in nbdist.current().journal) - before)"
    )
    assert r.result == "(True, 2)"


def test_recovery_scatters_live_data_again_and_names_deleted_data(nb, tmp_path):
    nb.ok(
        "nbdist.scatter('X', X, shuffle=False)\n"
        "gone = np.ones((20, 2))\nnbdist.scatter('gone', gone)\ndel gone\ngc.collect();"
    )
    mark = tmp_path / "killed"
    r = nb.ok(
        "%%distributed --restarts 1 --no-dashboard\n"
        "import os, signal\n"
        f"if nbdist.rank() == 1 and not os.path.exists({str(mark)!r}):\n"
        f"    open({str(mark)!r}, 'w').close()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "len(X)",
        timeout=120,
    )
    assert mark.exists() and r.result == "10"
    assert (
        "nbdist: the data scattered as 'gone' was deleted in the notebook (or was a temporary "
        "copy): the fresh engines have no gone; scatter it again"
    ) in r.stdout
    assert "recovered 1 time(s)" in r.stdout
    fresh = nb.ok("%%distributed --ranks 1\n('gone' in globals(), X[:, 0].tolist())").result
    assert fresh == "(False, [20.0, 22.0, 24.0, 26.0, 28.0, 30.0, 32.0, 34.0, 36.0, 38.0])"
    assert nb.ok(ALIVE).result == "2.0"


def test_an_engine_that_dies_while_starting_fails_at_once_with_its_exit(nb):
    r = nb.ok(
        "import time\nfrom pathlib import Path\nc = nbdist.current()\n"
        "f = Path(c.engines.cluster_file).parent / "
        "f'ipcontroller-{c.engines.cluster_id}-engine.json'\n"
        "good = f.read_text()\nf.write_text('{not json')\nt0 = time.monotonic()\n"
        "try:\n"
        "    c.engines.add_engines(1, set(c.client.ids))\n"
        "    outcome = 'started'\n"
        "except Exception as e:\n"
        "    outcome = f'{type(e).__name__}: {e}'\n"
        "finally:\n"
        "    f.write_text(good)\n"
        "print(outcome)\nprint(round(time.monotonic() - t0, 2))"
    )
    outcome, seconds = r.stdout.strip().splitlines()
    assert outcome.startswith("NbdistError: an engine (pid "), outcome
    assert "exited with status 1 while starting" in outcome and "its log: " in outcome
    assert float(seconds) < 10  # the start timeout is 60 s
    assert nb.ok(ALIVE).result == "2.0"


# -- the Python API, directly (nothing is started: each is refused first) -----------------------
@pytest.mark.parametrize(
    "call, expected",
    [
        (lambda: nbdist.start(n=100000), f"100000 engines: this machine has {CPUS} CPU(s)"),
        (lambda: nbdist.start(n="2"), "the number of engines must be a whole number >= 1"),
        (lambda: nbdist.start(threads_per_engine=2.5), "threads_per_engine (--threads) must"),
        (lambda: nbdist.start(threads_per_engine=10**6), "threads per engine: this machine"),
        (lambda: nbdist.start(ip="0.0.0.0"), "every engine runs here: leave --ip out"),
        (lambda: nbdist.start(ip=5), "--ip 5 is not an IP address"),
        (lambda: nbdist.start(oversubscribe="yes"), "oversubscribe must be True or False"),
        (lambda: nbdist.start(hosts=5), "hosts must be a string like user@gpu1:4"),
        (lambda: nbdist.start(hosts="gpu1;id"), "'gpu1;id' is not a host name"),
        (lambda: nbdist.start(cluster_file=3), "cluster_file must be a path"),
        (lambda: CellOptions(timeout="5"), "--timeout must be a positive number of seconds"),
        (lambda: CellOptions(timeout=float("nan")), "not nan"),
        (lambda: CellOptions(ranks=0), "--ranks must be a list of ranks like (0, 2)"),
        (lambda: CellOptions(ranks=[0, True]), "each of --ranks must be a whole number >= 0"),
        (lambda: CellOptions(restarts=True), "--restarts must be a whole number between 0 and"),
        (lambda: CellOptions(restarts=1, min_workers=0), "--min-workers must be a whole number"),
        (
            lambda: CellOptions(progress_timeout=0.5),
            "--progress-timeout must be a number of seconds >= 2",
        ),
        (lambda: CellOptions(grace=-1), "grace must be a number of seconds >= 0"),
        (lambda: CellOptions(all_output="yes"), "all_output must be True or False"),
    ],
)
def test_python_api_refusals_are_one_line(call, expected):
    with pytest.raises(UsageError) as e:
        call()
    assert expected in str(e.value) and "\n" not in str(e.value)
    assert nbdist.current(required=False) is None


def test_what_is_accepted_is_normalised():
    assert CellOptions(ranks=[1, np.int64(0)]).ranks == (1, 0)
    assert CellOptions(timeout=np.float32(2)).timeout == 2.0
    assert type(ClusterConfig(n=np.int64(2)).n) is int
    assert hosts.cluster_config(100000, oversubscribe=True).n == 100000
    assert hosts.cluster_config(2, threads_per_engine=CPUS).threads == CPUS
    assert hosts.cluster_config(2, ip="127.0.0.1").ip == "127.0.0.1"


# -- the remote Python's path is one word on the host's command line ----------------------------
def test_a_remote_python_path_with_spaces_and_shell_characters_starts_engines(tmp_path):
    need_sshd()
    sshd = Sshd(tmp_path / "sshd")
    try:
        folder = tmp_path / "my env $HOME;touch pwned"
        folder.mkdir()
        os.symlink(sys.executable, folder / "python")
        f = cluster_file(
            tmp_path / "cluster.toml",
            [sshd.host(engines=1, python=str(folder / "python"))],
            remote_dir=str(tmp_path / "remote"),
        )
        with nbdist.start(cluster_file=f) as c:
            assert c.run("import sys\nsys.executable") == str(folder / "python")
        assert not list(tmp_path.rglob("pwned"))
    finally:
        sshd.stop()
