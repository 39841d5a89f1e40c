"""First contact with a fresh engine: size its thread pool and describe it to the notebook."""

from __future__ import annotations

import os
import platform
import socket
import sys


def _namespace() -> dict:
    from IPython import get_ipython

    shell = get_ipython()
    return shell.user_ns if shell is not None else sys.modules["__main__"].__dict__


def setup(threads: int) -> dict:
    """Give this engine ``threads`` intra-op threads, load torch, and return its inventory.

    The inventory (host, pid, GPUs, versions) is what the notebook places ranks by and what
    ``%nbdist status`` shows.
    """
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    import torch

    from . import rendezvous

    torch.set_num_threads(threads)
    _namespace()["nbdist"] = sys.modules["nbdist"]  # cells may say nbdist.rank() without import
    rendezvous.install_idempotent_init()
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"name": p.name, "memory": p.total_memory})
    from .. import __version__

    return {
        # the host's name as the notebook named it (remote engines), else its own
        "host": os.environ.get("NBDIST_HOST") or socket.gethostname(),
        "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),  # this engine's GPU slice
        "pid": os.getpid(),
        "threads": threads,
        "gpus": gpus,
        "python": platform.python_version(),
        "torch": torch.__version__.split("+")[0],
        "nbdist": __version__,
        "executable": sys.executable,
    }
