"""Checkpoints: ``save`` (``nbdist.checkpoint``, ``nbdist.restore``: rank 0 writes, restore
broadcasts), ``files`` (on disk: atomic, marked, verified, loaded without running code; which
run a folder belongs to), ``contents`` (what a checkpoint may hold), ``steps``
(``nbdist.steps``, the resumable loop). Imports ``train/``, ``pipeline/``, the engine's top
modules and the floor.
"""
