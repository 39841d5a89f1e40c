"""Checkpoints: ``save`` (``nbdist.checkpoint``, ``nbdist.restore``: rank 0 writes, restore
broadcasts), ``sharded`` (a sharded model's: every rank writes its own shards with
``torch.distributed.checkpoint``; ``statedicts``: what each object becomes, ``storage``: DCP's
files made private, atomic and safe to read), ``files`` (on disk: atomic, marked, verified,
loaded without running code), ``folders`` (where a run's folder is, made safely), ``owner``
(which run a folder belongs to), ``snapshot`` (a run's own checkpoints, pinned for a tracker),
``contents`` (what a checkpoint may hold), ``steps`` (``nbdist.steps``, the resumable loop).
Imports ``train/``, ``pipeline/``, the engine's top modules and the floor.
"""
