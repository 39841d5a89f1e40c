"""What a run shows: the collector (telemetry folded per rank), the live dashboard (drawn by the
browser from ``static/``), its final picture, and the kept runs read back (``runs``). Imports
only the floor (``telemetry``, ``config``, ``protocol``): it knows nothing of the run or cluster.
"""
