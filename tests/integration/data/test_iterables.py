"""``nbdist.loader`` over streams that can only be iterated, on a real 2-rank cluster: a torch
``IterableDataset`` and a Hugging Face streaming ``IterableDataset`` read from JSON-lines and
Parquet files the test writes (nothing downloads). The same number of DDP steps on both ranks
however uneven the stream, no sample read by two ranks or two workers, an epoch continued
exactly from every rank's saved position, and bad input refused on every rank in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nbdist
from nbdist.config import CellOptions

pytest.importorskip("datasets")
pytest.importorskip("torchdata")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

#: Rows per JSON-lines file: 4 files over 2 ranks, so each rank reads only its own two, and
#: rank 1's (13 and 5 rows) are far fewer than rank 0's.
UNEVEN = [700, 13, 2100, 5]
#: Rows per Parquet file: 3 files over 2 ranks, so each rank reads all and keeps 1 in 2.
PARQUET = [400, 90, 313]

STREAMS = """
import io, torch, torch.utils.data as tud, torch.distributed as dist, datasets

class Stream(tud.IterableDataset):
    '''ids 0..n-1 with features, no length, a position of its own (torchdata's convention).'''
    def __init__(self, n):
        self.n, self.at, self.next_start = n, 0, 0
    def state_dict(self):
        return {"at": self.at}
    def load_state_dict(self, state):
        self.next_start = state["at"]
    def __iter__(self):
        self.at, self.next_start = self.next_start, 0
        while self.at < self.n:
            self.at += 1
            yield {"id": self.at - 1, "x": torch.full((4,), float(self.at - 1))}

class Sized(tud.IterableDataset):
    '''ids 0..n-1 with a length only: replayed to resume.'''
    def __init__(self, n):
        self.n = n
    def __len__(self):
        return self.n
    def __iter__(self):
        return ({"id": i, "x": torch.full((4,), float(i))} for i in range(self.n))

class Bare(tud.IterableDataset):
    def __iter__(self):
        return iter(range(10))

def tag(batch):
    '''Runs in the loader's worker: which worker read the batch.'''
    return {**batch, "worker": tud.get_worker_info().id}

def hf(kind, files):
    return datasets.load_dataset(kind, data_files=files, split="train", streaming=True)

def ids(batches):
    return [b["id"].tolist() for b in batches]

def weights_only(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)

def everyones(state):
    '''Every rank's position, by rank, as the checkpoint gives it back.'''
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, weights_only(state))
    return out
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory, cluster):
    """The JSON-lines and Parquet files, ids 0..n-1 in each set; their lists on the ranks."""
    folder = tmp_path_factory.mktemp("streams")
    jsonl, parquet, start = [], [], 0
    for i, n in enumerate(UNEVEN):
        jsonl.append(str(folder / f"part-{i}.jsonl"))
        Path(jsonl[-1]).write_text(
            "".join(
                json.dumps({"id": j, "x": [j, -j, j, -j]}) + "\n" for j in range(start, start + n)
            )
        )
        start += n
    start = 0
    for i, n in enumerate(PARQUET):
        parquet.append(str(folder / f"part-{i}.parquet"))
        rows = list(range(start, start + n))
        table = pa.table({"id": rows, "x": [[float(j)] * 4 for j in rows], "y": [0.5] * n})
        pq.write_table(table, parquet[-1], row_group_size=64)
        start += n
    cluster.run(STREAMS + f"JSONL, PARQUET = {jsonl!r}, {parquet!r}", CellOptions(timeout=60))


def _pulled(cluster, name: str) -> list:
    return [cluster.pull(name, r) for r in range(2)]


DDP = """
torch.manual_seed(0)
model = nbdist.prepare(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps = []
for dl in (uneven, sized):
    n = 0
    for b in dl:
        opt.zero_grad()
        model(b["x"].float()).sum().backward()  # an all-reduce: the ranks in step, or a hang
        opt.step()
        n += 1
    steps.append(n)
lengths = [len(sized)]
"""


def test_every_rank_takes_as_many_ddp_steps_however_uneven_the_stream(cluster, files):
    cluster.run(
        "uneven = nbdist.loader(hf('json', JSONL), 8, num_workers=2, shuffle=False)\n"
        "sized = nbdist.loader(Sized(1001), 16, num_workers=2, seed=1)\n" + DDP,
        CellOptions(timeout=120),
    )
    # rank 1 reads 13 and 5 rows in its two workers: 2 + 1 batches of 8, and rank 0 stops there;
    # 1001 samples: rank 0's workers have 251 and 250 (16 + 16 batches), rank 1's 250 and 250
    assert _pulled(cluster, "steps") == [[3, 32], [3, 32]]
    assert _pulled(cluster, "lengths") == [[32], [32]]


