"""Experiment trackers with the real packages, offline or local: MLflow's file store, W&B's
offline mode, Comet's offline experiment. Each tracker's records are read back from its own files
and compared with the run store; nothing reaches the network."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import struct
import threading
import time
import zipfile
from collections import defaultdict
from pathlib import Path

import pytest
from kernels import shutdown_kernel, start_kernel

from nbdist.notebook.board import runs as board_runs
from nbdist.notebook.trackers import live, sinks
from nbdist.notebook.trackers.sinks import Fanout, Point, RunInfo

# found, not imported: comet_ml patches imports when imported, and the trackers run in the kernel
_MISSING = [p for p in ("mlflow", "wandb", "comet_ml") if importlib.util.find_spec(p) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"not installed: {_MISSING}")

CELL = """%%distributed --no-dashboard {flags}
import time
from nbdist.worker.reporting.calls import event
for i in range(20):
    nbdist.report(step=i, loss=1.0 / (i + 1) + nbdist.rank(), samples=4, acc=i / 20)
    if i == 10:
        event("checkpoint", "saved step 10", step=10)
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A kernel with a 2-rank cluster whose trackers all write under one temporary folder."""
    root = tmp_path_factory.mktemp("trackers")
    (root / "wandb").mkdir()
    env = {
        "MLFLOW_TRACKING_URI": f"file:{root / 'mlruns'}",
        "MLFLOW_ALLOW_FILE_STORE": "true",  # MLflow 3's local file store, kept for tests
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(root / "wandb"),
        "WANDB_SILENT": "true",
        "WANDB_PROJECT": "nbdist-test",
        "WANDB_DISABLE_GIT": "true",
        "COMET_START_ONLINE": "false",
        "COMET_OFFLINE_DIRECTORY": str(root / "comet"),
        "COMET_PROJECT_NAME": "nbdist-test",
        "COMET_ERROR_TRACKING_ENABLE": "false",  # else Comet reports to Sentry, even offline
        "WANDB_ERROR_REPORTING": "false",
    }
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    for k in ("WANDB_API_KEY", "COMET_API_KEY", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        mp.delenv(k, raising=False)
    k = start_kernel()
    try:
        k.ok("%nbdist start -n 2")
        yield k, root
        k.ok("%nbdist stop")
    finally:
        shutdown_kernel(k)
        mp.undo()


# -- reading each tracker's own files --------------------------------------------------------------


def _mlflow(root):
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    return MlflowClient(tracking_uri=f"file:{root / 'mlruns'}")


def _mlflow_run(client, run_id: int):
    (run,) = client.search_runs(["0"], f"tags.`nbdist.run_id` = '{run_id}'")
    return run


def _mlflow_curve(client, run, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}


def _wandb_records(path: str):
    """The records of a W&B run file (``run-ID.wandb``: a LevelDB-style log of protobufs)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, out, payload = open(path, "rb").read(), [], b""
    block, pos = 32768, 7  # a 7-byte file header, then 32 KiB blocks of checksummed chunks
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            rec = pb.Record()
            rec.ParseFromString(payload)
            out.append(rec)
            payload = b""
        elif kind == 0:
            break
    return out


def _wandb_runs(root) -> list[dict]:
    """Every offline W&B run: its name, group, config and history (key -> {step: value})."""
    found = []
    for path in sorted(glob.glob(str(root / "wandb/wandb/offline-run-*/run-*.wandb"))):
        run = {"curves": defaultdict(dict), "config": {}, "summary": {}}
        for rec in _wandb_records(path):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                run["name"], run["group"] = rec.run.display_name, rec.run.run_group
                run["config"] |= {i.key: json.loads(i.value_json) for i in rec.run.config.update}
            elif kind == "config":
                run["config"] |= {i.key: json.loads(i.value_json) for i in rec.config.update}
            elif kind == "history":
                row = {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in rec.history.item
                }
                for key, v in row.items():
                    if not key.startswith("_") and key != "nbdist/step":
                        run["curves"][key][row["nbdist/step"]] = v
            elif kind == "summary":
                run["summary"] |= {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in rec.summary.update
                }
        run["dir"] = os.path.dirname(path)
        found.append(run)
    return found


