"""Hosts, cluster files, ssh's failures and the one-environment check: pure, no ssh needed."""

from __future__ import annotations

import dataclasses

import pytest

from nbdist.config import ClusterConfig, HostSpec, RemoteConfig
from nbdist.errors import UsageError
from nbdist.notebook.cluster import hosts, inventory
from nbdist.protocol import GpuInfo, Inventory


# -- --hosts -----------------------------------------------------------------------------------
def test_hosts_string_gives_users_names_and_engine_counts():
    specs = hosts.parse_hosts("alice@gpu1:4, bob@gpu2:2,gpu3")
    assert [(h.user, h.name, h.engines) for h in specs] == [
        ("alice", "gpu1", 4),
        ("bob", "gpu2", 2),
        (None, "gpu3", 1),
    ]
    assert [h.location for h in specs] == ["alice@gpu1", "bob@gpu2", "gpu3"]


def test_hosts_string_takes_defaults_for_every_host():
    specs = hosts.parse_hosts("a:1,b:1", python="/opt/py/bin/python", interface="ib0")
    assert {(h.python, h.interface) for h in specs} == {("/opt/py/bin/python", "ib0")}


@pytest.mark.parametrize(
    "text, words",
    [
        ("gpu1:0", "number >= 1"),
        ("gpu1:four", "number >= 1"),
        ("gpu1,,gpu2", "empty entry"),
        ("a@b@c:2", "not user@host:engines"),
        ("[::1]:2", "IPv6"),
        ("gpu1:2,gpu1:2", "named twice"),
    ],
)
def test_bad_hosts_strings_say_what_to_write(text, words):
    with pytest.raises(UsageError, match=words):
        hosts.parse_hosts(text)


# -- cluster files -----------------------------------------------------------------------------
_TOML = """
python = "/opt/envs/train/bin/python"
interface = "eth1"
ssh_options = ["-i", "~/.ssh/id_gpu"]
env_check = "warn"
allow_mixed = true

[[hosts]]
host = "gpu1"
user = "alice"
engines = 4
port = 2222
interface = "ib0"
environment = { NCCL_DEBUG = "WARN" }

[[hosts]]
host = "gpu2"
user = "alice"
engines = 4
"""


def test_a_toml_cluster_file_names_hosts_engines_python_ssh_and_interface(tmp_path):
    f = tmp_path / "cluster.toml"
    f.write_text(_TOML)
    cfg = hosts.cluster_config(cluster_file=str(f))
    assert cfg.n == 8 and cfg.allow_mixed is True
    rc = cfg.remote
    assert rc.launcher == "ssh" and rc.env_check == "warn"
    gpu1, gpu2 = rc.hosts
    assert (gpu1.location, gpu1.engines, gpu1.port) == ("alice@gpu1", 4, 2222)
    assert gpu1.interface == "ib0"
    assert gpu2.interface == "eth1"  # the file's default
    assert gpu1.python == gpu2.python == "/opt/envs/train/bin/python"
    assert gpu1.ssh_options == ("-i", "~/.ssh/id_gpu")
    assert gpu1.environment == {"NCCL_DEBUG": "WARN"}


def test_explicit_options_win_over_the_cluster_file(tmp_path):
    f = tmp_path / "cluster.toml"
    f.write_text(_TOML)
    cfg = hosts.cluster_config(cluster_file=str(f), env_check="refuse", ip="10.0.0.5")
    assert cfg.remote.env_check == "refuse" and cfg.remote.ip == "10.0.0.5"
    cfg = hosts.cluster_config(cluster_file=str(f), hosts="bob@gpu9:2")
    assert [h.location for h in cfg.remote.hosts] == ["bob@gpu9"] and cfg.n == 2


def test_a_yaml_cluster_file_reads_the_same(tmp_path):
    pytest.importorskip("yaml")
    f = tmp_path / "cluster.yaml"
    f.write_text("hosts:\n  - {host: gpu1, user: alice, engines: 2}\npython: /usr/bin/python3\n")
    cfg = hosts.cluster_config(cluster_file=str(f))
    assert cfg.n == 2 and cfg.remote.hosts[0].python == "/usr/bin/python3"


