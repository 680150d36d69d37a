"""The event log: what the registry saw, as NDJSON files a pipeline reads.

Owns the record format, the reader, the files (naming, rotation, retention), the writer and its
queue, and the per-connection rollups. May import `capture.events`, the identity basis
(`exporter.census.basis`) and the standard library; the pipeline imports its reader
(tests/test_layers.py).
"""
