"""Engine sets: local, remote and hosted engines behind one interface (``base.EngineSet``).

``local`` forks engines from a warm fork server; ``remote/`` starts them on other hosts (SSH,
Slurm, MPI); ``hosted`` uses the engines of a cluster the sidebar started; ``processes`` reaps
what they start. Which one a cluster gets: ``cluster.ranks.for_config``. Imports the floor
(``config``, ``protocol``, ``errors``) and its siblings in ``cluster/``, nothing above.
"""
