"""The example notebooks execute headless in a real kernel and show what they promise."""

from __future__ import annotations

import ast
import re

import nbformat
from nbclient import NotebookClient
from paths import ARTIFACTS, ROOT

NOTEBOOKS = ROOT / "notebooks"
#: the executed notebooks, kept for the docs site (docs/conf.py renders these when present)
EXECUTED = ARTIFACTS / "notebooks"


def _execute(name: str, tmp_path) -> list[str]:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    EXECUTED.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, EXECUTED / name)
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            texts.append(out.get("text") or out.get("data", {}).get("text/plain", ""))
    return texts


def test_fault_tolerance_notebook_recovers_on_its_own(tmp_path):
    texts = _execute("fault_tolerance.ipynb", tmp_path)
    joined = "\n".join(texts)
    assert "resumed at step " in joined
    assert "nbdist: recovered 1 time(s)" in joined
    assert "True" in [t.strip() for t in texts]  # the same parameters as the uninterrupted run


def test_quickstart_runs_the_whole_mission(tmp_path, monkeypatch):
    data = tmp_path / "data"
    monkeypatch.setenv("NBDIST_DATA_DIR", str(data))  # the kernel and its engines write here
    texts = _execute("quickstart.ipynb", tmp_path)
    joined = "\n".join(texts)

    # the shard report: stratified, every class within one sample between the two ranks
    assert "'train' scattered to 2 ranks" in joined and "stratified" in joined
    lines = joined.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("rank") and "label" in line)
    rank0, rank1 = ([int(c) for c in lines[head + r].split()[2:]] for r in (1, 2))
    assert len(rank0) == len(rank1) == 10
    assert all(abs(a - b) <= 1 for a, b in zip(rank0, rank1, strict=True)), (rank0, rank1)

    # trained in sync, accurate on the engines and in the notebook with the pulled model
    summary = next(ast.literal_eval(t) for t in texts if "test_accuracy" in t)
    assert summary["identical_parameters"] is True
    assert summary["test_accuracy"] >= 0.95, summary
    pulled = re.search(r"test accuracy of the pulled model: ([\d.]+)", joined)
    assert pulled, joined
    assert abs(float(pulled.group(1)) - summary["test_accuracy"]) < 0.005

    # the named run is kept, with its checkpoints, which are on disk
    assert re.search(r"run \d+ 'quickstart': ok, \d+ metric rows", joined), joined
    assert "checkpoint of step 400 written" in joined
    written = {p.name for p in data.glob("checkpoints/*/step-*.json")}
    assert "step-00000400.json" in written, written


def test_pipeline_notebook_trains_two_stages_and_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("NBDIST_DATA_DIR", str(tmp_path / "data"))
    texts = _execute("pipeline_lm.ipynb", tmp_path)
    joined = "\n".join(texts)

    # each rank held its own stage (rank i: stage i), its own layers, and their parameters only
    held = re.findall(
        r"\[rank (\d)\] rank \1 holds stage (\d) of 2: ([\w, ]+); ([\d,]+) par", joined
    )
    assert sorted((r, s, layers) for r, s, layers, _ in held) == [
        ("0", "0", "embed, block0, block1"),
        ("1", "1", "block2, block3, norm, head"),
    ], joined
    total = int(re.search(r"([\d,]+) parameters in all", joined).group(1).replace(",", ""))
    assert sum(int(n.replace(",", "")) for *_, n in held) == total
    assert all(0.4 * total < int(n.replace(",", "")) < 0.6 * total for *_, n in held), held

    # the loss fell by a clear margin (from about ln(45) = 3.8, the untrained guess)
    first, last = map(float, re.search(r"loss fell from ([\d.]+) to ([\d.]+)", joined).groups())
    assert first > 3.0 and last < 1.0, (first, last)
    idle = re.search(
        r"stage 0 waited (\d+)% of a step on average \(the bubble alone: 20%\)", joined
    )
    assert idle and 0 < int(idle.group(1)) < 100, joined

    # both stages came back, together the whole model, and it wrote text after its prompt
    assert re.search(r"stage 0: \d+ tensors, stage 1: \d+ tensors, ", joined), joined
    assert f"{total:,} parameters\n" in joined  # the model rebuilt in the notebook
    sample = next(t for t in texts if t.startswith("Beautiful is"))
    assert len(sample) > len("Beautiful is") + 100, sample
    assert sample.count("better than") >= 2, sample  # it learned the Zen's most common words
    assert "nbdist: cluster stopped" in joined


def test_debugging_notebook_shows_each_tool(tmp_path, monkeypatch):
    monkeypatch.setenv("NBDIST_DATA_DIR", str(tmp_path / "data"))
    texts = _execute("debugging.ipynb", tmp_path)
    joined = "\n".join(texts)
    # the post-mortem: rank 1's frames, its locals as they were
    assert "1 KeyError: 'x'" in joined
    assert 'features, line 3: return [x * scale for x in batch["x"]]' in joined
    assert "'scale': '1.0'" in joined and "'batch': \"{'y': [4, 5]}\"" in joined
    # the stop: where each rank was, torch folded
    assert "where the ranks were:" in joined and "dist.barrier()" in joined
    assert "… in torch.distributed" in joined
    # the profile names rank 1
    assert "straggler: rank 1" in joined and "1" in [t.strip() for t in texts]
    # tqdm's bar in its final state, and the print after it on a line of its own
    assert re.search(r"epoch 1: 100%\|\S+\| 30/30", joined), joined
    assert "done" in [line.strip() for line in joined.splitlines()]


