"""Data read on the engines, never through the notebook: ``nbdist.loader`` (``loader``, the one
door) over a scattered name or a map-style torch ``Dataset`` (``indexed``), over files (Parquet,
JSON lines, WebDataset tar shards) and Hugging Face ``Dataset``s (``streamed``: ``blocks`` reads
what ``plan`` assigns, from ``sources`` and ``tars``, as ``columns``), and over streams that can
only be iterated (``iterables``, ``splitting``). Every loader keeps its position
(``state_dict``), so ``nbdist.checkpoint(..., loader=dl)`` and ``nbdist.restore(...,
loader=dl)`` continue an epoch exactly where it stood; ``workers`` ends a failed cell's loader
processes.
"""
