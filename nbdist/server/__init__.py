"""Server side: nbdist's Jupyter server extension and the processes it starts.

``handlers`` serves ``/nbdist/api/...`` (clusters, runs, metrics, curves, worker health) to the
sidebar in ``extension/``; ``curves`` folds a run's metrics and health from the run store into
small curves, kept per run; ``pages`` bounds the rest of a run's answers (raw rows a page at a
time) and encodes every answer as strict JSON; ``clusters`` is the server's view of running
clusters and its start/stop actions; ``registry`` holds the records of clusters started from the
sidebar; ``host`` is the small process that holds such a cluster. Nothing here imports torch:
the server stays light.
"""
