"""Sweeps: one cell run once per trial, each on its own block of ranks. ``spec`` (what is tried),
``trials`` (the sweep: its trials' runs, each through the run's controller, stepped in turn),
``blocks`` (where a trial runs, and how it moves when a rank is lost), ``table``
(``nbdist.trials()``), ``board`` (the live board) and ``picture`` (its final PNG). Imports
``session``, ``run/``, ``board/``, ``cluster/`` and the floor.
"""
