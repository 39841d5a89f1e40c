"""The engine side: what runs on each rank's engine. ``api`` is the only door the kernel ships
through; at the top stand the engine's state, its rank context, the cell runner, the script
process, rendezvous and shards. Job folders: ``reporting/`` (``nbdist.report()`` and what sends
it), ``train/`` (wrapping and sync), ``pipeline/``, ``checkpoint/``, ``integrations/``. Never
imports ``notebook/`` or ``server/``.
"""
