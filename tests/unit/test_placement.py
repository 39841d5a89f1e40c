"""GPU placement with given device inventories: local ranks, devices, backend, and the mixes."""

from __future__ import annotations

import dataclasses

import pytest

from nbdist.errors import UsageError
from nbdist.notebook.cluster import placement
from nbdist.protocol import GpuInfo, Inventory

_A100 = GpuInfo(name="NVIDIA A100-SXM4-80GB", memory=85_899_345_920)


def _engines(*hosts: tuple[str, int, int], visible=None) -> dict[int, Inventory]:
    """Engines as setup() describes them: (host, engines, GPUs each sees) per host."""
    inv, eid = {}, 0
    for host, n, gpus in hosts:
        for i in range(n):
            inv[eid] = Inventory(
                host=host,
                pid=1000 + eid,
                threads=1,
                gpus=(_A100,) * gpus,
                cuda_visible=visible(host, i) if visible else None,
            )
            eid += 1
    return inv


def _layout(slots):
    return [
        (s.rank, s.host, s.local_rank, s.local_world_size, s.group_rank, s.device) for s in slots
    ]


def test_every_rank_with_a_gpu_of_its_own_means_nccl_on_cuda_local_rank():
    slots, backend = placement.place(_engines(("gpu1", 2, 2), ("gpu2", 2, 2)))
    assert backend == "nccl"
    assert _layout(slots) == [
        (0, "gpu1", 0, 2, 0, "cuda:0"),
        (1, "gpu1", 1, 2, 0, "cuda:1"),
        (2, "gpu2", 0, 2, 1, "cuda:0"),
        (3, "gpu2", 1, 2, 1, "cuda:1"),
    ]


def test_no_gpu_anywhere_means_gloo_on_cpu():
    slots, backend = placement.place(_engines(("a", 2, 0), ("b", 1, 0)))
    assert backend == "gloo" and {s.device for s in slots} == {"cpu"}


def test_a_mix_is_refused_naming_the_ranks_without_a_gpu():
    with pytest.raises(UsageError, match=r"ranks \[2\] have no GPU .* --allow-mixed"):
        placement.place(_engines(("gpu1", 2, 2), ("cpu1", 1, 0)))
    # more engines than GPUs on a host is a mix too
    with pytest.raises(UsageError, match=r"ranks \[2, 3\] have no GPU"):
        placement.place(_engines(("gpu1", 4, 2)))


def test_a_mix_is_allowed_with_gloo_on_cpu_and_a_warning_by_option():
    with pytest.warns(UserWarning, match=r"ranks \[2\] have no GPU .* CPU on every rank"):
        slots, backend = placement.place(_engines(("gpu1", 2, 2), ("cpu1", 1, 0)), allow_mixed=True)
    assert backend == "gloo" and {s.device for s in slots} == {"cpu"}


def test_nccl_asked_for_where_a_rank_has_no_gpu_is_refused():
    with pytest.raises(UsageError, match=r"backend nccl needs a GPU for every rank.*\[1\]"):
        placement.place(_engines(("gpu1", 2, 1)), backend="nccl")


def test_gloo_asked_for_on_gpus_keeps_the_gpus():
    slots, backend = placement.place(_engines(("gpu1", 2, 2)), backend="gloo")
    assert backend == "gloo" and [s.device for s in slots] == ["cuda:0", "cuda:1"]


def test_engines_given_a_cuda_visible_devices_slice_each_use_its_first_gpu():
    # as a scheduler binds one GPU per task: each engine sees one GPU, a different one
    inv = _engines(("gpu1", 4, 1), visible=lambda host, i: str(i))
    slots, backend = placement.place(inv)
    assert backend == "nccl"
    assert [(s.local_rank, s.device) for s in slots] == [(i, "cuda:0") for i in range(4)]


def test_a_host_wide_slice_is_shared_so_ranks_take_cuda_local_rank_within_it():
    inv = _engines(("gpu1", 2, 2), visible=lambda host, i: "2,3")
    slots, _ = placement.place(inv)
    assert [s.device for s in slots] == ["cuda:0", "cuda:1"]  # physical GPUs 2 and 3


def test_hosts_are_ranked_in_the_order_given_not_the_order_engines_registered():
    inv = _engines(("gpu2", 1, 0), ("gpu1", 2, 0))  # gpu2's engine registered first
    order = {"gpu1": 0, "gpu2": 1}
    inv = {k: dataclasses.replace(e, host_index=order[e.host]) for k, e in inv.items()}
    slots, _ = placement.place(inv)
    assert [(s.rank, s.host, s.local_rank, s.group_rank) for s in slots] == [
        (0, "gpu1", 0, 0),
        (1, "gpu1", 1, 0),
        (2, "gpu2", 0, 1),
    ]


def test_status_names_each_ranks_gpu_and_its_memory():
    inv = _engines(("gpu1", 1, 2))[0]
    assert placement.gpu_label(inv, "cuda:1") == "NVIDIA A100-SXM4-80GB, 80.0 GiB"
    assert placement.gpu_label(inv, "cpu") == "-"
    assert placement.gpu_label(inv, "cuda:5") == "?"
    assert placement.gpu_label(None, "cuda:0") == "?"  # an engine not described (yet)


def test_a_replacement_engine_takes_over_the_rank_alone():
    slots, _ = placement.place(_engines(("a", 2, 0), ("b", 1, 0)))
    after = placement.substitute(slots, 1, 7, Inventory(host="a", pid=4242, threads=1))
    s = after[1]
    assert (s.rank, s.engine_id, s.host, s.pid, s.local_rank) == (1, 7, "a", 4242, 1)
    assert after[0] == slots[0] and after[2] == slots[2]


def test_on_a_machine_with_cuda_ranks_go_on_its_gpus():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    from nbdist.worker.api import setup

    me = setup(1)
    n = len(me.gpus)
    inv = {i: dataclasses.replace(me, pid=me.pid + i) for i in range(n)}
    slots, backend = placement.place(inv)
    assert backend == "nccl"
    assert [s.device for s in slots] == [f"cuda:{i}" for i in range(n)]
    assert all(placement.gpu_label(inv[s.engine_id], s.device) not in ("-", "?") for s in slots)
