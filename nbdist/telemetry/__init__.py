"""Telemetry: the schema engines, kernel, store and sidebar share, and the run store.

- ``events``: the records (``MetricRecord``, ``HealthSample``, ``EventRecord``, ``Batch``; the
  store's ``WorkerHealth`` and ``RunEvent``) and the names of every stored field.
- ``tables``: the run store's SQLite tables (the schema, its version, and upgrades).
- ``rows``: records as the rows that go in (checked: ``BadValue``), and rows as they come out.
- ``database``: the store's file: where, owner-only, WAL, a connection per thread, transactions.
- ``store``: ``RunStore``, the run store: writes and JSON-safe reads.
- ``writer``: ``StoreWriter``, a run's writes from a background thread.

Imports nothing heavy: the sidebar's server extension reads the store through
``nbdist.telemetry.store.RunStore`` without loading torch or ipyparallel.
"""
