"""The event log: what the registry saw, as NDJSON files a pipeline reads.

    format.py   the record format: encode and decode, schema versions (what a reader accepts)
    files.py    file names, creating, finishing and recovering files, retention, EventLogError
    reader.py   list_logs and read_events: the finished files of a directory and their records
    writer.py   EventLog (buffering, rotation, counters) and the writer's defaults
    queued.py   QueuedEventLog: an EventLog behind a bounded queue and a writer thread, with rollups
    rollup.py   per-connection rollups of request traffic, and `route`: what a writer does with
                each event (it hands on restate.py's and topics.py's names)
    restate.py  `OpenConnections`: what each new file restates (schema 3)
    topics.py   topic usage in the rollups, the TopicIds pairs written (issue 31)

May import `capture.events`, `capture.kafka.api_table` (reference data), the identity basis
(`exporter.census.basis`) and the standard library (tests/layout/test_layers.py). The pipeline
imports its format (pipeline/events.py, pipeline/pcaps.py) and rollup (pipeline/pcaps.py).
"""
