"""What an engine tells the notebook while a cell runs: ``nbdist.report()`` and what carries it.

- ``calls``: what a cell's code calls: ``report()`` (queued in about a microsecond, checked on a
  fast path), ``event()``, and ``on_step()`` (the profiler's step hook).
- ``sender``: the engine's thread that sends what is queued as one ``Batch`` every half second,
  tied to the running cell (``begin_cell``, ``end_cell``: the runner's hooks; ``publish``).
- ``health``: the health sample each batch carries: the rank's pace, CPU, memory, GPU, and the
  share of a step spent communicating (from DDP's own timers) and waiting for data.
- ``datawait``: ``timed(batches)``, the wrapper nbdist's loaders put on their iterators: each
  ``next()`` timed, the share of the rank's steps spent waiting for the next batch.

Stands on the engine's ground (``state``, ``context``) and the floor (``telemetry.events``).
"""
