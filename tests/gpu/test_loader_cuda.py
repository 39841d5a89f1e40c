"""``nbdist.loader`` on a real GPU: dict batches from loader worker processes, pinned and moved
to the rank's device, its wait counted, its position saved and restored through a checkpoint
on an NCCL rank. Map-style and torch iterable datasets (files need pyarrow, which the GPU
machine's carried wheels leave out: their CPU path is tested in tests/integration/data)."""

from __future__ import annotations

import pytest
import torch
from processes import assert_gone

import nbdist

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.usefixtures("no_front_end"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

_DATA = """
import torch
class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 500
    def __getitem__(self, i):
        return {"id": i, "x": torch.full((8,), float(i))}

class Stream(torch.utils.data.IterableDataset):
    def __len__(self):
        return 500
    def __iter__(self):
        return ({"id": i, "x": torch.full((8,), float(i))} for i in range(500))
"""

_RUN = """
import tempfile
folder = tempfile.mkdtemp()
def ids(dl, k=None):
    it = iter(dl)
    got = []
    for b in it:
        assert b["x"].device.type == "cuda" and b["x"].is_contiguous()
        got.append(b["id"].tolist())
        if k is not None and len(got) == k:
            break
    return got

whole = ids(nbdist.loader(DATA, 16, num_workers=2, pin_memory=True, device="cuda"))
dl = nbdist.loader(DATA, 16, num_workers=2, pin_memory=True, device="cuda")
head = ids(dl, 7)
net = torch.nn.Linear(8, 1).cuda()
nbdist.checkpoint(6, dir=folder, run=RUN, net=net, loader=dl)
again = nbdist.loader(DATA, 16, num_workers=2, pin_memory=True, device="cuda")
start = nbdist.restore(dir=folder, run=RUN, net=net, loader=again)
(start, head + ids(again) == whole, len(whole))
"""


@pytest.fixture(scope="module")
def gpu():
    c = nbdist.start(n=1)
    pids = [p.pid for p in c.engines.processes()]
    c.run(_DATA)
    yield c
    c.stop()
    assert_gone(pids)


@pytest.mark.parametrize("data", ["Rows()", "Stream()"])
def test_batches_reach_the_gpu_and_an_epoch_resumes_through_a_checkpoint(gpu, data):
    if data == "Stream()":
        pytest.importorskip("torchdata")
    run = data.strip("()").lower()
    start, same, batches = gpu.run(f"DATA, RUN = {data}, {run!r}\n" + _RUN)
    assert start == 7 and same and batches == 32


def test_a_rank_waiting_on_its_input_has_its_wait_counted_on_the_gpu(gpu):
    waited = gpu.run(
        "import time\n"
        "from nbdist.worker.reporting import datawait\n"
        "class Slow(Rows):\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(0.002)\n"
        "        return super().__getitem__(i)\n"
        "dl = nbdist.loader(Slow(), 32, device='cuda')\n"
        "for b in dl:\n"
        "    (b['x'] @ b['x'].T).sum().item()\n"
        "datawait.waits.waited()"
    )
    assert waited > 0.5  # 500 samples of 2 ms each, read on the training thread