@pytest.mark.parametrize(
    "text, words",
    [
        ("hosts = 3", "list of \\[\\[hosts\\]\\] tables"),
        ("colour = 'red'\n[[hosts]]\nhost = 'a'", "unknown key\\(s\\) colour"),
        ("[[hosts]]\nhost = 'a'\ncolour = 'red'", "unknown key\\(s\\) colour"),
        ("[[hosts]]\nuser = 'a'", "needs host ="),
        ("[[hosts]]\nhost = 'a'\nengines = 0", "engines must be a whole number"),
        ("[[hosts]]\nhost = 'a'\nport = 70000", "port must be between"),
        ("launcher = 'pbs'", "--launcher must be one of"),
        ("env_check = 'maybe'\n[[hosts]]\nhost = 'a'", "env_check must be"),
        ("[[hosts]\nhost = 'a'", "not valid TOML"),
    ],
)
def test_bad_cluster_files_get_one_line_naming_the_fix(tmp_path, text, words):
    f = tmp_path / "cluster.toml"
    f.write_text(text)
    with pytest.raises(UsageError, match=words) as e:
        hosts.cluster_config(cluster_file=str(f))
    assert "\n" not in str(e.value)


def test_a_missing_cluster_file_is_named(tmp_path):
    with pytest.raises(UsageError, match="no cluster file at .*nope.toml"):
        hosts.cluster_config(cluster_file=str(tmp_path / "nope.toml"))


def test_n_must_match_the_hosts():
    with pytest.raises(UsageError, match="-n 3 but the hosts have 4 engines"):
        hosts.cluster_config(3, hosts="a:2,b:2")
    assert hosts.cluster_config(4, hosts="a:2,b:2").n == 4


def test_local_start_options_stay_local_and_remote_only_options_need_hosts():
    cfg = hosts.cluster_config(3, threads_per_engine=1, hosts=None, launcher=None)
    assert cfg == ClusterConfig(n=3, threads_per_engine=1)
    assert hosts.cluster_config().n == 2
    with pytest.raises(UsageError, match="env_check: for engines on other hosts"):
        hosts.cluster_config(2, env_check="warn")
    with pytest.raises(UsageError, match="unknown option\\(s\\) colour"):
        hosts.cluster_config(2, colour="red")


def test_launchers_other_than_ssh_take_n_and_no_hosts():
    cfg = hosts.cluster_config(8, launcher="slurm", launcher_options={"account": "ml"})
    assert cfg.n == 8 and cfg.remote.launcher == "slurm"
    assert cfg.remote.launcher_options == {"account": "ml"}
    with pytest.raises(UsageError, match="ssh launcher needs hosts"):
        hosts.cluster_config(2, launcher="ssh")
    with pytest.raises(UsageError, match="hosts are for the ssh launcher"):
        RemoteConfig(launcher="mpi", hosts=(HostSpec("a"),))


def test_the_controller_never_listens_everywhere_by_default():
    assert RemoteConfig(hosts=(HostSpec("a"),)).ip is None  # chosen: one reachable address
    assert ClusterConfig(n=1).ip == "127.0.0.1"


# -- ssh's failures in words -------------------------------------------------------------------
_H = HostSpec("gpu2", user="alice", port=2222)


@pytest.mark.parametrize(
    "code, stderr, words",
    [
        (255, "ssh: Could not resolve hostname gpu2: Name or service not known", "no such host"),
        (255, "ssh: connect to host gpu2 port 2222: Connection timed out", "did not answer"),
        (255, "Connection timed out during banner exchange", "did not answer within 5 s"),
        (255, "ssh: connect to host gpu2 port 2222: Connection refused", "refused the connection"),
        (255, "ssh: connect to host gpu2 port 22: No route to host", "cannot be reached"),
        (255, "Host key verification failed.", "host key is not known"),
        (255, "alice@gpu2: Permission denied (publickey).", "refused the login as user alice"),
        (127, "sh: 1: python3: not found", "no Python at 'python3'"),
        (127, "bash: /opt/py/bin/python: No such file or directory", "no Python at"),
        (1, "Traceback ...\nSyntaxError: invalid syntax", "python3 failed"),
    ],
)
def test_each_ssh_failure_is_one_line_naming_the_host_and_the_fix(code, stderr, words):
    msg = hosts.ssh_failure(_H, code, stderr, connect_timeout=5)
    assert msg.startswith("host gpu2") and words in msg and "\n" not in msg


