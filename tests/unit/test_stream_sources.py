"""``nbdist.loader`` over files in one process (a rank's context set by hand): JSON lines split
into blocks at any size, the columns every block is read as, and bad input in one line each."""

from __future__ import annotations

import json

import numpy as np
import pytest

from nbdist.errors import UsageError
from nbdist.protocol import RankInfo
from nbdist.worker import context
from nbdist.worker.data import sources
from nbdist.worker.data.loader import loader
from nbdist.worker.state import engine

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture
def rank():
    """Make this process rank ``r`` of ``world`` for the test."""
    before = engine.rank_info

    def become(r: int = 0, world: int = 2) -> None:
        context.set_current(RankInfo(r, world, r, world, 0, "127.0.0.1", 1, "gloo", "cpu"))

    yield become
    engine.rank_info = before


def _jsonl(path, ids, last_newline=True) -> None:
    text = "\n".join(json.dumps({"id": int(i), "v": [1.5, float(i)]}) for i in ids)
    path.write_text(text + ("\n" if last_newline else ""))


@pytest.mark.parametrize("block", [1, 3, 7, 100])
@pytest.mark.parametrize("last_newline", [True, False])
def test_json_lines_split_into_blocks_hold_every_line_once(
    tmp_path, monkeypatch, block, last_newline
):
    monkeypatch.setattr(sources, "JSONL_BLOCK", block)
    _jsonl(tmp_path / "a.jsonl", range(20), last_newline)
    found = sources.files(str(tmp_path / "a.jsonl"), False)
    assert sum(found.sizes) == 20
    ids = [i for b in range(len(found.blocks)) for i in found.read(b).column("id").to_pylist()]
    assert ids == list(range(20))


def test_a_batch_is_a_dict_of_columns_as_collate_makes(tmp_path, rank):
    rank(0, 1)
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    pq.write_table(
        pa.table({"id": range(6), "x": list(x), "t": list("abcdef")}), tmp_path / "a.parquet"
    )
    (batch,) = list(loader(str(tmp_path / "*.parquet"), 6, shuffle=False))
    assert batch["id"].tolist() == list(range(6))
    assert batch["x"].shape == (6, 2) and batch["x"].dtype.is_floating_point
    assert batch["t"] == list("abcdef")


def test_every_file_is_read_with_the_first_files_columns(tmp_path, rank):
    rank(0, 1)
    x = np.ones((4, 2), dtype=np.float32)
    pq.write_table(pa.table({"id": range(4), "v": list(x)}), tmp_path / "a.parquet")
    _jsonl(tmp_path / "b.jsonl", range(4, 8))  # JSON reads numbers as float64
    dl = loader([str(tmp_path / "a.parquet"), str(tmp_path / "b.jsonl")], 8, shuffle=False)
    (batch,) = list(dl)
    assert batch["v"].dtype == __import__("torch").float32
    assert batch["id"].tolist() == list(range(8))


def test_bad_input_is_one_line_naming_the_fix(tmp_path, rank):
    rank(0, 2)

    def line(*args, **kw) -> str:
        with pytest.raises(UsageError) as e:
            loader(*args, **kw)
        text = str(e.value)
        assert "\n" not in text and "Traceback" not in text
        return text

    assert "matches no file" in line(str(tmp_path / "none-*.parquet"), 4)
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    bad = line(str(tmp_path / "bad.parquet"), 4)
    assert str(tmp_path / "bad.parquet") in bad and "skip_unreadable=True" in bad
    (tmp_path / "x.csv").write_text("a,b\n")
    assert "none of them" in line(str(tmp_path / "x.csv"), 4)
    _jsonl(tmp_path / "few.jsonl", range(3))
    few = line(str(tmp_path / "few.jsonl"), 1, num_workers=2)
    assert "2 rank(s) × 2 worker(s)" in few
    assert "drop_last=True leaves no batch" in line(str(tmp_path / "few.jsonl"), 4, drop_last=True)
    assert "persistent_workers" in line(str(tmp_path / "few.jsonl"), 1, persistent_workers=True)
    assert "shuffle_window" in line(str(tmp_path / "few.jsonl"), 1, shuffle_window=0)


def test_skip_unreadable_leaves_the_file_out_and_names_it(tmp_path, rank, capsys):
    rank(0, 1)
    _jsonl(tmp_path / "a.jsonl", range(5))
    (tmp_path / "b.parquet").write_bytes(b"broken")
    dl = loader([str(tmp_path / "a.jsonl"), str(tmp_path / "b.parquet")], 5, skip_unreadable=True)
    assert sorted(next(iter(dl))["id"].tolist()) == list(range(5))
    assert f"left out 1 unreadable file(s): {tmp_path / 'b.parquet'}" in capsys.readouterr().out


def test_a_checkpoint_of_another_loader_is_refused(tmp_path, rank):
    rank(0, 1)
    _jsonl(tmp_path / "a.jsonl", range(10))
    saved = loader(str(tmp_path / "a.jsonl"), 2, seed=1).state_dict()
    with pytest.raises(UsageError, match="read other data or in another order"):
        loader(str(tmp_path / "a.jsonl"), 2, seed=2)._resume([saved])


def test_a_hugging_face_dataset_is_read_from_its_table(rank):
    datasets = pytest.importorskip("datasets")
    rank(1, 2)
    ds = datasets.Dataset.from_dict(
        {"id": list(range(10)), "x": [[float(i)] * 3 for i in range(10)]}
    )
    ids = [i for b in loader(ds, 2, shuffle=False) for i in b["id"].tolist()]
    assert ids == [5, 6, 7, 8, 9]  # rank 1's contiguous half
    assert next(iter(loader(ds, 2)))["x"].shape == (2, 3)


