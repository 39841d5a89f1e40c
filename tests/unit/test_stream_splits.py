"""The loader over streams without a cluster: the splitting rule, the equal number of batches,
an exact resume through a weights-only checkpoint (torch streams with state or only a length,
Hugging Face streams read from local JSON lines; with and without workers), and the bad input
refused in one line. Ranks are given by hand: a known length needs no collective."""

from __future__ import annotations

import io
import json
import os

import pytest
import torch
import torch.utils.data as tud

from nbdist.errors import UsageError
from nbdist.worker.data.iterables import iterable_loader
from nbdist.worker.data.splitting import (
    epoch_batches,
    file_epoch,
    owner,
    part_sizes,
    window_order,
)

datasets = pytest.importorskip("datasets")
pytest.importorskip("torchdata")


class Counted(tud.IterableDataset):
    """Samples ``{"id": i, "x": [i, -i]}`` for i in 0..n-1, with a length only."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return ({"id": i, "x": torch.tensor([i, -i])} for i in range(self.n))


class Resumable(tud.IterableDataset):
    """The same samples with no length, and a position of its own (torchdata's convention:
    ``load_state_dict`` sets where the next ``iter()`` begins)."""

    def __init__(self, n: int):
        self.n, self.at, self.next_start = n, 0, 0

    def state_dict(self) -> dict:
        return {"at": self.at}

    def load_state_dict(self, state: dict) -> None:
        self.next_start = state["at"]

    def __iter__(self):
        self.at, self.next_start = self.next_start, 0
        while self.at < self.n:
            self.at += 1
            yield {"id": self.at - 1, "x": torch.tensor([self.at - 1, 1 - self.at])}


class Bare(tud.IterableDataset):
    def __iter__(self):
        return iter(range(10))


def hf_stream(folder, sizes=(50, 7, 30, 13)):
    """A Hugging Face stream over JSON-lines files of ``sizes`` rows, ids 0..sum-1."""
    start, files = 0, []
    for f, n in enumerate(sizes):
        files.append(str(folder / f"part-{f}.jsonl"))
        with open(files[-1], "w") as out:
            for i in range(start, start + n):
                out.write(json.dumps({"id": i, "x": [i, -i], "text": f"row {i}"}) + "\n")
        start += n
    return datasets.load_dataset("json", data_files=files, split="train", streaming=True)


#: ``iterable_loader``'s arguments but the dataset and batch size, for rank 0 of 1.
DEFAULTS = dict(rank=0, world=1, shuffle=False, seed=0, drop_last=False, device=None,
                transform=None, options={})  # fmt: skip


def make(dataset, batch_size: int = 4, **given):
    """``iterable_loader`` with ``DEFAULTS`` but what is ``given``."""
    return iterable_loader(dataset, batch_size, **{**DEFAULTS, **given})


def ids(batches) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


def weights_only(state: dict) -> dict:
    """``state`` through a weights-only torch checkpoint, as nbdist.checkpoint keeps it."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# -- the rules ------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, world, workers", [(103, 2, 2), (1000, 3, 4), (7, 7, 1), (50, 1, 3)])
def test_each_sample_has_one_reader_and_the_sizes_count_them(n, world, workers):
    readers = [owner(i, world, workers) for i in range(n)]
    sizes = part_sizes(n, world, workers)
    assert [[readers.count((r, w)) for w in range(workers)] for r in range(world)] == sizes
    assert sum(map(sum, sizes)) == n
    assert max(map(sum, sizes)) - min(map(sum, sizes)) <= 1  # ranks differ by one at most


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_rank_stops_at_the_fewest_batches_any_rank_has(drop_last):
    # 2 ranks, 2 workers each, 17 samples: rank 0's workers have 5 and 4, rank 1's 4 and 4
    assert part_sizes(17, 2, 2) == [[5, 4], [4, 4]]
    # batches of 4: rank 0 has 2 + 1 (1 + 1 dropping), rank 1 1 + 1
    assert epoch_batches(17, 2, 2, 4, drop_last) == 2
    # batches of 3: 2 + 2 on both (1 + 1 dropping)
    assert epoch_batches(17, 2, 2, 3, drop_last) == (2 if drop_last else 4)
    # 3 samples: rank 0's workers have 1 and 1, rank 1's 1 and none
    assert epoch_batches(3, 2, 2, 4, drop_last) == (0 if drop_last else 1)