def test_login_failures_say_how_to_authorize_the_key():
    msg = hosts.ssh_failure(_H, 255, "Permission denied (publickey).", 5)
    assert "ssh-copy-id alice@gpu2" in msg


def test_a_python_without_nbdist_says_what_to_install():
    msg = hosts.missing_modules(_H, ["torch", "nbdist"], "/usr/bin/python3")
    assert msg == (
        "host gpu2: the Python there (/usr/bin/python3) lacks torch, nbdist: install them in "
        "that environment (pip install torch nbdist), or name another Python for the host"
    )


def test_ssh_never_prompts_and_gives_up_in_time():
    cmd = hosts.ssh_command(dataclasses.replace(_H, ssh_options=("-i", "k")), 7.4)
    assert cmd[0] == "ssh" and "BatchMode=yes" in cmd and "ConnectTimeout=7" in cmd
    assert cmd[-4:] == ["-i", "k", "-p", "2222"]


# -- one environment ---------------------------------------------------------------------------
def _inv(host, python="3.11.7", torch="2.4.0", nbdist="0.1.0", gpus=0):
    gpu = GpuInfo(name="NVIDIA A100-SXM4-80GB", memory=80 * 2**30)
    return Inventory(
        host=host, pid=1, threads=1, python=python, torch=torch, nbdist=nbdist, gpus=(gpu,) * gpus
    )


def test_hosts_that_agree_pass_and_show_one_row_each():
    inv = {0: _inv("gpu1", gpus=2), 1: _inv("gpu1", gpus=2), 2: _inv("gpu2", gpus=2)}
    inventory.check(inv)
    rows = inventory.host_rows(inv)
    assert [(r["host"], r["engines"], r["cuda"]) for r in rows] == [
        ("gpu1", 2, "yes (2 GPUs)"),
        ("gpu2", 1, "yes (2 GPUs)"),
    ]
    text = inventory.table(rows)
    assert text.splitlines()[0].split() == ["host", "engines", "python", "torch", "nbdist", "cuda"]
    assert "gpu2" in text.splitlines()[2]


def test_hosts_that_differ_are_named_with_their_versions():
    inv = {
        0: _inv("gpu1", gpus=1),
        1: _inv("gpu2", torch="2.3.1", gpus=1),
        2: _inv("gpu3", python="3.10.12", gpus=0),
    }
    assert inventory.differences(inventory.host_rows(inv)) == [
        "Python 3.10.12 on gpu3 (3.11.7 on gpu1)",
        "torch 2.3.1 on gpu2 (2.4.0 on gpu1)",
        "CUDA differs on gpu3 (gpu1 has it)",
    ]
    with pytest.raises(UsageError, match="environments differ: Python 3.10.12 on gpu3") as e:
        inventory.check(inv, "refuse")
    assert "--env-check warn" in str(e.value) and "\n" not in str(e.value)


def test_differences_warn_instead_when_asked():
    inv = {0: _inv("gpu1"), 1: _inv("gpu2", nbdist="0.2.0")}
    with pytest.warns(UserWarning, match="nbdist 0.2.0 on gpu2 \\(0.1.0 on gpu1\\)"):
        inventory.check(inv, "warn")


def test_gpu_counts_may_differ_but_cuda_availability_may_not():
    inv = {0: _inv("gpu1", gpus=8), 1: _inv("gpu2", gpus=4)}
    assert inventory.differences(inventory.host_rows(inv)) == []


