"""Telemetry: the schema engines, kernel, store and sidebar share, and the run store.

- ``events``: the records (``MetricRecord``, ``HealthSample``, ``EventRecord``, ``Batch``; the
  store's ``WorkerHealth`` and ``RunEvent``) and the names of every stored field.
- ``tables``: the run store's SQLite tables, and records as rows.
- ``store``: ``RunStore``, the SQLite file: writes and JSON-safe reads.
- ``writer``: ``StoreWriter``, a run's writes from a background thread.

Imports nothing heavy: the sidebar's server extension reads the store through
``nbdist.telemetry.store.RunStore`` without loading torch or ipyparallel.
"""
