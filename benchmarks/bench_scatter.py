"""Scatter speed: ``nbdist.scatter`` of numpy and torch against ipyparallel's own ``view.scatter``.

    python benchmarks/bench_scatter.py [--size-mb 1024] [--repeat 3] [--engines 2]

Sends one float32 array (rows of 1 KB) to the engines; every case runs ``--repeat`` times,
interleaved, in the same run, and the best time counts. The baseline, ipyparallel's scatter,
splits the array into contiguous blocks and pushes them as raw buffers: the same work as
``nbdist.scatter(shuffle=False)``. nbdist's default (shuffled) also copies each shard's rows in
the notebook first. Uses the current nbdist cluster if there is one, else starts (and stops) one.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import time

import numpy as np

import nbdist

_ROW = 256  # float32 values per row: 1 KB rows


def _clear(view) -> None:
    view.execute("for _n in ('bench_a', 'bench_b'): globals().pop(_n, None)", block=True)


def _cases(view, x: np.ndarray, t) -> dict:
    def ours(data, shuffle):
        with contextlib.redirect_stdout(io.StringIO()):  # the shard report
            nbdist.scatter("bench_a", data, shuffle=shuffle)

    return {
        "ipyparallel view.scatter (baseline)": lambda: view.scatter("bench_b", x, block=True),
        "nbdist.scatter numpy, shuffle=False": lambda: ours(x, False),
        "nbdist.scatter torch, shuffle=False": lambda: ours(t, False),
        "nbdist.scatter numpy, shuffled": lambda: ours(x, True),
        "nbdist.scatter torch, shuffled": lambda: ours(t, True),
    }


def run(cluster, size_mb: float, repeat: int) -> dict[str, float]:
    """Best seconds of each case."""
    import torch

    rows = max(len(cluster.slots), int(size_mb * 1e6) // (_ROW * 4))
    x = np.random.default_rng(0).standard_normal((rows, _ROW), dtype=np.float32)
    t = torch.from_numpy(x.copy())
    view = cluster.client[[s.engine_id for s in cluster.slots]]
    cases = _cases(view, x, t)
    best = dict.fromkeys(cases, float("inf"))
    try:
        for _ in range(repeat):
            for name, case in cases.items():
                _clear(view)
                t0 = time.perf_counter()
                case()
                best[name] = min(best[name], time.perf_counter() - t0)
    finally:
        _clear(view)
    gb = x.nbytes / 1e9
    base = best["ipyparallel view.scatter (baseline)"]
    print(
        f"scatter of {x.nbytes / 1e6:.0f} MB float32 to {len(cluster.slots)} engines, "
        f"best of {repeat}"
    )
    print(f"{'case':<38}{'seconds':>9}{'GB/s':>8}{'vs ipyparallel':>16}")
    for name, s in best.items():
        print(f"{name:<38}{s:>9.3f}{gb / s:>8.2f}{base / s:>16.2f}")
    return best


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=float, default=1024, help="array size, MB (default 1024)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each case (best counts)")
    p.add_argument("--engines", type=int, default=2, help="engines to start if none is running")
    args = p.parse_args(argv)
    cluster = nbdist.current(required=False)
    if cluster is not None:
        return run(cluster, args.size_mb, args.repeat)
    with nbdist.start(n=args.engines) as cluster:
        return run(cluster, args.size_mb, args.repeat)


if __name__ == "__main__":
    main()
