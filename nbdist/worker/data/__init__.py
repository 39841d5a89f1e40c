"""Data read on the engines, never through the notebook: ``nbdist.loader`` over files (Parquet,
JSON lines, globs) and Hugging Face ``Dataset``s (``blocks``, ``plan``, ``sources``,
``columns``), and over streams that can only be iterated (``iterables``). Every loader keeps its
position (``state_dict``) so ``nbdist.checkpoint(..., loader=dl)`` and ``nbdist.restore(...,
loader=dl)`` continue an epoch exactly where it stood.
"""
