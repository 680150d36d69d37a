"""`kafka-census pipeline ingest`: event logs parsed once into a Parquet table the jobs query.

Owns the job: the listing of the input, the run manifest (`is_table`, the incremental skip), the
windows, `ingest` / `run_ingest`, the Spark task launch, and a task's loop over one file
(`ingest_file`: its blocks of whole lines, the overlong lines, its summary). The table itself
(its one schema, the mapping of the event log's fields onto its columns, the parsing and checks
of a block or a line) is `pipeline.table`'s; the writing of the Parquet parts and the
quarantine, the layout of both and the file systems are `pipeline.parts`'. Imports pyarrow,
pyspark (through `pipeline.events`: the input listing, `source_of`, `in_window`),
`pipeline.table`, `pipeline.parts`, `exporter.eventlog.format` (the readable schema versions),
and `pipeline.errors`; never `pipeline.cli` or `pipeline.files`, which import it, and neither
`pipeline.table` nor `pipeline.parts` imports it.

Work: the driver lists the input files (Spark's listing: any Hadoop URI), drops those already
ingested, and runs one Spark *Python* task per file (small files packed a few per task). A task
reads its file in blocks of `BLOCK_BYTES` (whole lines) and hands each to `pipeline.table`,
which parses it with pyarrow's C++ JSON reader, checks it, maps it onto the table's columns and
writes Parquet row groups as it goes (or re-reads it line by line, quarantining exactly its bad
lines): the JVM does no per-row work, and a task's memory is a few blocks whatever the file's
size. A line longer than `MAX_LINE_BYTES` is quarantined unread.

Layout under TABLE: the parts `day=YYYY-MM-DD/source=<source>/part-<file-id>.parquet` and the
quarantine `_quarantine/<file-id>.json` (`pipeline.parts`), and
- `_ingested/<run-id>.json`: the run's window and, per file ingested: uri, size, modified, rows,
  events, lines, bad_lines, file_id, source, days (of its parts).

Incremental: without --since/--until, a file a previous whole run (no window) ingested with the
same uri and size is skipped; one whose size changed is re-read and its previous parts deleted.
With --since/--until (whole UTC days), the window's files (`pipeline.events.in_window`) are read
whatever the manifest says, the window's `day=D/source=S` directories of the sources the input
holds (any of its files, in the window or not) deleted first, and only rows with ts in [since,
until) written: a rerun of a day replaces that day of those sources and nothing else (a rerun
over one sidecar's logs leaves the other sidecars' days). Two runs must not write one table at
the same time.

Reading in the tasks and writing the table: any URI pyarrow.fs opens (`pipeline.parts._fs`).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import uuid
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from exporter.eventlog.format import READABLE_SCHEMAS
from pipeline.errors import MAX_QUARANTINED_LINES, InputError, UsageError
from pipeline.parts import _Bad, _fs, _join, _Parts, _split_days, _write_quarantine, _write_whole
from pipeline.table import (
    _STR,
    COMPRESSION,
    TABLE_SCHEMA,
    _arrow_rows,
    _read_block,
    _used_types,
    check_line,
    day_of,
    partition_value,
    record_rows,
    spark_schema,
)

# Lines parsed at once: 2, 4, 8 MiB gave 420k, 445k, 430k lines per CPU second and a task's peak
# RSS 148, 198, 234 MiB (bench.pipeline's 58 MiB files, python with pyarrow: 87 MiB).
BLOCK_BYTES = 4 << 20
MAX_LINE_BYTES = 16 << 20  # a longer "line" is quarantined unread (no newline: not an event log)
PART_PACK_BYTES = 64 << 20  # small files share a task up to this many bytes


def file_id(uri: str) -> str:
    return hashlib.sha1(uri.encode("utf-8")).hexdigest()[:16]


# --- is it a table -----------------------------------------------------------------------------

def _qualified(spark, path: str) -> str:
    """`path` as Hadoop qualifies it (a bare path on the default file system)."""
    hpath = spark._jvm.org.apache.hadoop.fs.Path(path)
    return hpath.getFileSystem(spark._jsc.hadoopConfiguration()).makeQualified(hpath).toString()


def is_table(spark, path: str) -> bool:
    """Whether `path` is an ingested table: a directory with `_ingested/`."""
    try:
        fs, local = _fs(_qualified(spark, path))
        return fs.get_file_info(_join(local, "_ingested")).type == pafs.FileType.Directory
    except (OSError, ValueError):
        return False


# --- one file, in a task -----------------------------------------------------------------------

def _blocks(stream, block_bytes: int, bad: _Bad):
    """Whole lines of `stream` in blocks of about `block_bytes`; a line longer than
    MAX_LINE_BYTES is quarantined (its start kept) and skipped."""
    carry = b""
    skipping = None  # the start of an overlong line being skipped
    while True:
        chunk = stream.read(block_bytes)
        if not chunk:
            break
        if skipping is not None:
            cut = chunk.find(b"\n")
            if cut < 0:
                continue
            chunk = chunk[cut + 1:]
            bad.add(f"line longer than {MAX_LINE_BYTES} bytes", skipping)
            skipping = None
        cut = chunk.rfind(b"\n")
        if cut < 0:
            carry += chunk
            if len(carry) > MAX_LINE_BYTES:
                skipping, carry = carry[:8192], b""
            continue
        block = carry + chunk[:cut + 1] if carry else chunk[:cut + 1]
        carry = chunk[cut + 1:]
        yield block
    if skipping is not None:
        bad.add(f"line longer than {MAX_LINE_BYTES} bytes", skipping)
    if carry:
        yield carry


def _open(uri: str):
    fs, path = _fs(uri)
    return fs.open_input_stream(path)


def ingest_file(item: dict, table_uri: str, since: float | None, until: float | None, quota: int,
                compression: str = COMPRESSION, block_bytes: int = BLOCK_BYTES) -> dict:
    """Ingest one file (a task's work): its parts and quarantine written; its summary returned
    (item's uri, size, modified, file_id, source, plus lines, events, rows, bad_lines, bad
    (per reason), days, blocks_line_by_line, seconds, cpu_seconds, worker_peak_rss_mib)."""
    started, cpu = time.perf_counter(), time.process_time()
    uri, fid = item["uri"], item["file_id"]
    used = _used_types()
    used_arrow = pa.array(sorted(used), _STR)
    bad = _Bad(uri, quota)
    parts = _Parts(table_uri, item["source"], fid, compression)
    lines = events = slow = 0
    lo = -math.inf if since is None else since
    hi = math.inf if until is None else until
    try:
        with _open(uri) as stream:
            for block in _blocks(stream, block_bytes, bad):
                t = _read_block(block)
                if t is not None:
                    lines += len(t)
                    keep = pc.is_in(t["type"], value_set=used_arrow)
                    if since is not None or until is not None:
                        keep = pc.and_(keep, pc.and_(pc.greater_equal(t["ts"], lo), pc.less(t["ts"], hi)))
                    t = t.filter(keep)
                    events += len(t)
                    rows = _arrow_rows(t, uri) if len(t) else None
                else:
                    slow += 1
                    out: list[dict] = []
                    for line in block.split(b"\n"):  # as the fast path: a bare CR is not a line end
                        rec, why = check_line(line, used)
                        if why is not None:
                            bad.add(why, line)
                        if line.strip():
                            lines += 1
                        if rec is not None and lo <= rec["ts"] < hi:
                            events += 1
                            out.extend(record_rows(rec, uri))
                    rows = pa.Table.from_pylist(out, schema=TABLE_SCHEMA) if out else None
                if rows is not None:
                    _split_days(rows, parts)
        days = parts.close()
    except BaseException:
        parts.abort()
        raise
    _write_quarantine(table_uri, fid, bad.records())
    return {**item, "lines": lines, "events": events, "rows": sum(parts.rows.values()),
            "bad_lines": sum(bad.counts.values()), "bad": bad.counts, "kept_lines": len(bad.kept),
            "days": days, "blocks_line_by_line": slow, "seconds": round(time.perf_counter() - started, 3),
            "cpu_seconds": round(time.process_time() - cpu, 3), "worker_peak_rss_mib": _peak_rss_mib()}


def _peak_rss_mib() -> float | None:
    """The Python worker's peak resident memory so far (a worker runs many tasks)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _task(items, table_uri, since, until, block_bytes):
    for item, quota in items:
        yield ingest_file(item, table_uri, since, until, quota, block_bytes=block_bytes)


# --- the driver --------------------------------------------------------------------------------

def _whole_day(ts: float | None, flag: str) -> None:
    if ts is not None and ts % 86400 != 0:
        raise UsageError(f"{flag} must be a whole UTC day (e.g. 2026-11-16) for ingest: a rerun replaces whole days")


def _manifest(table_uri: str) -> list[dict]:
    fs, root = _fs(table_uri)
    directory = _join(root, "_ingested")
    if fs.get_file_info(directory).type != pafs.FileType.Directory:
        return []
    runs = []
    for info in fs.get_file_info(pafs.FileSelector(directory)):
        if info.type == pafs.FileType.File and info.base_name.endswith(".json") and info.base_name[0] not in "._":
            with fs.open_input_stream(info.path) as f:
                runs.append(json.loads(f.read()))
    return sorted(runs, key=lambda r: r.get("run", ""))


def _stat(files: list[str]) -> list[tuple[int, float]]:
    out = []
    for uri in files:
        fs, path = _fs(uri)
        info = fs.get_file_info(path)
        out.append((info.size or 0, info.mtime.timestamp() if info.mtime else 0.0))
    return out


def _list_inputs(spark, inputs: list[str]) -> list[str]:
    from pipeline.events import _files

    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    missing = []
    for arg in inputs:
        path = jvm.org.apache.hadoop.fs.Path(arg)
        fs = path.getFileSystem(conf)
        if not fs.globStatus(path) and not fs.exists(path):
            missing.append(arg)
    if missing:
        raise InputError(f"input not found: {', '.join(missing)}")
    return _files(spark, inputs)


def _pack(items: list[dict], slots: int) -> list[list[dict]]:
    """Files into tasks: one per file, small files together up to PART_PACK_BYTES (largest
    first, each to the lightest task), at least `slots` tasks when there are enough files."""
    n = min(len(items), max(slots, math.ceil(sum(i["size"] for i in items) / PART_PACK_BYTES)))
    tasks: list[list[dict]] = [[] for _ in range(n)]
    load = [0] * n
    for item in sorted(items, key=lambda i: -i["size"]):
        k = min(range(n), key=load.__getitem__)
        tasks[k].append(item)
        load[k] += item["size"]
    return [t for t in tasks if t]


def _quotas(n: int, limit: int) -> list[int]:
    return [limit // n + (i < limit % n) for i in range(n)] if n else []


def _delete(table_uri: str, relative: list[str]) -> None:
    fs, root = _fs(table_uri)
    for rel in relative:
        path = _join(root, rel)
        kind = fs.get_file_info(path).type
        if kind == pafs.FileType.Directory:
            fs.delete_dir(path)
        elif kind == pafs.FileType.File:
            fs.delete_file(path)


def _window_parts(table_uri: str, since: float | None, until: float | None, sources: set[str]) -> list[str]:
    """The table's `day=D/source=S` directories of the window's days and the given sources."""
    fs, root = _fs(table_uri)
    if fs.get_file_info(root).type != pafs.FileType.Directory:
        return []
    lo = "" if since is None else day_of(since)
    hi = "9999" if until is None else day_of(until)  # until is a whole day: its own day is out
    days = [info.base_name for info in fs.get_file_info(pafs.FileSelector(root))
            if info.type == pafs.FileType.Directory and info.base_name.startswith("day=")
            and lo <= info.base_name[4:] < hi]
    wanted = {f"source={partition_value(s)}" for s in sources}
    return sorted(f"{day}/{info.base_name}" for day in days
                  for info in fs.get_file_info(pafs.FileSelector(_join(root, day)))
                  if info.type == pafs.FileType.Directory and info.base_name in wanted)


def ingest(spark, inputs: list[str], table: str, since: float | None = None, until: float | None = None,
           max_quarantined_lines: int = MAX_QUARANTINED_LINES, progress=None, *,
           block_bytes: int = BLOCK_BYTES) -> dict:
    """Ingest the event logs under `inputs` into `table` (see the module docstring); the run's
    summary: job, files, skipped_files, events, rows, quarantined_lines, output. UsageError for a
    window that is not whole UTC days, InputError for a missing input or input without an event
    whose lines were refused for their schema version. `block_bytes`: the lines parsed at once (tests make it small)."""
    from pipeline.events import in_window, source_of

    def say(msg: str) -> None:
        if progress is not None:
            progress(msg)

    started = time.perf_counter()
    _whole_day(since, "--since")
    _whole_day(until, "--until")
    windowed = since is not None or until is not None
    table_uri = _qualified(spark, table)
    listed = _list_inputs(spark, inputs)
    files = in_window(listed, since, until)
    runs = _manifest(table_uri)
    whole = {(f["uri"], f["size"]): f for run in runs if run.get("since") is None and run.get("until") is None
             for f in run["files"]}
    previous: dict[str, set[tuple[str, str]]] = {}  # uri -> (day, part) of every run that read it
    for run in runs:
        for f in run["files"]:
            part = f"source={partition_value(f['source'])}/part-{f['file_id']}.parquet"
            previous.setdefault(f["uri"], set()).update((d, part) for d in f.get("days", ()))
    todo: list[dict] = []
    skipped = 0
    for uri, (size, modified) in zip(files, _stat(files)):
        if not windowed and (uri, size) in whole:
            skipped += 1
            continue
        todo.append({"uri": uri, "size": size, "modified": modified, "file_id": file_id(uri),
                     "source": source_of(uri)})
    say(f"ingest: {len(listed)} files listed, {len(todo)} to read"
        + (f" ({len(listed) - len(files)} outside --since/--until by their names)" if windowed else "")
        + (f", {skipped} already ingested" if skipped else "")
        + f", {sum(i['size'] for i in todo) / 2**20:.1f} MiB ({time.perf_counter() - started:.1f} s)")
    if windowed:  # the window's days of the input's sources are replaced (other sources' stay)
        parts = _window_parts(table_uri, since, until, {source_of(f) for f in listed})
        _delete(table_uri, parts)
        if parts:
            days = sorted({p.split("/")[0][4:] for p in parts})
            say(f"ingest: replacing {len(days)} days of the table ({days[0]} .. {days[-1]}) for the input's sources")
    else:  # a file re-read whole: its parts of a previous (different) version go first
        _delete(table_uri, sorted(f"day={d}/{part}" for i in todo for d, part in previous.get(i["uri"], ())))
    results: list[dict] = []
    if todo:
        quotas = dict(zip((i["uri"] for i in todo), _quotas(len(todo), max_quarantined_lines)))
        tasks = [[(i, quotas[i["uri"]]) for i in t] for t in _pack(todo, spark.sparkContext.defaultParallelism)]
        say(f"ingest: parsing {len(todo)} files in {len(tasks)} tasks ...")
        work = lambda parts: _task([x for t in parts for x in t], table_uri, since, until, block_bytes)  # noqa: E731
        results = spark.sparkContext.parallelize(tasks, len(tasks)).mapPartitions(work).collect()
        results.sort(key=lambda r: r["uri"])
    n_events = sum(r["events"] for r in results)
    n_bad = sum(r["bad_lines"] for r in results)
    n_rows = sum(r["rows"] for r in results)
    say(f"ingest: {n_events} events, {n_rows} rows, {n_bad} lines quarantined "
        f"({time.perf_counter() - started:.1f} s)")
    if n_bad:
        if n_bad > max_quarantined_lines:
            say(f"warning: {n_bad} bad lines; the text of at most {max_quarantined_lines} kept "
                "(--max-quarantined-lines), the rest counted per file and reason")
        say(f"quarantined lines and their reasons: {_join(table, '_quarantine')}/")
    if results and n_events == 0:
        mismatch = next((f"{r['uri']}: {reason}" for r in results for reason in r["bad"]
                         if reason.startswith("unknown schema version")), None)
        if mismatch:
            raise InputError(f"{mismatch}; this pipeline reads schema "
                             f"{', '.join(map(str, READABLE_SCHEMAS))} (upgrade kafka-census to read newer logs)")
    if not listed:
        say("warning: no event-log files (*.ndjson, *.txt) in the input")
    if results or not runs:  # an empty input still makes a table; a run that read nothing leaves no trace
        _write_manifest(table_uri, since, until, results)
    return {"job": "ingest", "files": len(results), "skipped_files": skipped, "events": n_events, "rows": n_rows,
            "quarantined_lines": n_bad, "output": table}


def _write_manifest(table_uri: str, since, until, results: list[dict]) -> None:
    now = datetime.now(UTC)
    run = f"{now.strftime('%Y%m%dT%H%M%S')}{now.microsecond:06d}Z-{uuid.uuid4().hex[:8]}"
    keys = ("uri", "size", "modified", "rows", "events", "lines", "bad_lines", "file_id", "source", "days", "seconds",
            "cpu_seconds")
    doc = {"run": run, "finished": now.isoformat(), "since": since, "until": until,
           "files": [{k: r[k] for k in keys} for r in results]}
    fs, root = _fs(table_uri)
    _write_whole(fs, _join(root, "_ingested", f"{run}.json"), (json.dumps(doc, indent=1) + "\n").encode("utf-8"))


def run_ingest(spark, args, progress) -> dict:
    """`kafka-census pipeline ingest`: --input, --output (the table), --since, --until,
    --max-quarantined-lines."""
    return ingest(spark, list(args.input), args.output, args.since, args.until, args.max_quarantined_lines,
                  progress)


__all__ = ["TABLE_SCHEMA", "spark_schema", "is_table", "ingest", "run_ingest", "ingest_file", "file_id",
           "day_of"]