def test_loader_keyword_takes_only_an_nbdist_loader():
    from nbdist.worker.checkpoint import positions

    with pytest.raises(UsageError, match="loader= takes a loader made by nbdist.loader"):
        positions.check("checkpoint", iter([1, 2]))


def test_a_datasets_loader_resumes_its_epoch_and_resplits_over_other_ranks(rank):
    import torch

    ds = torch.utils.data.TensorDataset(torch.arange(50))

    def ids(dl, k=None):
        it = iter(dl)
        got = [next(it)[0].tolist() for _ in range(k)] if k else [b[0].tolist() for b in it]
        return [i for b in got for i in b]

    rank(1, 2)
    whole = ids(loader(ds, 4, seed=3))
    dl = loader(ds, 4, seed=3)
    head = ids(dl, 2)
    saved = [None, dl.state_dict()]
    again = loader(ds, 4, seed=3)
    again._resume(saved)
    assert head + ids(again) == whole  # the same ranks: the epoch goes on with its next batch
    had = set()
    for r in range(2):  # both ranks had 2 batches; then the run goes on over 3 ranks
        rank(r, 2)
        had |= set(ids(loader(ds, 4, seed=3), 2))
    rest = []
    for r in range(3):
        rank(r, 3)
        dl = loader(ds, 4, seed=3)
        dl._resume(saved)
        rest += ids(dl)
    assert set(rest) | had == set(range(50)) and not set(rest) & had


def test_an_iterator_whose_workers_were_reclaimed_goes_on_where_it_stood(tmp_path, rank):
    from nbdist.worker.data import workers

    rank(0, 1)
    _jsonl(tmp_path / "a.jsonl", range(40))
    whole = [b["id"].tolist() for b in loader(str(tmp_path / "a.jsonl"), 4, num_workers=2)]
    dl = loader(str(tmp_path / "a.jsonl"), 4, num_workers=2)
    it = iter(dl)
    head = [next(it)["id"].tolist() for _ in range(3)]
    workers.reclaim()  # as after a failed cell: its worker processes end now
    assert head + [b["id"].tolist() for b in it] == whole


def test_files_without_the_first_files_columns_are_named_before_any_batch(tmp_path, rank):
    rank(0, 1)
    pq.write_table(pa.table({"id": [1, 2], "y": [0.5, 1.5]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [3, 4]}), tmp_path / "b.parquet")
    with pytest.raises(UsageError, match=r"b.parquet has no column 'y', which .*a.parquet has"):
        loader(str(tmp_path / "*.parquet"), 2)


def test_a_json_lines_file_cut_short_is_unreadable_and_can_be_left_out(tmp_path, rank, capsys):
    rank(0, 1)
    _jsonl(tmp_path / "a.jsonl", range(6))
    (tmp_path / "b.jsonl").write_text('{"id": 6, "v": [1.5, 6.0]}\n{"id": 7, "v": [1.')
    with pytest.raises(UsageError, match=r"cannot read .*b.jsonl: .*skip_unreadable=True"):
        loader(str(tmp_path / "*.jsonl"), 2)
    dl = loader(str(tmp_path / "*.jsonl"), 2, skip_unreadable=True)
    assert sorted(i for b in dl for i in b["id"].tolist()) == list(range(6))
    assert "left out 1 unreadable file(s)" in capsys.readouterr().out


def test_a_bad_line_met_in_a_worker_is_one_line_naming_the_file(tmp_path, rank):
    rank(0, 1)
    lines = [json.dumps({"id": i, "v": [1.0, 2.0]}) for i in range(10)]
    lines[5] = "{not json"
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(UsageError) as e:
        list(loader(str(tmp_path / "a.jsonl"), 2, num_workers=1, shuffle=False))
    assert "\n" not in str(e.value) and "a.jsonl" in str(e.value), str(e.value)


def _tar(path, first: int, count: int) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for n in range(first, first + count):
            for ext, body in (
                ("cls", str(n % 10).encode()),
                ("json", json.dumps({"id": n}).encode()),
            ):
                info = tarfile.TarInfo(f"shard/{n:06d}.{ext}")
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))


def test_webdataset_tar_shards_give_every_sample_once_as_bytes(tmp_path, rank, monkeypatch):
    from nbdist.worker.data import tars

    monkeypatch.setattr(tars, "TAR_BLOCK", 16)  # several blocks a shard
    _tar(tmp_path / "a.tar", 0, 100)
    _tar(tmp_path / "b.tar", 100, 3)
    seen = []
    for r in range(2):
        rank(r, 2)
        for b in loader(str(tmp_path / "*.tar"), 8, num_workers=2, seed=4):
            assert sorted(b) == ["__key__", "cls", "json"]
            ids = [json.loads(j)["id"] for j in b["json"]]
            assert b["__key__"] == [f"shard/{i:06d}" for i in ids]
            assert b["cls"] == [str(i % 10).encode() for i in ids]
            seen += ids
    assert set(seen) == set(range(103)) and len(seen) == 104  # one padded sample


def test_a_compressed_tar_is_named_unreadable(tmp_path, rank):
    import tarfile

    rank(0, 1)
    _tar(tmp_path / "a.tar", 0, 4)
    with tarfile.open(tmp_path / "a.tar") as plain, tarfile.open(tmp_path / "z.tar", "w:gz") as z:
        for m in plain:
            z.addfile(m, plain.extractfile(m))
    with pytest.raises(UsageError, match=r"cannot read .*z.tar: .*skip_unreadable=True"):
        loader(str(tmp_path / "z.tar"), 2)