# -- names that reach ssh's command line, and what a host can run --------------------------------
@pytest.mark.parametrize(
    "text, words",
    [
        ("-oProxyCommand=x:1", "is not a host name"),
        ("-oProxyCommand=x@gpu1:1", "'-oProxyCommand=x' is not a user name"),
        ("gpu1;id:1", "'gpu1;id' is not a host name"),
        ("$(id)@gpu1", "is not a user name"),
        ("gpu`id`", "is not a host name"),
    ],
)
def test_host_and_user_names_that_ssh_would_read_as_options_or_a_shell_would_run(text, words):
    with pytest.raises(UsageError, match=words) as e:
        hosts.parse_hosts(text)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "host, words",
    [
        ({"host": "-oProxyCommand=touch /tmp/x"}, "is not a host name"),
        ({"host": "gpu1", "user": "-l root"}, "is not a user name"),
        ({"host": "gpu1", "interface": "eth0; id"}, "is not a valid interface"),
        ({"host": "gpu1", "environment": {"A;id": "1"}}, "environment must be a table"),
        ({"host": "gpu1", "python": "python3\nid"}, "name the Python to run there"),
    ],
)
def test_cluster_file_hosts_are_refused_when_not_plausible(tmp_path, host, words):
    f = tmp_path / "cluster.toml"
    f.write_text("[[hosts]]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in host.items()))
    with pytest.raises(UsageError, match=words) as e:
        hosts.cluster_config(cluster_file=str(f))
    assert "\n" not in str(e.value)


def _toml_value(v) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml_value(x)}' for k, x in v.items()) + " }"
    return '"' + v.replace("\n", "\\n") + '"'


def test_ordinary_names_addresses_and_pythons_pass():
    (spec,) = hosts.parse_hosts("alice.b-c_1@gpu-1.example.org:2", python="/opt/my env/python")
    assert (spec.user, spec.name, spec.python) == (
        "alice.b-c_1",
        "gpu-1.example.org",
        "/opt/my env/python",
    )
    assert HostSpec("10.0.0.5", interface="ib0", address="fe80::1%ib0").name == "10.0.0.5"


def test_engines_and_threads_per_host_are_bounded_by_its_cpus_unless_oversubscribed():
    from nbdist import config
    from nbdist.notebook.cluster.engines.remote import checks

    facts = {"gpu1": checks.HostFacts("3.11", "/usr/bin/python3", 4, None)}
    many = hosts.cluster_config(hosts="gpu1:17")
    with pytest.raises(UsageError) as e:
        checks.threads_per_engine(many, facts)
    assert str(e.value) == (
        "17 engines: host gpu1 has 4 CPU(s), enough for at most 16 (4 per CPU, at least 8): "
        "use fewer, or add --oversubscribe (oversubscribe=True) if you mean it"
    )
    with pytest.raises(UsageError, match="5 threads per engine: host gpu1 has 4 CPU"):
        checks.threads_per_engine(hosts.cluster_config(hosts="gpu1:2", threads_per_engine=5), facts)
    assert checks.threads_per_engine(hosts.cluster_config(hosts="gpu1:16"), facts) == 1
    over = hosts.cluster_config(hosts="gpu1:17", threads_per_engine=8, oversubscribe=True)
    assert checks.threads_per_engine(over, facts) == 8
    assert config.engine_limit(1) == 8 and config.engine_limit(64) == 256


def test_a_cluster_file_can_say_oversubscribe(tmp_path):
    f = tmp_path / "cluster.toml"
    f.write_text('oversubscribe = true\n[[hosts]]\nhost = "gpu1"\nengines = 2\n')
    assert hosts.cluster_config(cluster_file=str(f)).oversubscribe


def test_schedulers_refuse_only_absurd_engine_counts():
    assert hosts.cluster_config(4096, launcher="slurm").n == 4096
    with pytest.raises(UsageError, match="100000 engines from slurm: more than 4096"):
        hosts.cluster_config(100000, launcher="slurm")
    assert hosts.cluster_config(100000, launcher="slurm", oversubscribe=True).n == 100000


def test_the_local_launcher_keeps_the_controller_on_loopback():
    with pytest.raises(UsageError, match="every engine runs here"):
        hosts.cluster_config(2, launcher="local", ip="0.0.0.0")
    assert hosts.cluster_config(2, launcher="local", ip="127.0.0.1").remote.ip == "127.0.0.1"