def test_a_window_is_a_permutation_fixed_by_seed_epoch_rank_worker_and_window():
    base = window_order(100, 3, 0, 0, 0, 0)
    assert sorted(base.tolist()) == list(range(100))
    assert window_order(100, 3, 0, 0, 0, 0).tolist() == base.tolist()
    for changed in [
        (4, 0, 0, 0, 0),
        (3, 1, 0, 0, 0),
        (3, 0, 1, 0, 0),
        (3, 0, 0, 1, 0),
        (3, 0, 0, 0, 1),
    ]:
        assert window_order(100, *changed).tolist() != base.tolist()
    assert file_epoch(3, 0) == file_epoch(3, 0) > 0 and file_epoch(3, 0) != file_epoch(3, 1)


# -- a known length: each rank its part, the same number of batches -------------------------------
@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_and_workers_read_their_own_parts_and_yield_as_many_batches(shuffle):
    world, n = 3, 1001

    def tag(batch):  # runs in the worker that read the batch
        return {**batch, "worker": tud.get_worker_info().id, "pid": os.getpid()}

    seen, counts = [], []
    for rank in range(world):
        dl = make(
            Counted(n),
            16,
            rank=rank,
            world=world,
            shuffle=shuffle,
            seed=5,
            transform=tag,
            options={"num_workers": 2},
        )
        batches = list(dl)
        counts.append((len(dl), len(batches)))
        for b in batches:
            assert b["pid"] != os.getpid()  # the transform ran in a worker process
            assert b["x"].shape == (len(b["id"]), 2) and torch.equal(b["x"][:, 0], b["id"])
            assert {owner(i, world, 2) for i in b["id"].tolist()} == {(rank, b["worker"])}
            seen += b["id"].tolist()
    assert counts == [(epoch_batches(n, world, 2, 16, False),) * 2] * world
    assert len(seen) == len(set(seen))  # nothing read twice, across ranks and workers
    assert n - len(seen) < world * 2 * 16  # what goes unused: less than a batch per worker


def test_a_stream_shorter_than_its_length_says_so():
    class Liar(Counted):
        def __len__(self) -> int:
            return 2 * self.n

    with pytest.raises(UsageError, match="ended after 2 of the 4 batches its length gives"):
        list(make(Liar(8)))


# -- exact resume -------------------------------------------------------------------------------
def _loaders(kind, tmp_path):
    if kind == "hf":
        stream = hf_stream(tmp_path)
        return lambda **kw: make(stream, **kw)
    stream = {"length only": Counted, "state": Resumable}[kind]
    return lambda **kw: make(stream(101), **kw)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("kind", ["length only", "state", "hf"])
def test_a_resumed_loader_continues_exactly(tmp_path, kind, shuffle, workers):
    made = _loaders(kind, tmp_path)

    def new():
        opts = {"num_workers": workers}
        return made(shuffle=shuffle, seed=7, options=opts, window=6)

    dl = new()
    epochs = [ids(dl), ids(dl)]
    assert sorted(i for b in epochs[0] for i in b) == list(range(100 if kind == "hf" else 101))
    assert (epochs[0] != epochs[1]) == shuffle
    for k in (1, 5, len(epochs[0]) - 1):
        dl = new()
        it = iter(dl)
        before = [next(it)["id"].tolist() for _ in range(k)]
        saved = weights_only(dl.state_dict())
        again = new()
        again._resume([saved])
        assert again.state_dict() == saved  # not yet iterated: the position stands
        assert before + ids(again) == epochs[0], f"after {k} batches"
        assert ids(again) == epochs[1]  # and the next epoch is the uninterrupted run's


@pytest.mark.parametrize("kind", ["length only", "hf"])
def test_persistent_workers_see_each_epoch_and_resume_alike(tmp_path, kind):
    made = _loaders(kind, tmp_path)

    def new(**options):
        return made(shuffle=True, seed=3, options={"num_workers": 2, **options}, window=7)

    fresh = new()
    epochs = [ids(fresh) for _ in range(3)]
    kept = new(persistent_workers=True)
    assert [ids(kept) for _ in range(3)] == epochs  # the workers saw each set_epoch
    kept = new(persistent_workers=True)
    it = iter(kept)
    before = [next(it)["id"].tolist() for _ in range(6)]
    saved = weights_only(kept.state_dict())
    del it
    assert ids(kept) == epochs[1]  # an epoch left midway: the next one from its start
    again = new(persistent_workers=True)
    again._resume([saved])
    assert before + ids(again) == epochs[0] and ids(again) == epochs[1]


