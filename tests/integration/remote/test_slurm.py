"""Engines through a real Slurm: a private single-node cluster (munged, slurmctld, slurmd from
``tests/slurm.py``, started once for these tests and stopped by PID at the end), the slurm
launcher end to end (start, a DDP cell, status, stop), a killed kernel, a job queued past
``--start-timeout``, bad scheduler input refused before anything is submitted, and a job ended
from outside (``scancel``): named with its reason, and resumed on a new job with ``--restarts``.

Every test leaves the queue empty (polled with a deadline): nothing is left behind.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import textwrap
import threading
import time
import uuid

import pytest
import slurm as private_slurm
from kernels import shutdown_kernel, start_kernel
from paths import ROOT
from processes import assert_gone, wait_until

import nbdist
from nbdist.config import CellOptions
from nbdist.errors import UsageError
from nbdist.server.clusters import Clusters

ALL_REDUCE = textwrap.dedent(
    """
    import torch
    t = torch.ones(1) * (nbdist.rank() + 1)
    torch.distributed.all_reduce(t)
    int(t.item())
    """
)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A private single-node Slurm; ``SLURM_CONF`` set for this process and its children."""
    if reason := private_slurm.unavailable():
        pytest.skip(reason)
    home = tmp_path_factory.mktemp("slurm")
    home.chmod(0o700)
    try:
        s = private_slurm.Slurm(home)
    except RuntimeError as exc:
        pytest.skip(f"a private Slurm cannot start here: {str(exc).splitlines()[0]}")
    old = os.environ.get("SLURM_CONF")
    s.activate()
    yield s
    s.stop()
    assert not s.steps_left()
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


def _queue_empty(s, timeout: float = 20.0) -> None:
    wait_until(lambda: not s.jobs(), timeout, 0.1, what=f"an empty queue (squeue: {s.jobs()})")


PIDS = "print([p.pid for p in nbdist.current().engines.processes()])"


def _job_ids(c) -> list[str]:
    return [j.job_id for j in c.engines.jobs.jobs.values()]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing (batch script, slurm-N.out) may land in the notebook's
    return tmp_path


def guide_cluster_file() -> str:
    """The cluster file of the Slurm section of the remote hosts guide, as written there."""
    text = (ROOT / "docs" / "guide" / "remote-hosts.md").read_text()
    section = text[text.index("## Slurm") :]
    return section.split("```toml\n", 1)[1].split("```", 1)[0]


