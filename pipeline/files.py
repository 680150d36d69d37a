"""The jobs' shared file I/O: event logs in, one small file out.

Owns `load_input` (the event logs of `--input` within `--since/--until` read once into their
facts, bad lines written to `OUT/quarantine/`, input that is nothing but another schema version
an `InputError`) and `write_file` (one small file written by the driver: the report's HTML, the
pcap-decode summary). The table jobs (`pipeline.cli`) and the report read their input through
`load_input`; `pipeline.pcaps` and `pipeline.report` write through `write_file`. Imports pyspark
(through `pipeline.events`) and `pipeline.errors`; never `pipeline.cli` or a job module, so the
jobs and the CLI depend on it and not on each other.
"""

from __future__ import annotations

import os
import time

from pipeline.errors import InputError


def load_input(spark, args, out: str, progress, when_empty: str):
    """The event logs of `args.input` within `--since/--until`, read once into their facts
    (pipeline.events.facts, cached): (facts, events, quarantined lines, (first ts, last ts)).
    Bad lines go to `out/quarantine/`; input that is nothing but another schema version is an
    InputError."""
    from pipeline import events as ev

    started = time.perf_counter()
    limit = args.max_quarantined_lines
    facts = ev.facts(ev.read(spark, args.input, args.since, args.until, progress), limit).cache()
    n_events, n_bad, first, last = ev.counts(facts)
    progress(f"read {n_events} events, {n_bad} lines quarantined ({time.perf_counter() - started:.1f} s)")
    if n_bad > limit:
        progress(f"warning: {n_bad} bad lines; the text of at most {limit} kept in quarantine/ "
                 "(--max-quarantined-lines), the rest counted per file and reason")
    if n_bad:
        quarantine = ev.quarantine(facts)
        quarantine.coalesce(1).write.mode("overwrite").json(f"{out}/quarantine")
        progress(f"quarantined lines and their reasons: {out}/quarantine/")
        if n_events == 0:
            mismatch = ev.schema_mismatch(quarantine)
            if mismatch:
                raise InputError(mismatch)
    if n_events == 0:
        progress(f"warning: no events in the input; {when_empty}")
    return facts, n_events, n_bad, (first, last)


def write_file(spark, uri: str, text: str) -> None:
    """One small file written by the driver: with Python on the local file system (no Hadoop
    `.crc` file beside it), else through the Hadoop file system of `uri`."""
    path = spark._jvm.org.apache.hadoop.fs.Path(uri)
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    if fs.getUri().getScheme() == "file":
        local = fs.makeQualified(path).toUri().getPath()
        os.makedirs(os.path.dirname(local), exist_ok=True)
        with open(local, "w", encoding="utf-8") as f:
            f.write(text)
        return
    out = fs.create(path, True)
    try:
        out.write(bytearray(text.encode("utf-8")))
    finally:
        out.close()