def test_a_position_after_an_epochs_end_starts_the_next_epoch(tmp_path):
    def new():
        return make(Counted(40), shuffle=True, seed=1, options={"num_workers": 2})

    dl = new()
    first, second = ids(dl), ids(dl)
    dl = new()
    it = iter(dl)
    for _ in range(len(first)):
        next(it)
    saved = weights_only(dl.state_dict())
    assert (saved["epoch"], saved["batches"], saved["loader"]) == (1, 0, None)
    again = new()
    again._resume([saved])
    assert again.epoch == 1 and ids(again) == second


def test_set_epoch_chooses_the_epoch_and_drops_a_position_of_another(tmp_path):
    def new():
        return make(Counted(40), shuffle=True, seed=1)

    dl = new()
    epochs = [ids(dl) for _ in range(3)]
    dl = new()
    dl.set_epoch(2)
    assert ids(dl) == epochs[2] and dl.epoch == 3
    dl = new()
    it = iter(dl)
    next(it)
    saved = dl.state_dict()
    again = new()
    again._resume([saved])
    again.set_epoch(0)  # the same epoch: the position stands
    assert ids(again) == epochs[0][1:]
    again._resume([saved])
    again.set_epoch(1)  # another: from its start
    assert ids(again) == epochs[1]


def test_a_hugging_face_batch_is_a_dict_of_column_to_tensor(tmp_path):
    dl = make(hf_stream(tmp_path), drop_last=True, device=torch.device("cpu"))
    batch = next(iter(dl))
    assert batch["id"].tolist() == [0, 1, 2, 3]
    assert torch.equal(batch["x"], torch.tensor([[0, 0], [1, -1], [2, -2], [3, -3]]))
    assert batch["text"] == ["row 0", "row 1", "row 2", "row 3"]
    with pytest.raises(TypeError, match="length is unknown"):
        len(dl)
    assert repr(dl) == (
        "<nbdist loader: a stream (datasets.IterableDataset), an unknown number of batches of 4 "
        "per rank, epoch 1>"
    )


# -- refused, one line each -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "dataset, world, options, message",
    [
        (Bare(), 1, {}, "has neither a length nor state_dict/load_state_dict"),
        (Counted(5), 3, {"num_workers": 2}, "has 5 samples, fewer than the 3 rank(s) × 2 worker"),
        (Counted(12), 2, {"drop_last": True}, "drop_last=True leaves no batch"),
        (Counted(12), 1, {"in_order": False}, "leave in_order= out"),
        (Counted(12), 1, {"num_workers": -1}, "num_workers must be a whole number"),
        (Counted(12), 1, {"workers": 2}, "workers: no option of torch's DataLoader"),
        (Counted(12), 1, {"prefetch_factor": 2}, "prefetch_factor option could only be"),
        (list(range(12)), 1, {}, "not list"),
        (Resumable(12), 2, {}, "make the loader inside a %%distributed cell"),
    ],
)
def test_bad_input_is_one_line(dataset, world, options, message):
    options = dict(options)
    drop_last = options.pop("drop_last", False)
    with pytest.raises(UsageError) as info:
        make(dataset, 8, world=world, drop_last=drop_last, options=options)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_hugging_face_stream_split_already_is_refused(tmp_path):
    from datasets.distributed import split_dataset_by_node

    part = split_dataset_by_node(hf_stream(tmp_path), rank=0, world_size=2)
    with pytest.raises(UsageError, match="pass it whole, not split_dataset_by_node's part$"):
        make(part)


def test_a_position_of_another_loader_or_world_is_refused_in_one_line():
    def new(batch_size=4, world=1):
        return make(Counted(40), batch_size, world=world)

    dl = new()
    next(iter(dl))
    saved = dl.state_dict()
    cases = [
        (new(), [saved, saved], "cannot be re-split over another number of ranks"),
        (new(batch_size=8), [saved], "another loader's (batch_size 4 there, 8 here)"),
        (new(), [None], "holds no stream position for rank 0"),
        (new(), [{"kind": "blocks"}], "holds no stream position for rank 0"),
    ]
    for loader, positions, message in cases:
        with pytest.raises(UsageError) as info:
            loader._resume(positions)
        assert message in str(info.value) and "\n" not in str(info.value)