def _comet_runs(root) -> list[dict]:
    """Every offline Comet experiment: name, tags, parameters, metrics (name -> {step: value})."""
    found = []
    for path in sorted(glob.glob(str(root / "comet/*.zip"))):
        with zipfile.ZipFile(path) as z:
            meta = json.loads(z.read("experiment.json"))
            run = {"tags": meta["tags"], "curves": defaultdict(dict), "params": {}, "others": {}}
            for line in z.read("messages.json").decode().splitlines():
                msg = json.loads(line)
                p = msg["payload"]
                if msg["type"] == "metric_msg":
                    run["curves"][p["metric"]["metricName"]][p["metric"]["step"]] = p["metric"][
                        "metricValue"
                    ]
                elif msg["type"] == "parameter_msg" and p["param"]["source"] == "manual":
                    run["params"][p["param"]["paramName"]] = p["param"]["paramValue"]
                elif msg["type"] == "log_other":
                    run["others"][p["key"]] = p["value"]
                elif msg["type"] == "file_upload" or "asset" in msg["type"]:
                    run.setdefault("assets", []).append(p)
        found.append(run)
    return found


def _store_curves(run) -> dict[str, dict[int, float]]:
    """The run store's curves as the trackers name them: ``loss/rank0``, ``acc/mean``..."""
    series = run.series()
    out = {}
    for name in series.names:
        for rank, c in series.ranks[name].items():
            out[f"{name}/rank{rank}"] = dict(zip(map(int, c.x), c.y, strict=True))
        out[f"{name}/mean"] = dict(
            zip(map(int, series.mean[name].x), series.mean[name].y, strict=True)
        )
    return out


def _same(got: dict[int, float], want: dict[int, float], key: str) -> None:
    assert got.keys() == want.keys(), key
    assert got == pytest.approx(want), key


# -- the tests -------------------------------------------------------------------------------------


def test_each_tracker_records_what_the_run_store_has(tracked):
    k, root = tracked
    res = k.ok(CELL.format(flags="--track mlflow,wandb --track comet --name tracked"), timeout=180)
    assert "nbdist: warning" not in res.stderr
    run = board_runs.runs(1)[0]
    assert run["name"] == "tracked" and run["status"] == "ok"
    want = _store_curves(run)
    assert {"loss/rank0", "loss/rank1", "loss/mean", "acc/rank1", "acc/mean"} <= want.keys()
    kinds = sorted(e["kind"] for e in run.events())
    assert "checkpoint" in kinds

    client = _mlflow(root)
    mr = _mlflow_run(client, run.id)
    assert mr.info.run_name == "tracked" and mr.info.status == "FINISHED"
    assert mr.data.params["track"] == "mlflow,wandb,comet"
    assert mr.data.params["restarts"] == "0" and mr.data.tags["nbdist.status"] == "ok"
    for key, curve in want.items():
        _same(_mlflow_curve(client, mr, key), curve, f"mlflow {key}")
    assert _mlflow_curve(client, mr, "events/checkpoint")  # counted while it ran
    assert max(_mlflow_curve(client, mr, "samples_per_s").values()) > 0
    assert _mlflow_curve(client, mr, "health/rank1/rss_mb")
    path = client.download_artifacts(mr.info.run_id, "nbdist/events.jsonl", str(root))
    sent = [json.loads(line)["kind"] for line in open(path)]
    assert sorted(sent) == kinds

    (wb,) = [r for r in _wandb_runs(root) if r.get("name") == "tracked"]
    assert wb["config"]["track"] == "mlflow,wandb,comet"
    for key, curve in want.items():
        _same(wb["curves"][key], curve, f"wandb {key}")
    assert wb["curves"]["health/rank0/cpu"] and wb["curves"]["events/checkpoint"]
    events = open(os.path.join(wb["dir"], "files", "nbdist-events.jsonl")).read().splitlines()
    assert sorted(json.loads(e)["kind"] for e in events) == kinds

    (cm,) = [r for r in _comet_runs(root) if r["others"].get("Name") == "tracked"]
    assert cm["params"]["track"] == "mlflow,wandb,comet" and cm["others"]["nbdist.status"] == "ok"
    for key, curve in want.items():
        _same(cm["curves"][key], curve, f"comet {key}")
    assert cm["curves"]["samples_per_s"]


