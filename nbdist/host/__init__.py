"""The cluster host: the process that holds a cluster started from the sidebar.

Run as ``python -m nbdist.host --n N`` (``__main__``), spawned by the server, which names it
only by that module path and never imports it. Kernel-like: it starts its cluster through
``notebook.session`` and writes its record through the floor's ``records.registry``. It may
import the kernel (``notebook/``) and the floor; nothing imports it, and it imports nothing of
the server.
"""
