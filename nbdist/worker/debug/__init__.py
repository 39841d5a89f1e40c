"""Looking inside a rank: a failed cell's frames kept until the next cell (``postmortem``: pdb
and ``nbdist.post_mortem``). Imports the engine's ground (``state``) and the floor; the kernel
reaches it through ``worker.api`` only.
"""
