"""``%nbdist run FILE ARGS``: a script runs on every rank as torchrun runs it; cells look like
scripts too (``sys.argv``, no interactive markers), and what frameworks do to the process
(signal handlers, ``sys.exit``) does not break the next cell."""

from __future__ import annotations

import ast
import json
import os
import signal
import textwrap

import pytest
from processes import wait_until


@pytest.fixture(scope="module")
def nb(kernel, tmp_path_factory):
    """The module's kernel, working in a folder of its own, with a running 2-engine cluster."""
    home = tmp_path_factory.mktemp("notebook-folder")
    kernel.ok(f"import os\nos.chdir({str(home)!r})")
    kernel.ok("%nbdist start -n 2")
    yield kernel, home
    kernel.ok("%nbdist stop")


def _write(folder, name: str, text: str):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_a_script_runs_as_torchrun_runs_it(nb):
    k, home = nb
    _write(home, "scripts/helper.py", "FACTOR = 10\n")
    _write(
        home,
        "scripts/train.py",
        """
        import argparse, os, sys
        import torch, torch.distributed as dist
        from helper import FACTOR  # the script's folder is first on sys.path

        p = argparse.ArgumentParser()
        p.add_argument("--lr", type=float, default=0.5)
        p.add_argument("--name", default="x")
        args = p.parse_args()
        dist.init_process_group("gloo")  # torchrun scripts do this: a no-op on nbdist engines
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        seen = dict(argv=sys.argv, name=__name__, file=__file__, cwd=os.getcwd(),
                    first=sys.path[0], lr=args.lr, total=t.item() * FACTOR)
        if __name__ == "__main__":
            print("SEEN", seen)
            dist.destroy_process_group()
        """,
    )
    r = k.ok("%nbdist run --all-output scripts/train.py --lr 0.1 --name 'two words'")
    seen = [
        ast.literal_eval(line.split("SEEN ", 1)[1])
        for line in r.stdout.splitlines()
        if "SEEN " in line
    ]
    assert len(seen) == 2, r.stdout  # --all-output: both ranks' lines
    for s in seen:
        assert s["argv"] == ["scripts/train.py", "--lr", "0.1", "--name", "two words"]
        assert s["name"] == "__main__"
        assert s["file"] == str((home / "scripts/train.py").resolve())
        assert s["cwd"] == str(home)
        assert s["first"] == str((home / "scripts").resolve())
        assert s["lr"] == 0.1 and s["total"] == 30.0
    # what stays: the script's globals (not its folder on sys.path, not its __main__)
    r = k.ok(
        "%%distributed\nimport sys\n"
        f"(args.lr, seen['total'], {str(home / 'scripts')!r} in sys.path, __name__)"
    )
    assert r.result == "(0.1, 30.0, False, '__main__')"
    k.ok("%nbdist pull seen")
    assert k.ok("seen['argv'][0]").result == "'scripts/train.py'"
    # the script destroyed the process group: the next cell has one again
    assert (
        k.ok(
            "%%distributed\nimport torch\nt = torch.ones(1)\n"
            "torch.distributed.all_reduce(t)\nt.item()"
        ).result
        == "2.0"
    )


def test_run_takes_the_options_of_distributed_cells(nb):
    k, home = nb
    _write(home, "slow.py", "import time\nfor _ in range(600):\n    time.sleep(0.1)\n")
    r = k.run("%nbdist run --timeout 1.5 slow.py")
    assert r.seconds < 8
    assert "ranks 0, 1: stopped: the cell ran past --timeout 1.5 s" in "\n".join(
        r.error["traceback"]
    )
    r = k.run("%nbdist run slow.py", interrupt_after=1.5)
    assert r.error["ename"] == "CellInterrupted" and r.seconds < 8
    _write(home, "fails.py", "import nbdist\nif nbdist.rank() == 1:\n    1 / 0\n")
    r = k.run("%nbdist run fails.py")
    text = "\n".join(r.error["traceback"])
    assert r.error["ename"] == "DistributedCellError"
    assert "rank 1: ZeroDivisionError: division by zero" in text
    assert 'fails.py", line 3' in text  # the script's own line, in the script's file


def test_sys_exit_ends_a_script_as_it_would_end_a_process(nb):
    k, home = nb
    _write(home, "done.py", "import sys\nprint('before')\nsys.exit(0)\nprint('never')\n")
    r = k.ok("%nbdist run done.py")
    assert "before" in r.stdout and "never" not in r.stdout
    _write(home, "code3.py", "import sys, nbdist\nsys.exit(3 if nbdist.rank() == 1 else 0)\n")
    r = k.run("%nbdist run code3.py")
    text = "\n".join(r.error["traceback"])
    assert "rank 1: SystemExit: the code called sys.exit(3)" in text
    assert "rank 0" not in text  # rank 0 ended normally
    assert k.ok("%%distributed\nnbdist.world_size()").result == "2"


