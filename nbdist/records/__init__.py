"""Records of the clusters on this machine, on the floor: what the kernel, the server and the
cluster host all read, so none of them imports another's code to find a cluster.

``registry``: the records, control sockets and leases of clusters started from the sidebar;
``profile``: nbdist's ipyparallel profile, where every cluster's files are; ``slurm``: a Slurm
job's state (and the check before submitting, cancelling); ``limits``: how many engines a
cluster on this machine may have. Imports only the floor (``config``, ``datadir``, ``errors``,
``protocol``), never ``notebook/``, ``server/``, ``host/`` or ``worker/``.
"""
