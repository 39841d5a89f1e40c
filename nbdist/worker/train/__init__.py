"""Training on the ranks: ``prepare`` wraps a model (DDP, FSDP, precision, compression,
accumulation), ``step`` is ``train_step``, and ``sync`` keeps ranks in step when they do not
all-reduce every step (local SGD, DiLoCo; ``gossip`` and ``asynchronous`` add their modes), with
``sync_options`` (``sync=``'s options, checked) and ``drift`` (how far the ranks drifted apart,
rank 0's ``sync`` events). Imports the engine's top modules (state, context, reporting) and the
floor.
"""
