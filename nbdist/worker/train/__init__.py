"""Training on the ranks: ``prepare`` wraps a model (DDP, FSDP, precision, compression,
accumulation) and ``sync`` keeps ranks in step when they do not all-reduce every step (local SGD,
DiLoCo). Imports the engine's top modules (state, context, reporting) and the floor.
"""
