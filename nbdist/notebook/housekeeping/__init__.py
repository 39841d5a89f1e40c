"""Housekeeping: what the data folder holds, and what the retention rule may free of it.

``census`` walks the data folder once (sizes by kind, the entries judged); ``inuse`` says what
is in use now (running clusters and hosts, by the PIDs their records name; running runs; the
kernel's own cluster); ``plan`` applies ``config.Retention`` to both: what would go, with sizes,
freed only when asked; ``gc`` is ``nbdist.gc()``, ``%nbdist gc`` and ``%nbdist status``'s line,
with the shared-memory segments whose maker is gone beside the data folder's. A room above
``session`` (it asks for the kernel's cluster), beneath ``magics``; it imports ``cluster/`` (the
engine logs), ``records.registry`` (host records), ``worker.collectives.segments`` (no torch)
and the rest of the floor.
"""
