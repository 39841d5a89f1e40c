"""The processes a local cluster starts beside the kernel, each run as ``python -m``:

- ``forkserver``: imports torch once and forks the engines from itself (engine side: it loads
  ``nbdist.worker``);
- ``controller``: ipyparallel's controller, leaving without the interpreter's teardown;
- ``lifeline``: ties each of them, and every engine, to the kernel that started it.

Imports nothing of the kernel's side (``nbdist.notebook``, ``nbdist.server``).
"""