def test_magics_start_train_status_and_stop_through_slurm(slurm, in_tmp):
    f = in_tmp.parent / f"{in_tmp.name}-slurm.toml"
    f.write_text(guide_cluster_file())
    k = start_kernel()
    try:
        # bad input: one line (the scheduler's own reason where it judges), before any engine
        for line, words in [
            ("--launcher mpi --partition gpu", "--partition: for the slurm launcher, not mpi"),
            ("--launcher slurm --time 1:xx", "--time '1:xx' is not a Slurm time limit: write "),
            ("--launcher slurm --partition nope", "slurm refused the job: invalid partition"),
            ("--launcher slurm --gpus-per-node 1", "Invalid generic resource (gres) spec"),
            ("--launcher slurm --gpus-per-node two", "argument --gpus-per-node: invalid int"),
        ]:
            r = k.run(f"%nbdist start -n 2 --ip 127.0.0.1 {line}")
            assert r.error and r.error["ename"] == "UsageError", (line, r.error)
            assert words in r.error["evalue"] and "\n" not in r.error["evalue"], r.error["evalue"]
        assert not slurm.jobs()
        # a queued job: said at once, with the scheduler's reason; cancelled at the deadline
        r = k.run(f"%nbdist start --cluster-file {f} --partition held --start-timeout 2")
        assert "is queued (PartitionDown); waiting up to 2 s (--start-timeout)" in r.stdout
        assert "still queued after 2 s (PartitionDown); it was cancelled" in r.error["evalue"]
        _queue_empty(slurm)
        # the guide's cluster file, with --time given as an option (it wins over the file's)
        r = k.ok(f"%nbdist start --cluster-file {f} --ip 127.0.0.1 --time 10", timeout=120)
        assert "nbdist: 2 ranks ready" in r.stdout, r.stdout
        start_s = float(r.stdout.split(" in ")[-1].split(" s")[0])
        [job] = slurm.jobs()
        assert job.split()[1] == "RUNNING"
        cell = k.ok("%%distributed --no-dashboard\n" + ALL_REDUCE, timeout=60)
        assert cell.result == "3"  # 1 + 2: both ranks took part
        status = k.ok("%nbdist status").stdout.splitlines()
        assert re.fullmatch(rf"slurm job {job.split()[0]}: RUNNING, (10:00|9:\d\d) left", status[0])
        assert status[1].split()[:2] == ["rank", "host"] and len(status) == 5, status
        pids = ast.literal_eval(k.ok(f"import nbdist\n{PIDS}").stdout)
        t0 = time.monotonic()
        assert "cluster stopped" in k.ok("%nbdist stop").stdout
        stop_s = time.monotonic() - t0
        _queue_empty(slurm)
        assert_gone(pids)
        print(f"slurm: started in {start_s:.1f} s, stopped in {stop_s:.2f} s")
        assert not list(in_tmp.iterdir())  # no batch script, no slurm-N.out
        # a kernel shut down with its cluster running: the job is cancelled on the way out
        k.ok("%nbdist start -n 1 --launcher slurm --ip 127.0.0.1", timeout=120)
        assert len(slurm.jobs()) == 1
    finally:
        shutdown_kernel(k)
    _queue_empty(slurm, timeout=10)


def test_a_killed_kernel_leaves_no_job(slurm, in_tmp):
    k = start_kernel()
    try:
        k.ok("%nbdist start -n 2 --launcher slurm --ip 127.0.0.1", timeout=120)
        pids = ast.literal_eval(k.ok(f"import nbdist\n{PIDS}").stdout)
        assert len(slurm.jobs()) == 1
        os.kill(k.pid, signal.SIGKILL)  # no exit handler runs: the job's guard cancels it
        t0 = time.monotonic()
        _queue_empty(slurm)
        took = time.monotonic() - t0
        print(f"slurm: a killed kernel's job left the queue in {took:.2f} s")
        assert took < 15
        assert_gone(pids, timeout=15)  # the controller and the guard
    finally:
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=True)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"partition": "nope"}, "slurm refused the job: invalid partition specified: nope: name "),
        ({"time": "1:xx"}, "--time '1:xx' is not a Slurm time limit: write MINUTES, HH:MM:SS"),
        ({"gpus_per_node": 1}, "Invalid generic resource (gres) specification: this cluster"),
        ({"launcher_options": {"options": "--mem=99999999"}}, "Requested node configuration"),
    ],
)
def test_bad_scheduler_input_is_one_line_before_anything_starts(slurm, in_tmp, options, words):
    t0 = time.monotonic()
    with pytest.raises(UsageError) as err:
        nbdist.start(n=2, launcher="slurm", ip="127.0.0.1", **options)
    assert words in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert time.monotonic() - t0 < 5
    assert not slurm.jobs()
    assert nbdist.current(required=False) is None


def test_scheduler_words_are_for_slurm_only():
    with pytest.raises(UsageError, match=r"--partition, --time: for the slurm launcher, not mpi"):
        nbdist.start(n=2, launcher="mpi", partition="gpu", time="10")
    with pytest.raises(UsageError, match="--gpus-per-node must be a whole number >= 1, not 0"):
        nbdist.start(n=2, launcher="slurm", gpus_per_node=0)


