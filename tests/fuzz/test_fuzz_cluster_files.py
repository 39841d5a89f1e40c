"""Hostile cluster files and ``--hosts`` strings: read, validated and refused in one line.

Reading a cluster file connects nowhere (``hosts.cluster_config`` is pure), so every example
runs in this process: it becomes a ClusterConfig or one UsageError, never another exception.
Accepted configurations are checked for what must never reach ssh: a host or user that starts
with ``-`` (an ssh option such as ``-oProxyCommand=...``).
"""

from __future__ import annotations

import json

from fuzzing import FUZZ, NASTY, text_values
from hypothesis import given
from hypothesis import strategies as st

from nbdist.errors import UsageError
from nbdist.notebook.cluster import hosts

KEYS = [*sorted(hosts.FILE_KEYS - {"hosts", "launcher_options"}), "no_such_key"]
HOST_KEYS = ["host", "user", "engines", "port", "interface", "python", "environment", "extra"]

toml_values = st.one_of(
    st.booleans(),
    st.integers(-(2**31), 2**31),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(NASTY),
    st.lists(st.sampled_from(NASTY), max_size=3),
    st.dictionaries(st.sampled_from(["A", "NCCL_DEBUG", "-x", "A B"]), st.sampled_from(NASTY)),
)


def _toml(value) -> str:
    """``value`` as a TOML value (JSON's strings, numbers and arrays are TOML's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def _check(make) -> None:
    try:
        cfg = make()
    except UsageError as e:
        assert "\n" not in str(e), f"a UsageError of more than one line: {e}"
        return
    if cfg.remote is not None:
        for h in cfg.remote.hosts:
            assert not str(h.name).startswith("-"), f"host {h.name!r} would reach ssh as an option"
            assert not str(h.user or "").startswith("-"), f"user {h.user!r} reaches ssh"


@FUZZ
@given(
    top=st.dictionaries(st.sampled_from(KEYS), toml_values, max_size=4),
    host_list=st.lists(st.dictionaries(st.sampled_from(HOST_KEYS), toml_values), max_size=3),
    garbage=st.one_of(st.just(""), st.sampled_from(["[[hosts", "= 1", "\x00", "ü = ü"])),
)
def test_cluster_files(tmp_path_factory, top, host_list, garbage):
    lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
    for h in host_list:
        lines += ["[[hosts]]", *(f"{k} = {_toml(v)}" for k, v in h.items())]
    path = tmp_path_factory.mktemp("cluster-file") / "cluster.toml"
    path.write_text("\n".join(lines) + "\n" + garbage)
    _check(lambda: hosts.cluster_config(None, cluster_file=str(path)))


@FUZZ
@given(spec=st.lists(st.tuples(text_values, text_values, text_values), min_size=1, max_size=3))
def test_hosts_strings(spec):
    text = ",".join(f"{user}@{host}:{n}" for user, host, n in spec)
    _check(lambda: hosts.cluster_config(None, hosts=text))


@FUZZ
@given(text=text_values, n=st.one_of(st.none(), st.integers(-5, 10**6)))
def test_hosts_strings_raw(text, n):
    _check(lambda: hosts.cluster_config(n, hosts=text))