READ = """
seen = {}
for name, dl in [
    ("torch", nbdist.loader(Stream(2000), 10, num_workers=2, seed=2, transform=tag)),
    ("parquet", nbdist.loader(hf("parquet", PARQUET), 10, num_workers=2, seed=2, transform=tag)),
]:
    seen[name] = [(b["id"].tolist(), b["worker"]) for b in dl]
"""


def test_no_sample_is_read_by_two_ranks_or_two_workers(cluster, files):
    cluster.run(READ, CellOptions(timeout=120))
    seen = _pulled(cluster, "seen")
    for name, rows in (("torch", 2000), ("parquet", sum(PARQUET))):
        assert len(seen[0][name]) == len(seen[1][name]), name  # as many batches
        every = [i for s in seen for batch, _ in s[name] for i in batch]
        assert len(every) == len(set(every)), name  # none twice, across ranks and workers
        assert set(every) <= set(range(rows))
        assert 0 <= rows - len(every) < 2 * 2 * 10, name  # unused: an epoch's end only
        for rank, s in enumerate(seen):
            assert {w for _, w in s[name]} == {0, 1}, name  # both workers read
            if name == "torch":  # the position rule: sample i to rank i % 2, worker i // 2 % 2
                assert all((i % 2, i // 2 % 2) == (rank, w) for b, w in s[name] for i in b)


RESUME = """
def new():
    if KIND == "torch":
        data = Stream(999)
    elif KIND == "sized":
        data = Sized(999)
    else:
        data = hf("parquet", PARQUET)
    return nbdist.loader(data, 8, num_workers=2, shuffle=True, seed=4)

whole = new()
uninterrupted = [ids(whole), ids(whole)]  # epochs 0 and 1
first = new()
it = iter(first)
before = [next(it)["id"].tolist() for _ in range(K)]
saved = everyones(first.state_dict())
del it, first
again = new()
again._resume(saved)
after = [ids(again), ids(again)]
resumed = (before + after[0], after[1])
"""


@pytest.mark.parametrize("kind", ["torch", "sized", "parquet"])
def test_an_epoch_continues_exactly_from_every_ranks_saved_position(cluster, files, kind):
    cluster.run(f"KIND, K = {kind!r}, 5\n" + RESUME, CellOptions(timeout=180))
    uninterrupted = _pulled(cluster, "uninterrupted")
    resumed = _pulled(cluster, "resumed")
    for rank in range(2):
        epoch0, epoch1 = uninterrupted[rank]
        assert len(epoch0) > 5 and epoch0 != epoch1  # shuffled anew each epoch
        assert resumed[rank] == (epoch0, epoch1), f"rank {rank}"
    assert not set(sum(uninterrupted[0][0], [])) & set(sum(uninterrupted[1][0], []))


@pytest.mark.parametrize(
    "source, message",
    [
        (
            "nbdist.loader(Bare(), 4)",
            "the Bare has neither a length nor state_dict/load_state_dict, so its "
            "position cannot be kept: give it __len__",
        ),
        (
            "nbdist.loader(Sized(7), 4, num_workers=4)",
            "the Sized has 7 samples, fewer than the 2 rank(s) × 4 worker(s) that each need one",
        ),
        (
            "dl = nbdist.loader(Sized(40), 4)\ndl._resume([dl.state_dict()] * 3)",
            "a stream cannot be re-split over another number of ranks (the checkpoint's loader "
            "ran on 3, this one on 2): restore on 3 ranks, or read the data from files",
        ),
        (
            "dl = nbdist.loader(Sized(40), 4)\n"
            "nbdist.loader(Sized(40), 8)._resume([dl.state_dict()] * 2)",
            "another loader's (batch_size 4 there, 8 here)",
        ),
    ],
)
def test_bad_input_is_one_line_on_every_rank(cluster, files, source, message):
    with pytest.raises(nbdist.DistributedCellError) as info:
        cluster.run(source, CellOptions(timeout=60))
    text = str(info.value)
    assert text.startswith("ranks 0, 1: UsageError: ") and message in text and "\n" not in text
