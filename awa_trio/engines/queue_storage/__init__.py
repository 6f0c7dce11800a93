"""Branches of the queue-storage engine (Awa 0.6's default): ring rotation and
prune, rescues, promotion, terminal-count rollup, DLQ cleanup and queue stats.

One module per branch, as under :mod:`awa_trio.engines.canonical`; the registry picks
this set when ``awa.storage_status()`` says queue storage is live.
"""
