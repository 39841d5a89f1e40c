"""The kernel side: what runs in the notebook's kernel, arranged by job.

``magics`` (``%nbdist``, ``%%distributed``) stands at the top; ``session`` holds the kernel's one
cluster (start, attach, current, run, pull), which ``data/`` and ``sweeps/`` act on. Beneath
them ``run/`` (a cell on the ranks), then ``cluster/`` (engines, ranks, the group) and
``board/`` (what a run shows). Nothing imports upward: ``run/``, ``cluster/`` and ``board/``
never import ``session``, ``data/`` or ``sweeps/``. Engine code comes only through
``nbdist.worker.api``; below everything, the floor (``protocol``, ``config``, ``telemetry``).
"""
