"""A cell on the ranks, from sending to the last line: the run's controller (its states), the
supervisor (one attempt, watched), the pure recovery policy, the journal's replay, and the monitor
that feeds the board. Imports ``cluster/`` and ``board/`` beneath it, never ``session``.
"""