TRAIN = textwrap.dedent(
    """
    import pathlib, time, torch
    torch.manual_seed(0)
    model = nbdist.prepare(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(nbdist.rank())
    X = torch.randn(32, 4, generator=g)
    y = X.sum(1, keepdim=True)
    flag, log = pathlib.Path(FLAG), pathlib.Path(LOG)
    for step in nbdist.steps(20, every=5, model=model, opt=opt, run=RUN):
        if nbdist.is_main():
            with log.open("a") as f:
                f.write(f"{step}\\n")
            if step == 12 and not flag.exists():
                flag.touch()
                while True:  # the job ends under this rank (scancel from outside)
                    time.sleep(0.05)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(X), y)
        loss.backward()
        opt.step()
    round(loss.item(), 6)
    """
)


def _end_when(s, flag, *cmd: str) -> threading.Event:
    """From a thread: run the Slurm command ``cmd`` once rank 0 wrote ``flag``."""
    done = threading.Event()

    def run() -> None:
        wait_until(flag.exists, 60, what="rank 0 to reach the step to stop at")
        s.run(*cmd)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def test_a_job_ended_from_outside_is_named_and_resumed_on_a_new_job(slurm, in_tmp, capsys):
    c = nbdist.start(n=2, launcher="slurm", ip="127.0.0.1")
    try:
        [first] = _job_ids(c)
        flag, log = in_tmp / "flag", in_tmp / "log"
        src = TRAIN.replace("FLAG", repr(str(flag))).replace("LOG", repr(str(log)))
        # preemption as Slurm does it (PreemptMode=REQUEUE): the job goes back to the queue
        requeued = _end_when(slurm, flag, "scontrol", "requeue", first)
        capsys.readouterr()
        value = c.run(
            src.replace("RUN", repr(f"r-{uuid.uuid4().hex[:6]}")), CellOptions(restarts=1)
        )
        assert requeued.is_set() and isinstance(value, float)
        # one line naming the job and why it ended; the cell resumed on a new job
        [line] = [ln for ln in capsys.readouterr().out.splitlines() if "a new job" in ln]
        assert re.fullmatch(
            rf"nbdist: slurm job {first} (was requeued \(\w+\)|ended: REQUEUED: it was requeued "
            r"\(preempted or its node failed\)); a new job takes its ranks",
            line,
        ), line
        steps = [int(s) for s in log.read_text().split()]
        assert steps == list(range(13)) + list(range(10, 20))  # from the checkpoint after step 9
        [second] = [j for j in _job_ids(c) if j != first]
        assert [j.split()[0] for j in slurm.jobs()] == [second]
        assert c.engines.job_line().startswith(f"slurm job {second}: RUNNING")
        # the sidebar's list: the newest job of this kernel's cluster, as Slurm tells it
        [entry] = [e for e in Clusters().list() if e["cluster_id"] == c.engines.cluster_id]
        assert entry["owner"] == "kernel" and entry["job"]["id"] == second, entry
        assert entry["job"]["state"] == "RUNNING" and entry["job"]["time_left"] == "UNLIMITED"
        assert entry["job"]["line"] == f"slurm job {second}: RUNNING, no time limit"
        # a job ended between cells: its engines' exits name it and the reason
        slurm.run("scancel", second)
        pids = {sl.pid for sl in c.slots}
        exits = wait_until(
            lambda: pids <= set(c.drain_exits()) and c.drain_exits(), 20, what="the exits"
        )
        # known while Slurm still stops the job's processes (COMPLETING), or once it has
        why = rf"left the cluster: slurm job {second} ended: (CANCELLED|COMPLETING): it was cancel"
        said = [exits[p].describe() for p in pids]
        assert all(re.search(why, d) for d in said), said
        line = c.engines.job_line()
        assert re.match(rf"slurm job {second}: (CANCELLED|COMPLETING) \(it was cancelled", line)
    finally:
        c.stop()
    _queue_empty(slurm)


