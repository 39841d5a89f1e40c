"""What a run shows: the collector (telemetry folded per rank), each rank's state and health
verdict (``health``), its output as lines (``lines``), the live dashboard (drawn by the browser
from ``static/built/``), its final picture, and the kept runs read back (``runs``). Imports only
the floor (``telemetry``, ``config``, ``protocol``): it knows nothing of the run or cluster.
"""
