"""A person's objects across stops. A stop (an interrupt, a rank's error, a lost rank) ends the
group's formation; the next cell's is new. ``rebinding`` is the pass the runner makes at the
start of a cell on every rank: ``ddp`` and ``fsdp`` hand a model the new formation's group and
clear what a half-done step left, and ``replicas`` finds replicas that drifted apart and makes
them one again. Imports the engine's ground (``groups``, ``rendezvous``, ``state``),
``collectives`` and ``train``.
"""
