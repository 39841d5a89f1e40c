"""What reaches a batch script or a command line holds no control character: a newline in a
launcher option would become a line of the Slurm batch script. Refused in one line naming the
option, before anything runs."""

from __future__ import annotations

import warnings

import pytest

from nbdist.errors import UsageError
from nbdist.notebook.cluster import hosts
from nbdist.notebook.cluster.engines.remote import launchers
from nbdist.remote_config import HostSpec, RemoteConfig


def _refused(make) -> str:
    with pytest.raises(UsageError) as info:
        make()
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize(
    "options, named",
    [
        ({"account": "ml\n#SBATCH --wrap=evil"}, "launcher option account 'ml\\n#SBATCH"),
        ({"qos": "normal\r"}, "launcher option qos 'normal\\r'"),
        ({"options": "--mem=4G\x1b[2J"}, "launcher option options '--mem=4G\\x1b[2J'"),
        ({"options": "--mem=4G\u2028--x"}, "launcher option options '--mem=4G\\u2028--x'"),
        ({"engine_args": ["--a", "b\nc"]}, "launcher option engine_args 'b\\nc'"),
        ({"environment": {"A": "x\ny"}}, "launcher option environment: A 'x\\ny'"),
        ({"environment": {"A\nB": "x"}}, "launcher option environment: the key 'A\\nB'"),
        ({"acc\nount": "ml"}, "launcher option 'acc\\nount': option names are words"),
        ({"batch_template": "#!/bin/sh\n\x00"}, "launcher option batch_template"),
    ],
)
def test_a_control_character_in_a_launcher_option_is_refused_by_name(options, named):
    text = _refused(lambda: RemoteConfig(launcher="slurm", launcher_options=options))
    assert text.startswith(named), text
    # the same through nbdist.start's options, which read a cluster file the same way
    assert _refused(lambda: hosts.cluster_config(launcher="slurm", launcher_options=options))


def test_a_newline_in_a_cluster_file_launcher_option_is_refused(tmp_path):
    f = tmp_path / "cluster.toml"
    f.write_text('launcher = "slurm"\n[launcher_options]\naccount = "ml\\n#SBATCH --wrap=x"\n')
    text = _refused(lambda: hosts.cluster_config(cluster_file=str(f)))
    assert text.startswith("launcher option account 'ml\\n#SBATCH --wrap=x' holds a control")


def test_a_batch_template_may_hold_lines_and_ordinary_options_pass():
    template = "#!/bin/sh\n#SBATCH --ntasks={n}\n\tsrun {program_and_args}\n"
    rc = RemoteConfig(
        launcher="slurm",
        launcher_options={"batch_template": template, "account": "ml", "options": "--mem=4G"},
    )
    assert rc.launcher_options["batch_template"] == template


def test_options_converted_for_the_launcher_are_checked_again():
    """``--launcher-opt KEY=VALUE`` strings are converted to the option's type; a table or a
    list written with escapes becomes real newlines only then."""
    with warnings.catch_warnings():  # traitlets: a table in one string is deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        opts = {"environment": '{"A": "x\\ny"}'}
        text = _refused(lambda: launchers.launcher_options("slurm", opts))
    assert text.startswith("launcher option environment: A 'x\\ny' holds a control")
    assert launchers.launcher_options("slurm", {"account": "ml"}) == {"account": "ml"}


def test_the_batch_script_gets_one_line_per_option(tmp_path):
    given = {"options": "--mem=4G -C 'a100 b'", "account": "ml", "queue": "gpu"}
    opts = launchers.launcher_options("slurm", {**given, "gpus_per_node": "2"})
    la = launchers.SlurmEngineSetLauncher(work_dir=str(tmp_path), **opts)
    la.write_batch_script(2)
    lines = open(la.batch_file).read().splitlines()
    sbatch = [ln for ln in lines if ln.startswith("#SBATCH")]
    assert sbatch[:6] == [
        "#SBATCH --ntasks=2",
        "#SBATCH --gpus-per-node=2",
        "#SBATCH --mem=4G",
        "#SBATCH -C 'a100 b'",
        "#SBATCH --account=ml",
        "#SBATCH --partition=gpu",
    ]
    assert lines[0] == "#!/bin/sh" and len(lines) == len(sbatch) + 2  # and the srun line


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("ssh_options", ("-o", "ProxyCommand=x\ny"), "host gpu1: ssh option 'ProxyCommand=x\\ny'"),
        ("environment", {"NCCL_DEBUG": "WARN\nrm"}, "host gpu1: environment: NCCL_DEBUG"),
        ("python", "python3\n", "host gpu1: name the Python"),
    ],
)
def test_a_control_character_in_a_host_setting_is_refused_by_name(field, value, named):
    assert _refused(lambda: HostSpec("gpu1", **{field: value})).startswith(named)
