"""Notebook data to the ranks and back: ``scatter`` (one shard each), ``gather`` (back in the
data set's order), the checks made before a byte is sent, and the pure sharding plan. Imports
``session`` (the current cluster), ``cluster/`` and the floor.
"""