def test_the_job_line_reads_a_real_job(slurm, in_tmp):
    from nbdist.records import slurm as sl

    done = slurm.run("sbatch", "--time=5", "-o", os.devnull, "--wrap=sleep 60")
    job_id = done.stdout.split()[-1]
    try:
        info = wait_until(
            lambda: (i := sl.query(job_id)) and i.state == "RUNNING" and i, 20, what="the job"
        )
        assert re.fullmatch(rf"slurm job {job_id}: RUNNING, (5:00|4:5\d) left", info.line())
        sl.cancel(job_id)
        ending = wait_until(lambda: (i := sl.query(job_id)) and i.ended and i, 10, what="its end")
        assert re.match(
            rf"slurm job {job_id} ended: (CANCELLED|COMPLETING): it was cancel", ending.end_line()
        )
        ended = wait_until(
            lambda: (i := sl.query(job_id)) and i.state != "COMPLETING" and i, 30, what="the end"
        )
        assert ended.end_line().startswith(f"slurm job {job_id} ended: CANCELLED")
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
    _queue_empty(slurm)


def test_a_requeued_job_is_named_requeued_from_its_first_state_after(slurm, in_tmp):
    from nbdist.records import slurm as sl

    done = slurm.run("sbatch", "--requeue", "-o", os.devnull, "--wrap=sleep 60")
    job_id = done.stdout.split()[-1]
    try:
        wait_until(lambda: (i := sl.query(job_id)) and i.state == "RUNNING", 20, what="the job")
        assert sl.query(job_id).restarts == 0
        slurm.run("scontrol", "requeue", job_id)
        info = sl.query(job_id)  # COMPLETING, or already PENDING: never "cancelled"
        assert info.restarts == 1 and info.state in ("COMPLETING", "PENDING", "REQUEUED"), info
        if info.ended:
            assert "it was requeued" in info.end_line(), info.end_line()
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
    _queue_empty(slurm)


# -- pure: the scheduler's words, checked without a scheduler -----------------------------------
def test_slurm_times_are_checked_and_durations_read_as_squeue_writes_them():
    from nbdist.records import slurm as sl
    from nbdist.remote_config import slurm_time

    for ok in ("30", "30:00", "1:30:00", "2-00", "2-12:30", "2-12:30:15", "UNLIMITED", 45):
        assert slurm_time(ok) == str(ok)
    for bad in ("1:xx", "", "0", "-5", "1:99:99:99", "1h", True, 0, 1.5):
        with pytest.raises(UsageError, match="is not a Slurm time limit: write MINUTES"):
            slurm_time(bad)
    assert [sl.seconds(t) for t in ("00:09:41", "1-02:03:04", "5:00", "UNLIMITED")] == [
        581,
        93784,
        300,
        None,
    ]
    assert [sl.clock(s) for s in (581, 3723, 93784, 0)] == ["9:41", "1:02:03", "1-02:03:04", "0:00"]
    info = sl.JobInfo("7", "TIMEOUT", "None", "00:10:00", "00:10:01")
    assert info.end_line() == "slurm job 7 ended: TIMEOUT: it reached its time limit (00:10:00)"
    assert sl.JobInfo("7", "PENDING", "Priority", "1:00", "0:00").line() == (
        "slurm job 7: queued (Priority)"
    )
    # a job being requeued is COMPLETING first: its restart count tells a requeue from a cancel
    requeued = sl.JobInfo("7", "COMPLETING", "None", "10:00", "00:05", restarts=1)
    assert requeued.end_line() == (
        "slurm job 7 ended: REQUEUED: it was requeued (preempted or its node failed)"
    )


