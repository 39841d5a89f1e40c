"""nbdist: distributed PyTorch training from a Jupyter notebook.

In the notebook::

    %load_ext nbdist
    %nbdist start -n 2          # or: cluster = nbdist.start(n=2)

    %%distributed
    model = nbdist.prepare(MyModel())   # DDP on this rank's device
    ...

On the engines, inside ``%%distributed`` cells: ``rank()``, ``world_size()``, ``local_rank()``,
``is_main()``, ``device()``, ``prepare()``, ``train_step()``. In the notebook: ``start()``,
``current()``, ``run_script()``, ``pull()``.

Importing nbdist is cheap: each name loads its module on first use.
"""

from __future__ import annotations

import importlib
import sys

from ._version import __version__ as __version__  # written once: extension/package.json

_PUBLIC = {
    # notebook side
    "start": "nbdist.notebook.session",
    "current": "nbdist.notebook.session",
    "Cluster": "nbdist.notebook.session",
    "HostSpec": "nbdist.config",  # start(hosts=[HostSpec("gpu1", engines=4, user="alice")])
    "pull": "nbdist.notebook.session",
    "run_script": "nbdist.notebook.session",  # %nbdist run FILE ARGS
    "post_mortem": "nbdist.notebook.session",  # a failed cell's frames on its rank
    "profile": "nbdist.notebook.session",  # the last --profile: per-rank table, straggler, trace
    "scatter": "nbdist.notebook.data.scatter",
    "gather": "nbdist.notebook.data.gather",
    "attach": "nbdist.notebook.session",
    "runs": "nbdist.notebook.board.runs",
    "compare": "nbdist.notebook.board.runs",
    "sweep": "nbdist.notebook.sweeps.trials",  # %%distributed --sweep, from Python
    "trials": "nbdist.notebook.sweeps.table",
    "gc": "nbdist.notebook.housekeeping.gc",  # %nbdist gc: what the retention rule frees
    # engine side
    "rank": "nbdist.worker.context",
    "world_size": "nbdist.worker.context",
    "local_rank": "nbdist.worker.context",
    "is_main": "nbdist.worker.context",
    "device": "nbdist.worker.context",
    "prepare": "nbdist.worker.train.prepare",
    "loader": "nbdist.worker.data.loader",
    "train_step": "nbdist.worker.train.step",
    "report": "nbdist.worker.reporting.calls",
    "checkpoint": "nbdist.worker.checkpoint.save",
    "restore": "nbdist.worker.checkpoint.save",
    "restored": "nbdist.worker.checkpoint.save",
    "pipeline": "nbdist.worker.pipeline.stages",  # a model's stages on ranks, and replicas
    "mesh": "nbdist.worker.mesh.grid",  # the ranks as a DeviceMesh: dp × tp × pp
    "materialize": "nbdist.worker.mesh.materialize",  # a meta model, each rank its part
    "steps": "nbdist.worker.checkpoint.steps",
    "trial": "nbdist.worker.trials",  # a sweep's trial: its id and values
    # framework adapters, one line each (see nbdist.worker.integrations)
    "LightningLogger": "nbdist.worker.integrations.lightning",
    "AccelerateTracker": "nbdist.worker.integrations.accelerate",
    "HuggingFaceCallback": "nbdist.worker.integrations.transformers",
    # both
    "UsageError": "nbdist.errors",
    "DistributedCellError": "nbdist.errors",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        try:
            module = importlib.import_module(_PUBLIC[name])
        except ModuleNotFoundError as e:  # an adapter's framework is not installed
            if not e.name or e.name.split(".")[0] == "nbdist":
                raise
            from .errors import UsageError

            raise UsageError(f"nbdist.{name} needs {e.name}: pip install {e.name}") from None
        return getattr(module, name)
    raise AttributeError(f"module 'nbdist' has no attribute {name!r}")


def __dir__():
    return __all__ + ["__version__", "load_ipython_extension"]


def load_ipython_extension(ipython) -> None:
    """``%load_ext nbdist``: register ``%nbdist`` and ``%%distributed``, and start a spare
    engine fork server, so that the next local ``%nbdist start`` finds torch imported
    (``NBDIST_PREWARM=0``: none; see ``nbdist.notebook.cluster.engines.forks``)."""
    from .errors import UsageError
    from .notebook.cluster.engines import forks
    from .notebook.magics import NbdistMagics

    ipython.register_magics(NbdistMagics)
    try:
        forks.prewarm()
    except UsageError as exc:  # a bad NBDIST_PREWARM: said once, and no spare
        print(f"nbdist: {exc}", file=sys.stderr)


# -- Jupyter extension hooks: the sidebar's endpoints and its prebuilt lab extension ----------


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "nbdist"}]


def _load_jupyter_server_extension(serverapp) -> None:
    """Serve the sidebar's endpoints under ``/nbdist/api/`` (see ``nbdist.server.handlers``)."""
    from .server.handlers import setup_routes

    setup_routes(serverapp.web_app)


def _jupyter_labextension_paths() -> list[dict]:
    return [{"src": "labextension", "dest": "nbdist"}]
