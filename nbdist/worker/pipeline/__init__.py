"""Pipeline parallel: ``stages`` (``nbdist.pipeline``: stages on ranks, a schedule, replicas),
``split`` (how a model is cut), ``groups`` (the replicas' process groups). On
``torch.distributed.pipelining``. Imports the engine's top modules and the floor.
"""