def test_scheduler_options_reach_the_batch_script(tmp_path):
    from nbdist.notebook.cluster.engines.remote import launchers
    from nbdist.records import slurm as sl

    opts = launchers.launcher_options(
        "slurm",
        {"queue": "gpu", "timelimit": "10", "gpus_per_node": "2", "options": "--mem=4G -C 'a b'"},
    )
    assert sl.sbatch_args(4, opts) == [
        "--ntasks=4",
        "--partition=gpu",
        "--time=10",
        "--gpus-per-node=2",
        "--mem=4G",
        "-C",
        "a b",
    ]
    la = launchers.SlurmEngineSetLauncher(work_dir=str(tmp_path), profile_dir=str(tmp_path), **opts)
    la.batch_file_name = "job.sbatch"
    la.batch_file = str(tmp_path / "job.sbatch")
    la.write_batch_script(4)
    script = (tmp_path / "job.sbatch").read_text().splitlines()
    for line in ("--ntasks=4", "--partition=gpu", "--time=10", "--gpus-per-node=2", "-C 'a b'"):
        assert f"#SBATCH {line}" in script, script


def test_a_machine_without_slurm_is_told_so_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here (and on machines without Slurm)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as err:
        nbdist.start(n=2, launcher="slurm", ip="127.0.0.1", time="10")
    assert str(err.value) == (
        "the slurm launcher: starting engines failed (sbatch is not on PATH: run where Slurm's "
        "commands are, or install them)"
    )
    assert list(tmp_path.iterdir()) == [] and nbdist.current(required=False) is None


STEADY = textwrap.dedent(
    """
    import pathlib, time, torch
    torch.manual_seed(0)
    model = nbdist.prepare(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    X = torch.randn(32, 4)
    flag, log = pathlib.Path(FLAG), pathlib.Path(LOG)
    for step in nbdist.steps(60, every=5, model=model, opt=opt, run=RUN):
        if nbdist.is_main():
            with log.open("a") as f:
                f.write(f"{step}\\n")
            if step == 12:
                flag.touch()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X), X.sum(1, keepdim=True)).backward()
        opt.step()
        time.sleep(0.1)  # training goes on while the job ends under it
    step
    """
)


def test_a_job_cancelled_mid_cell_is_known_at_once_and_resumed(slurm, in_tmp, capsys):
    c = nbdist.start(n=2, launcher="slurm", ip="127.0.0.1")
    try:
        [first] = _job_ids(c)
        flag, log = in_tmp / "flag", in_tmp / "log"
        src = STEADY.replace("FLAG", repr(str(flag))).replace("LOG", repr(str(log)))
        src = src.replace("RUN", repr(f"c-{uuid.uuid4().hex[:6]}"))
        cancelled = _end_when(slurm, flag, "scancel", first)
        capsys.readouterr()
        assert c.run(src, CellOptions(restarts=1)) == 59
        assert cancelled.is_set()
        out = capsys.readouterr().out
        [line] = [ln for ln in out.splitlines() if "a new job" in ln]
        assert line.startswith(f"nbdist: slurm job {first} ended: "), line
        assert re.search("CANCELLED|COMPLETING: it was cancelled", line), line
        steps = [int(s) for s in log.read_text().split()]
        again = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
        # known within seconds (0.1 s a step): busy engines end at the job's SIGTERM, and the
        # watcher names the job within a second
        assert steps[again - 1] - 12 <= 30, steps
        assert steps[again] % 5 == 0 and steps[again:] == list(range(steps[again], 60)), steps
        [second] = [j for j in _job_ids(c) if j != first]
        assert c.engines.job_line().startswith(f"slurm job {second}: RUNNING")
        # without --restarts: the cell fails in one line naming the job; the next gets a new job
        flag.unlink()
        cancelled = _end_when(slurm, flag, "scancel", second)
        with pytest.raises(nbdist.errors.DistributedCellError) as e:
            c.run(src.replace("steps(60", "steps(400"))
        assert cancelled.is_set()
        assert f"slurm job {second} ended: " in str(e.value), str(e.value)
        assert c.run(ALL_REDUCE) == 3
        [third] = [j for j in _job_ids(c) if j not in (first, second)]
        assert c.engines.job_line().startswith(f"slurm job {third}: RUNNING")
        out = capsys.readouterr().out
        assert f"nbdist: slurm job {second} ended: " in out, out
    finally:
        c.stop()
    _queue_empty(slurm)
