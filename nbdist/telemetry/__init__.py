"""Telemetry: the schema engines and the notebook share (``events``) and the run store (``store``).

Imports nothing heavy: the sidebar's server extension reads the store through
``nbdist.telemetry.store.RunStore`` without loading torch or ipyparallel.
"""
