"""Tests on real processes: clusters, kernels, servers, browsers. One folder per job, as the code
is laid out (docs/architecture.md):

- ``cluster/``: starting and stopping a cluster's engines: the fork server, cores, eight ranks,
  pids and signals, a cluster host attached to
- ``cells/``: a ``%%distributed`` cell on the ranks, its output, its bad input
- ``recovery/``: lost ranks and engines, restarts, elastic shrinking, a killed kernel
- ``training/``: DDP's options, sync modes (local SGD, DiLoCo, gossip, async), meshes, pipelines,
  the shared-memory all-reduce
- ``data/``: scatter, gather and the loader
- ``checkpoints/``: checkpoints trusted, sharded, and a run started afresh or resumed
- ``sweeps/``: the trials and their board
- ``telemetry/``: reports, health, the run store, the trackers
- ``boards/``: the dashboard, in a browser and with no front end at all
- ``server/``: the sidebar's endpoints; ``sidebar/``: the sidebar in JupyterLab
- ``remote/``: engines over SSH, on two hosts, through Slurm and MPI
- ``frameworks/``: scripts as torchrun runs them, the frameworks' own, their adapters
- ``debug/``: the post-mortem, stacks, the profile
- ``housekeeping/``: ``%nbdist gc`` and the data folder
- ``shipped/``: what ships beside the code: the package as pip installs it, the example
  notebooks, the benchmarks

A fixture that only one folder's tests use is in that folder's conftest.py; the helpers every
folder imports are modules in tests/ (tests/conftest.py says which).
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ready(kernel):
    """The module's kernel (tests/conftest.py) with a running 2-engine cluster, stopped after the
    module's tests."""
    kernel.ok("%nbdist start -n 2")
    yield kernel
    kernel.ok("%nbdist stop")