def test_missing_package_or_unknown_name_is_one_line(tracked):
    k, _ = tracked
    k.ok("import sys; _saved = sys.modules.pop('wandb', None); sys.modules['wandb'] = None")
    try:
        res = k.run("%%distributed --track wandb\nx = 1\n")
    finally:
        k.ok("sys.modules.pop('wandb'); _saved and sys.modules.__setitem__('wandb', _saved)")
    assert res.error["ename"] == "UsageError"
    assert res.error["evalue"] == "--track wandb needs the wandb package: pip install wandb"
    res = k.run("%%distributed --track neptune\nx = 1\n")
    assert res.error["evalue"] == "--track 'neptune': choose from mlflow, wandb, comet"
    res = k.run("import nbdist; nbdist.sweep('x = 1', {'lr': [1]}, track='nope', board=False)")
    assert "choose from mlflow, wandb, comet" in res.error["evalue"]


def test_a_tracker_that_fails_mid_run_is_one_warning_and_the_cell_goes_on(tracked, tmp_path):
    """Rank 0 removes MLflow's store under the running tracker: its next batch fails."""
    k, _ = tracked
    doomed = tmp_path / "doomed"
    k.ok(
        "import os; _uri = os.environ['MLFLOW_TRACKING_URI']; "
        f"os.environ['MLFLOW_TRACKING_URI'] = 'file:{doomed}'"
    )
    cell = (
        "%%distributed --no-dashboard --track mlflow --name doomed\n"
        "import shutil, time\n"
        "for i in range(30):\n"
        "    nbdist.report(step=i, loss=1.0 / (i + 1))\n"
        f"    if i == 10 and nbdist.rank() == 0:\n"
        f"        shutil.rmtree({str(doomed)!r}, ignore_errors=True)\n"
        "    time.sleep(0.1)\n"
        "nbdist.rank() + 5\n"
    )
    try:
        res = k.run(cell, timeout=180)
    finally:
        k.ok("os.environ['MLFLOW_TRACKING_URI'] = _uri")
    assert res.error is None and res.result == "5"
    assert res.stderr.count("nbdist: warning: mlflow:") == 1, res.stderr
    assert "training goes on" in res.stderr
    run = board_runs.runs(1)[0]
    assert run["name"] == "doomed" and run["status"] == "ok" and len(run.metrics(False)) == 60


