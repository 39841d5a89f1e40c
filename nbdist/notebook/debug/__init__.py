"""Looking inside a run from the notebook: a post-mortem on the rank that failed (``postmortem``:
``%nbdist debug``, ``nbdist.post_mortem``). Imports the cluster (to reach engines through
``cluster.fanout`` and ``worker.api``) and the floor; the run and the magics import it.
"""
