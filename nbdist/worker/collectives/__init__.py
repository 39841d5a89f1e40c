"""How an engine's collectives travel: the group DDP models on CPU all-reduce through (``group``),
and the all-reduce through shared memory it uses when every rank shares a host
(``shared_memory``)."""