def test_bad_scripts_are_refused_in_one_line_before_any_engine_runs(nb):
    k, home = nb
    (home / "folder").mkdir()
    (home / "binary.py").write_bytes(b"\x7fELF\x00\x01\x02\xff\xfe")
    _write(home, "broken.py", "def f(:\n    pass\n")
    _write(home, "marker.py", "open('ran', 'w').write('x')\n")
    cases = {
        "%nbdist run missing.py": f"no such file 'missing.py' (looked in {home})",
        "%nbdist run folder": "'folder' is a folder: name the .py script in it",
        "%nbdist run binary.py": "'binary.py' is not a Python script (it is not text)",
        "%nbdist run broken.py": "syntax error in broken.py (invalid syntax), line 1: def f(:",
        "%nbdist run": "the following arguments are required: file",
        "%nbdist run --timeout -1 marker.py": "--timeout must be a positive number",
    }
    for code, expected in cases.items():
        r = k.run(code)
        assert r.error is not None and r.error["ename"] == "UsageError", (code, r.error)
        assert expected in r.error["evalue"], (code, r.error["evalue"])
        assert len(r.error["traceback"]) <= 1
    assert not (home / "ran").exists()


def test_cells_look_like_scripts_to_frameworks(nb):
    k, _ = nb
    r = k.ok(
        "%%distributed\nimport argparse, sys\n"
        "p = argparse.ArgumentParser()\np.add_argument('--epochs', type=int, default=3)\n"
        "(p.parse_args().epochs, len(sys.argv), sys.argv[0].startswith('<distributed-cell-'),"
        " hasattr(sys, 'ps1'), sys.flags.interactive)"
    )
    assert r.result == "(3, 1, True, False, 0)"
    # rich output still reaches the notebook (a figure; HTML from engines is shown as text)
    r = k.ok(
        "%%distributed\nimport io\nimport matplotlib.pyplot as plt\n"
        "from IPython.display import Image, display\nfig, ax = plt.subplots()\n"
        "ax.plot([1, 2])\nbuf = io.BytesIO()\nfig.savefig(buf, format='png')\n"
        "display(Image(data=buf.getvalue()))"
    )
    assert any("image/png" in d for d in r.displays), r.displays


def test_signal_handlers_a_cell_replaces_are_put_back(nb):
    k, home = nb
    # what Lightning does after catching an interrupt: ignore SIGINT, then sys.exit(1)
    k.ok(
        "%%distributed\nimport signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_DFL)"
    )
    r = k.ok(
        "%%distributed\nimport signal\n"
        "(signal.getsignal(signal.SIGINT) is signal.default_int_handler,"
        " signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)"
    )
    assert r.result == "(True, False)"
    r = k.run(
        "%%distributed\nimport time\nfor _ in range(600):\n    time.sleep(0.1)", interrupt_after=1.5
    )
    assert r.error["ename"] == "CellInterrupted" and r.seconds < 8
    # a framework that exits after an interrupt (sys.exit inside `except KeyboardInterrupt`)
    # is reported as the interrupt it was, not as an error
    _write(
        home,
        "graceful.py",
        """
        import signal, sys, time
        try:
            for _ in range(600):
                time.sleep(0.1)
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            sys.exit(1)
        """,
    )
    r = k.run("%nbdist run graceful.py", timeout=30, interrupt_after=1.5)
    assert r.error["ename"] == "CellInterrupted", r.error
    assert (
        k.ok(
            "%%distributed\nimport signal\n"
            "signal.getsignal(signal.SIGINT) is signal.default_int_handler"
        ).result
        == "True"
    )


RESUMABLE = """
import argparse, json, time
import torch, nbdist

p = argparse.ArgumentParser()
p.add_argument("--log")
p.add_argument("--out")
args = p.parse_args()
torch.manual_seed(0)
model = nbdist.prepare(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(nbdist.rank())
start = nbdist.restore(model=model, opt=opt, gen=g)
for step in range(start, 30):
    x = torch.randn(8, 4, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    opt.step()
    nbdist.checkpoint(step, every=5, model=model, opt=opt, gen=g)
    if nbdist.rank() == 0:
        with open(args.log, "a") as f:
            f.write(f"{step}\\n")
    time.sleep(0.05)
if nbdist.rank() == 0:
    with open(args.out, "w") as f:
        json.dump([x for v in model.module.parameters() for x in v.flatten().tolist()], f)
"""


def test_a_script_resumes_from_its_checkpoint_when_a_worker_dies(nb):
    k, home = nb
    _write(home, "resumable.py", RESUMABLE)
    k.ok("%nbdist run resumable.py --log ref.log --out ref.json")
    pids = ast.literal_eval(
        k.ok("import nbdist\nprint([s.pid for s in nbdist.current().slots])").stdout
    )
    sent = k.submit("%nbdist run --restarts 1 resumable.py --log hit.log --out hit.json")
    log = home / "hit.log"
    wait_until(lambda: log.exists() and len(log.read_text().split()) >= 12, 60)
    os.kill(pids[1], signal.SIGKILL)
    r = k.collect(sent, timeout=120)
    assert r.error is None, r.error and "\n".join(r.error["traceback"])
    assert "recovered 1 time(s)" in r.stdout
    steps = [int(s) for s in log.read_text().split()]
    assert steps[-1] == 29 and steps.count(0) == 1  # resumed from a checkpoint, not from step 0
    assert json.loads((home / "hit.json").read_text()) == pytest.approx(
        json.loads((home / "ref.json").read_text())
    )
