"""The cluster: engines (local, remote, hosted), a rank on each, the process group over them.

``ranks.Ranks`` starts and mends it; ``fanout`` calls many engines with one deadline, each
request's printed output bounded by ``streams``; ``journal`` keeps what fresh engines must be
given again; ``hosts``, ``placement`` and ``inventory`` decide where ranks run; ``attach``
connects to a cluster the sidebar holds; ``progress`` is the line a start shows while it waits.
Knows nothing of cells: imports only the floor (host records: ``records.registry``) and
``worker.api``.
"""
