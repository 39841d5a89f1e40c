"""Server side: nbdist's Jupyter server extension, the HTTP handlers the sidebar calls.

``handlers`` serves ``/nbdist/api/...`` (clusters, runs, metrics, curves, worker health) to the
sidebar in ``extension/``; ``curves`` folds a run's metrics and health from the run store into
small curves, kept per run; ``pages`` bounds the rest of a run's answers (raw rows a page at a
time) and encodes every answer as strict JSON; ``clusters`` is the server's view of running
clusters and its start/stop actions (a start spawns ``python -m nbdist.host``). Imports only the
floor (the host records, the profile and Slurm's jobs from ``records``; the run store from
``telemetry``), never ``notebook/`` or ``host/``. Nothing here imports torch: the server stays
light.
"""
