"""Checkpoints: ``save`` (``nbdist.checkpoint``, ``nbdist.restore``: rank 0 writes, restore
broadcasts), ``files`` (on disk: atomic, marked, verified, loaded without running code),
``steps`` (``nbdist.steps``, the resumable loop). Imports ``train/``, ``pipeline/``, the
engine's top modules and the floor.
"""
