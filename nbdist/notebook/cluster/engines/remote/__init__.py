"""Engines on other hosts, started over SSH or through a scheduler by ipyparallel's launchers.

``engines.RemoteEngines`` is the engine set (``EngineSet``); ``roster`` knows which of its engines
is which (pid, host, gone) and where replacements go; ``launchers`` holds ipyparallel's
launchers as nbdist uses them (``ssh``, ``slurm``, ``mpi``, ``local``) and checks their options;
``checks`` runs before and just after the engines start (the controller's address, each host
over ssh, threads per engine, one environment across hosts); ``shell`` runs scripts on a host;
``jobs`` keeps a scheduler's jobs (queued, ended, cancelled by a guard when the kernel is gone),
asking Slurm through the floor's ``records.slurm``.
"""