def test_a_sweeps_trials_are_grouped_in_each_tracker(tracked):
    k, root = tracked
    cell = (
        "%%distributed --sweep lr=0.1,0.01 --trial-size 1 --no-dashboard --name sw"
        " --track mlflow,wandb,comet\n"
        "for i in range(5):\n"
        "    nbdist.report(step=i, loss=lr * (5 - i))\n"
    )
    k.ok(cell, timeout=240)
    trial_runs = [r for r in board_runs.runs(5) if r["name"] == "sw"]
    assert len(trial_runs) == 2

    client = _mlflow(root)
    (parent,) = client.search_runs(["0"], "attributes.run_name = 'sw'")
    assert parent.info.status == "FINISHED"
    kids = client.search_runs(["0"], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(r.data.params["lr"] for r in kids) == ["0.01", "0.1"]
    for r in kids:
        lr = float(r.data.params["lr"])
        assert _mlflow_curve(client, r, "loss/mean") == pytest.approx(
            {i: lr * (5 - i) for i in range(5)}
        )

    wb = [r for r in _wandb_runs(root) if r.get("group") == "sw"]
    assert sorted(r["config"]["lr"] for r in wb) == [0.01, 0.1]
    cm = [r for r in _comet_runs(root) if "sweep:sw" in r["tags"]]
    assert sorted(r["params"]["lr"] for r in cm) == [0.01, 0.1]


def test_nbdist_run_tracks_a_script(tracked, tmp_path):
    k, root = tracked
    script = tmp_path / "train_script.py"
    script.write_text(
        "import nbdist\nfor i in range(5):\n    nbdist.report(step=i, loss=float(i), samples=2)\n"
    )
    k.ok(f"%nbdist run --no-dashboard --track mlflow {script}", timeout=120)
    run = board_runs.runs(1)[0]
    assert run["name"] == "train_script.py" and run["status"] == "ok"
    client = _mlflow(root)
    mr = _mlflow_run(client, run.id)
    assert mr.info.run_name == "train_script.py" and mr.data.params["track"] == "mlflow"
    for key, curve in _store_curves(run).items():
        _same(_mlflow_curve(client, mr, key), curve, f"run {key}")


def test_to_mlflow_wandb_and_comet_send_a_finished_run(tracked):
    k, root = tracked
    k.ok(CELL.format(flags="--name later"), timeout=120)
    run = board_runs.runs(1)[0]
    assert run["name"] == "later"
    res = k.ok("import nbdist\nprint(nbdist.runs()[0].to_mlflow())")
    client = _mlflow(root)
    mr = client.get_run(res.stdout.strip())
    assert mr.info.run_name == "later" and mr.info.status == "FINISHED"
    assert mr.data.tags["nbdist.run_id"] == str(run.id)
    for key, curve in _store_curves(run).items():
        _same(_mlflow_curve(client, mr, key), curve, f"to_mlflow {key}")
    saved = sum(e["kind"] == "checkpoint" for e in run.events())  # one from each rank
    assert saved == 2 and _mlflow_curve(client, mr, "events/checkpoint") == {19: 2.0}
    k.ok("nbdist.runs()[0].to_wandb(); nbdist.runs()[0].to_comet()")
    (wb,) = [r for r in _wandb_runs(root) if r["name"] == "later"]
    (cm,) = [r for r in _comet_runs(root) if r["others"].get("Name") == "later"]
    for key, curve in _store_curves(run).items():
        _same(wb["curves"][key], curve, f"to_wandb {key}")
        _same(cm["curves"][key], curve, f"to_comet {key}")


def test_checkpoints_go_to_a_tracker_only_when_asked(tracked):
    k, root = tracked
    k.ok(
        "%%distributed --no-dashboard --name ckpt\n"
        "import torch\n"
        "net = torch.nn.Linear(3, 2)\n"
        "for step in range(4):\n"
        "    nbdist.checkpoint(step, every=2, model=net)\n",
        timeout=120,
    )
    run = board_runs.runs(1)[0]
    folder = Path(next(e["data"]["folder"] for e in run.events() if e["kind"] == "checkpoint"))
    written = sorted(p.name for p in folder.iterdir() if p.is_file())
    assert written, f"no checkpoint files in {folder}"
    plain = k.ok("import nbdist\nprint(nbdist.runs()[0].to_mlflow())").stdout.strip()
    asked = k.ok("print(nbdist.runs()[0].to_mlflow(checkpoints=True))").stdout.strip()
    client = _mlflow(root)
    assert client.list_artifacts(plain, "checkpoints") == []
    uploaded = sorted(os.path.basename(f.path) for f in client.list_artifacts(asked, "checkpoints"))
    assert uploaded == written
    k.ok("nbdist.runs()[0].to_comet(checkpoints=True)")
    (cm,) = [r for r in _comet_runs(root) if r["others"].get("Name") == "ckpt"]
    names = {os.path.basename(a["additional_params"]["fileName"]) for a in cm.get("assets", [])}
    assert set(written) <= names, f"Comet got {sorted(names)}, the folder has {written}"
    k.ok("%%distributed --no-dashboard --name none\nx = 1")
    res = k.run("nbdist.runs()[0].to_mlflow(checkpoints=True)")
    assert res.error is not None and res.error["ename"] == "UsageError"
    assert "wrote no checkpoint" in res.error["evalue"]


def test_two_comet_runs_side_by_side_both_keep_their_points(tracked):
    """Comet ends the process's running experiment when another starts; a sweep's trials run
    side by side in one kernel, so the sink must keep both (here, in this process)."""
    from nbdist.notebook.trackers import comet_sink

    _, root = tracked
    a, b = comet_sink.make(), comet_sink.make()
    a.open(RunInfo("side-a", None))
    b.open(RunInfo("side-b", None))
    a.log([Point("loss/mean", 0, 1.0, time.time())])
    b.log([Point("loss/mean", 0, 2.0, time.time())])
    a.close("ok", {}, [])
    b.close("ok", {}, [])
    got = {r["others"].get("Name"): r["curves"] for r in _comet_runs(root)}
    assert got["side-a"]["loss/mean"] == {0: 1.0} and got["side-b"]["loss/mean"] == {0: 2.0}


# -- the fan-out, with stand-in sinks (no tracker library involved) --------------------------------


class _Slow:
    """A tracker that takes its time while ``busy`` is set (a slow server), then none."""

    handle = None
    busy = threading.Event()

    def open(self, run):
        pass

    def log(self, points):
        while self.busy.is_set():
            time.sleep(0.05)

    def close(self, status, summary, events):
        pass


class _Raises(_Slow):
    def log(self, points):
        raise RuntimeError("the tracker's server said no")


def test_a_slow_or_failing_sink_never_blocks_the_kernel():
    _Slow.busy.set()
    fan = Fanout({"slow": _Slow, "bad": _Raises}, RunInfo("x", 1))
    t0 = time.perf_counter()
    for i in range(sinks.QUEUE_LIMIT * 3):
        fan.log([Point("loss/mean", i, 1.0, time.time())])
    assert time.perf_counter() - t0 < 0.5  # only appends to queues
    warned = [w for w in fan.take_warnings() if "slow" in w]
    assert warned == [
        "nbdist: warning: slow: is falling behind: some updates are dropped; training goes on."
    ]
    _Slow.busy.clear()  # the server answers again: what is queued drains, and the run ends
    fan.close("ok", {}, [])
    bad = [w for w in fan.take_warnings() if "bad" in w]
    assert bad == [
        "nbdist: warning: bad: failed while sending: the rest of this run is not sent there "
        "(RuntimeError: the tracker's server said no); training goes on."
    ]
    assert not any(lane.thread.is_alive() for lane in fan.lanes)
    assert threading.active_count() < 50


def test_batches_carry_a_bounded_number_of_steps_the_latest_kept():
    pts = [Point(f"loss/rank{r}", s, float(s), 0.0) for s in range(1000) for r in range(4)]
    kept = live.thin(pts, 20)
    steps = sorted({p.step for p in kept})
    assert len(steps) == 20 and steps[0] == 0 and steps[-1] == 999 and len(kept) == 80
    info = live.run_info(
        "sw",
        7,
        {"sweep": "sw", "trial": 1, "values": {"lr": 0.1}, "ranks": (0, 2)},
        "trial 1: lr=0.1",
    )
    assert info.name == "sw: trial 1: lr=0.1" and info.group == "sw"
    assert info.params == {"sweep": "sw", "trial": 1, "lr": 0.1, "ranks": "0,2"}
