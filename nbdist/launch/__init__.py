"""The processes nbdist starts beside the kernel, each run as ``python -m``:

- ``forkserver``: imports torch once and forks a local cluster's engines from itself (engine
  side: it loads ``nbdist.worker``);
- ``controller``: ipyparallel's controller (local and remote clusters), leaving without the
  interpreter's teardown, with ``heart``: a slow heartbeat that registers new engines at once;
- ``lifeline``: ties each of them, and every engine, to the kernel that started it;
- ``title``: what each is called in ``ps`` (``nbdist engine 3 (cluster X)``).

Imports nothing of the kernel's side (``nbdist.notebook``, ``nbdist.server``).
"""