def test_mesh_notebook_splits_layers_and_trains_as_one_process(tmp_path, monkeypatch):
    monkeypatch.setenv("NBDIST_DATA_DIR", str(tmp_path / "data"))
    texts = _execute("mesh.ipynb", tmp_path)
    joined = "\n".join(texts)
    total = int(
        re.search(r"([\d,]+) parameters, \d+% of them in the blocks", joined)
        .group(1)
        .replace(",", "")
    )
    assert "on the meta device: True" in joined

    # dp=2 × tp=2: tp innermost; each rank holds half of every split layer, the rest whole
    held = re.findall(
        r"\[rank (\d)\] rank \1 \(dp (\d), tp (\d)\): split layers ([\d,]+) of ([\d,]+) "
        r"parameters, whole ones ([\d,]+);",
        joined,
    )
    assert sorted((int(r), int(d), int(t)) for r, d, t, *_ in held) == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1),
    ], joined  # fmt: skip
    for *_, mine, of, rest in held:
        mine, of, rest = (int(n.replace(",", "")) for n in (mine, of, rest))
        assert 2 * mine == of and mine + rest < 0.6 * total and of + rest == total, held
    assert "dp 1/2 tp 0/2" in joined  # %nbdist status shows the coordinates

    # what each dimension sends: 2 all-reduces forward and 4 backward per block; dp some
    assert "tp: 4 all-reduces forward and 8 backward (6 per block)" in joined, joined
    dp = re.search(r"dp: (\d+) all-reduces of this rank's gradients", joined)
    assert dp and int(dp.group(1)) >= 1, joined

    # trained as one process does on the whole batch, at every step
    gap = re.search(r"largest difference from dp=2 × tp=2 over the 40 steps: (\S+)", joined)
    assert gap and float(gap.group(1)) < 1e-4, joined
    for layout in ("dp=2 × tp=2", "pp=2 × dp=2"):
        first, last = map(
            float, re.search(rf"{layout}: the loss fell from ([\d.]+) to ([\d.]+)", joined).groups()
        )
        assert first > 3.5 and last < 2.6, (layout, first, last)

    # pp=2 × dp=2: pp outermost, each rank one stage, the two stages the whole model
    stages = re.findall(
        r"\[rank (\d)\] rank \1 \(pp (\d), dp (\d)\): ([\w, ]+); ([\d,]+) of", joined
    )
    assert sorted((r, p, layers) for r, p, _, layers, _ in stages) == [
        ("0", "0", "embed, block0"), ("1", "0", "embed, block0"),
        ("2", "1", "block1, norm, head"), ("3", "1", "block1, norm, head"),
    ], joined  # fmt: skip
    assert sum({p: int(n.replace(",", "")) for _, p, _, _, n in stages}.values()) == total
    assert "same training in every layout: True" in joined
    assert "nbdist: cluster stopped" in joined


def test_streaming_notebook_resumes_the_epoch_exactly(tmp_path, monkeypatch):
    monkeypatch.setenv("NBDIST_DATA_DIR", str(tmp_path / "data"))
    texts = _execute("streaming.ipynb", tmp_path)
    joined = "\n".join(texts)
    assert "5,411 rows in 5 files: 1,500, 90, 3,101, 20, 700" in joined
    assert "85 batches per rank per epoch" in joined
    # trained: the loss fell from about |w|² (8 features of unit variance) to the noise's
    losses = [float(v) for v in re.findall(r"loss at the last step: ([\d.]+)", joined)]
    assert len(losses) == 2 and all(v < 0.01 for v in losses), joined

    # rank 1 was killed after step 45 (late on a loaded machine, but within the first epoch),
    # replaced, and the run resumed mid-epoch from its latest checkpoint (one every 20 steps)
    assert "nbdist: recovered 1 time(s)" in joined
    resumed = re.search(r"resumed at step (\d+): epoch 0, its batch (\d+)", joined)
    assert resumed and resumed.group(1) == resumed.group(2), joined
    at = int(resumed.group(1))
    assert at % 20 == 0 and 40 <= at < 85, joined
    again = re.search(r"rank 0 trained steps (\d+)-(\d+) twice", joined)
    assert again and int(again.group(1)) == at and int(again.group(2)) >= 45, joined
    assert "steps per rank: [120, 120]" in joined

    # the recovered run's batches and parameters are the uninterrupted run's
    assert "the same batches on every rank at every step: True" in joined
    assert "the same parameters: True" in joined
    assert "epoch 0: 5,411 of 5,411 samples trained on, 1 of them twice (the padding)" in joined
    assert "UserWarning" not in joined
    assert "nbdist: cluster stopped" in joined
