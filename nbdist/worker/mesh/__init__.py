"""Models bigger than one worker: the cluster as a device mesh (``grid``), tensor-parallel plans
checked and applied (``plans``), and models built on the meta device, each rank materialising
only its own shard (``materialize``)."""
