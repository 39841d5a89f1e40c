"""Sweeps: one cell run once per trial, each on its own block of ranks. ``spec`` (what is tried),
``trials`` (the loop that runs them), ``table`` (``nbdist.trials()``), ``board`` (the live
board). Imports ``session``, ``run/``, ``board/``, ``cluster/`` and the floor.
"""
