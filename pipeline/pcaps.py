"""`pcap-decode`: pcap archives -> event logs, decoded by `capture` inside the Spark executors.

Owns listing the inputs (files, directories searched recursively for `*.pcap`, `*.pcapng`,
`*.cap`, each optionally `.gz`; any Hadoop URI, globs too), one decode per file
(`capture.replay.replay` into `exporter.eventlog.format.encode`, the exporter's own record format,
schema 3: request traffic rolled up per connection by `exporter.eventlog.rollup.Roller`, one part
per UTC day of packet time, each standing on its own),
the quarantine of files that could not be read whole, and the per-file summary. Imports
pyspark, `capture` (replay, listeners, the CaptureError family), `exporter.eventlog` (format, rollup),
`pipeline.errors` and `pipeline.files`; never `pipeline.cli`, which alone imports it.

Output under OUT:
- `events/source=<name>/day=<YYYY-MM-DD>/part-*.txt`: one NDJSON record per line, what
  `pipeline.events` reads (it takes the source from the `source=` directory, the day from
  `day=`). Each record goes to the part of its UTC day of packet time (its `ts`). Each day's
  part but the capture's first starts with a `ConnectionState` record (ts: the day's 00:00:00
  UTC) per connection open at that moment, as the exporter starts each file (schema 3,
  exporter/eventlog/format.py; the same table, `exporter.eventlog.rollup.OpenConnections`, at
  most 100,000 connections per file, the oldest forgotten past it), so a window of days reads
  every connection open in it, with its identity, from that window's parts alone. The table
  notes every event of the capture, before `--since`: the window's first day restates the
  connections opened before it. A day without a packet between two with packets is restated
  too (for a gap of at most `MAX_RESTATED_GAP_DAYS` days: a clock jump does not write years of
  days). `<name>` is the file's path below the
  input directory it was found in (the file name for a file given directly), reduced to
  `[A-Za-z0-9._+@,-]` (others become `_`; a clash gets `~2`, `~3`...), so that no layer
  (Spark's partition escaping, URI encoding) changes it on the way back. Within a source the
  lines are in capture order. Each file's last line is its `CaptureStats` (conn_id = the
  source name), the last line of the source's last day, written whatever `--since/--until`
  say; the other events are kept when since <= ts < until.
- `quarantine/`: JSON lines `{"file", "reason"}`, one per problem: unreadable (not a pcap,
  unknown link type), truncated (its readable events are still in `events/`), gzip damaged,
  events that could not be encoded, too large for the binaryFiles path, or an unexpected
  decoder failure (kept with the events decoded before it). A run never stops on one file.
- `pcap_decode_summary.json`: per file: file, source, bytes, packets, events, restated
  (ConnectionState lines), days (parts written), connections, truncated, error, encode_errors,
  seconds.

Reading: `file:` paths are opened in place by the task (one task per file: no copy, no size
limit). Other URIs go through `SparkContext.binaryFiles`, which hands each task the whole file
as bytes (the JVM holds it as one array): files above `KAFKA_CENSUS_MAX_PCAP_BYTES` (default
1 GiB) are quarantined with a hint to split them (`editcap -c`) instead of failing the job;
small files may share a task (Spark packs them into splits of at least
`spark.files.openCostInBytes`, 4 MiB). `.gz` files are unpacked into a temporary file in the
executor's `SPARK_LOCAL_DIRS`. Memory per task is bounded either way: the decoder runs on a
thread that hands encoded lines over in batches through a bounded queue (`_QUEUE_BATCHES` x
`_BATCH_LINES` lines), so a large pcap streams into Spark's sort (which spills to disk)
instead of being held as a Python list; the table of open connections is bounded as said above.
That sort, by (source, day, line number), is the only one in the write plan (the writer's own
by `source`, `day` is satisfied by it), which keeps the order within each part.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import queue
import re
import shutil
import tempfile
import threading
import time

from pyspark.accumulators import AccumulatorParam
from pyspark.sql import types as T

from pipeline.errors import InputError, UsageError
from pipeline.files import write_file

PCAP_SUFFIXES = (".pcap", ".pcapng", ".cap")
GZ = ".gz"
DEFAULT_MAX_PCAP_BYTES = 1 << 30
_SOURCE_UNSAFE = re.compile(r"[^A-Za-z0-9._+@,-]")
MAX_SOURCE_CHARS = 200  # a partition directory name must stay below the usual 255-byte limit
_BATCH_LINES = 2000
_QUEUE_BATCHES = 8
_HADOOP_GLOB = re.compile(r"([\\*?\[\]{}])")
DAY = 86400.0  # a UTC day of packet time (Unix time has no leap seconds)
MAX_RESTATED_GAP_DAYS = 31  # days without a packet restated between two with packets

EVENT_ROW = T.StructType([T.StructField("source", T.StringType()), T.StructField("day", T.StringType()),
                          T.StructField("seq", T.LongType()), T.StructField("value", T.StringType())])
QUARANTINE_ROW = T.StructType([T.StructField("file", T.StringType()), T.StructField("reason", T.StringType())])


@dataclasses.dataclass(frozen=True, slots=True)
class PcapInput:
    uri: str  # as Hadoop names it, e.g. file:/data/a.pcap or s3a://bucket/a.pcap
    local_path: str | None  # set for file: URIs: the task opens it in place
    size: int
    source: str


def max_pcap_bytes() -> int:
    return int(os.environ.get("KAFKA_CENSUS_MAX_PCAP_BYTES", DEFAULT_MAX_PCAP_BYTES))


# ---------------------------------------------------------------------------------------------
# Driver: listing


def _is_pcap_name(name: str) -> bool:
    low = name.lower()
    if low.endswith(GZ):
        low = low[: -len(GZ)]
    return low.endswith(PCAP_SUFFIXES) and not name.startswith((".", "_"))


def source_name(relative: str) -> str:
    """A file's path below its input directory -> the `source` value (see the module docstring)."""
    name = _SOURCE_UNSAFE.sub("_", relative.strip("/")) or "pcap"
    if len(name) > MAX_SOURCE_CHARS:  # keep the end: it holds the file name
        name = name[-MAX_SOURCE_CHARS:]
    return name


def _unique_sources(found: list[tuple[str, str | None, int, str]]) -> list[PcapInput]:
    taken: set[str] = set()
    out = []
    for uri, local, size, rel in found:
        base = source_name(rel)
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}~{n}"
        taken.add(name)
        out.append(PcapInput(uri, local, size, name))
    return out


def list_pcaps(spark, inputs: list[str]) -> tuple[list[PcapInput], int, list[str]]:
    """(pcap files, files skipped in directories for their name, inputs that matched nothing).

    Each input is a file (taken whatever its name), a directory (searched recursively for pcap
    names; hidden `.x`/`_x` files skipped) or a Hadoop glob, on any file system Spark reaches."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    hpath = jvm.org.apache.hadoop.fs.Path
    found: list[tuple[str, str | None, int, str]] = []
    seen: set[str] = set()
    skipped = 0
    missing = []

    def add(status, rel: str) -> None:
        path = status.getPath()
        uri = path.toString()
        if uri in seen:
            return
        seen.add(uri)
        local = path.toUri().getPath() if path.toUri().getScheme() == "file" else None
        found.append((uri, local, status.getLen(), rel))

    for arg in inputs:
        path = hpath(arg)
        fs = path.getFileSystem(conf)
        path = fs.makeQualified(path)
        statuses = fs.globStatus(path)
        if not statuses and fs.exists(path):  # a name with glob characters, meant literally
            statuses = [fs.getFileStatus(path)]
        if not statuses:
            missing.append(arg)
            continue
        for status in statuses:
            if not status.isDirectory():
                add(status, status.getPath().getName())
                continue
            root = status.getPath().toString().rstrip("/") + "/"
            files = fs.listFiles(status.getPath(), True)
            while files.hasNext():
                f = files.next()
                if _is_pcap_name(f.getPath().getName()):
                    add(f, f.getPath().toString()[len(root):])
                else:
                    skipped += 1
    return _unique_sources(found), skipped, missing


def _hadoop_pattern(uri: str) -> str:
    """A path as `binaryFiles` takes it: glob characters escaped. Hadoop splits its input list
    at commas before any escaping applies, so a comma becomes `?` (one any character); what
    else that matches is dropped by the task by its exact URI."""
    return _HADOOP_GLOB.sub(r"\\\1", uri).replace(",", "?")


# ---------------------------------------------------------------------------------------------
# Executors: one file


class _Merge(AccumulatorParam):
    """Per-file summaries keyed by URI: a retried task overwrites its own entry, never doubles it."""

    def zero(self, value):
        return {}

    def addInPlace(self, a, b):
        a.update(b)
        return a


def _scratch_dir() -> str | None:
    local = os.environ.get("SPARK_LOCAL_DIRS")  # set by Spark for Python workers
    return local.split(",")[0] if local else None


def _gunzip(src, dst) -> str | None:
    """Copy a gzip stream into `dst`; a damaged stream keeps what decompressed and says why."""
    try:
        with gzip.open(src, "rb") as z:
            shutil.copyfileobj(z, dst, 1 << 20)
        return None
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        return f"gzip stream damaged, decoded what came before ({exc})"


class _Abandoned(Exception):
    """The consumer of the lines went away (the task was killed): stop decoding."""


class _Decoded:
    """The running decode of one local pcap: lines (seq, day, text) are pulled with `lines()`,
    the counts are read afterwards."""

    def __init__(self, path: str, listeners, since, until, source: str) -> None:
        self.path = path
        self.listeners = listeners
        self.since = float("-inf") if since is None else since
        self.until = float("inf") if until is None else until
        self.source = source
        self.result = None
        self.error: str | None = None
        self.events = 0
        self.restated = 0  # ConnectionState lines
        self.days: set[str] = set()
        self.encode_errors = 0
        self._queue: queue.Queue = queue.Queue(maxsize=_QUEUE_BATCHES)
        self._stop = threading.Event()

    def _put(self, item) -> None:
        while True:
            if self._stop.is_set():
                raise _Abandoned
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        """The decoder thread. Whatever happens, the last item it queues is None."""
        batch: list[tuple[str, str]] = []
        try:
            self._replay(batch)
        except _Abandoned:
            return
        except BaseException as exc:  # a decoder bug must not take the other files down, nor hang
            self.error = f"decoder failed ({type(exc).__name__}: {exc}); events before the failure are kept"
        try:
            if batch:
                self._put(list(batch))
            self._put(None)
        except _Abandoned:
            pass

    def _replay(self, batch: list[tuple[str, str]]) -> None:
        from capture.replay import replay
        from capture.sources import CaptureError
        from exporter.eventlog.format import encode, encode_record, rollup_lines
        from exporter.eventlog.rollup import STATE_READS, OpenConnections, Roller

        since, until = self.since, self.until
        # Schema 3, as the exporter writes: request traffic rolled up per connection, at its
        # close and every DEFAULT_INTERVAL seconds of packet time (exporter/eventlog/rollup.py),
        # and each day's part starting with the connections open then (`table`, noted with
        # every event of the capture, the window's or not).
        roller = Roller()
        table = OpenConnections()
        names: dict[int, str] = {}
        current: list[int | None] = [None]  # the latest day written to (days since the epoch)

        def put(day: int, line: str) -> None:
            name = names.get(day)
            if name is None:
                name = names[day] = time.strftime("%Y-%m-%d", time.gmtime(day * DAY))
                self.days.add(name)
            batch.append((name, line))
            if len(batch) >= _BATCH_LINES:
                self._put(list(batch))
                batch.clear()

        def enter(day: int) -> None:
            """Before the first line of a later day: the day's restatements (and those of the
            days without a packet since the last one written)."""
            last = current[0]
            if last is not None and day <= last:
                return
            current[0] = day
            first = day if last is None else max(last + 1, day - MAX_RESTATED_GAP_DAYS)
            for d in range(first, day + 1):
                for rec in table.records(d * DAY):
                    try:
                        line = encode_record(rec)
                    except (TypeError, ValueError):
                        self.encode_errors += 1
                        continue
                    self.restated += 1
                    put(d, line[:-1].decode("utf-8"))

        def out(ts: float, line: bytes) -> None:
            day = math.floor(ts / DAY)  # finite: `line` was encoded (no NaN, no infinity)
            enter(day)
            put(day, line[:-1].decode("utf-8"))

        def write(items) -> None:
            for item in items:
                try:
                    if type(item) is tuple:
                        acc = item[1]
                        lines = rollup_lines(*item)
                        times = ([acc.ts] if acc.counted() else []) + ([acc.traffic.ts] if acc.traffic else [])
                    else:
                        lines, times = [encode(item)], [item.ts]
                except (TypeError, ValueError):
                    self.encode_errors += 1
                    continue
                for ts, line in zip(times, lines, strict=True):
                    out(ts, line)

        def emit(event) -> None:
            if since <= event.ts < until:
                write(roller.feed(event))
            if type(event) in STATE_READS:  # after its own lines: a restatement is of what came before
                table.note(event)

        try:
            self.result = replay(self.path, self.listeners, emit, topics=True)  # as a serving census does by default
        except CaptureError as exc:
            self.error = str(exc)
            return
        finally:
            write(roller.finish())  # a cut file's open connections keep their counts too
        stats = dataclasses.replace(self.result.stats, conn_id=self.source)
        line = encode(stats)
        # The last line of the source's last day (or of its own day if nothing else was written).
        put(math.floor(stats.ts / DAY) if current[0] is None else current[0], line[:-1].decode("utf-8"))

    def lines(self):
        thread = threading.Thread(target=self._run, name=f"decode {self.source}", daemon=True)
        thread.start()
        seq = 0
        try:
            while True:
                batch = self._queue.get()
                if batch is None:
                    break
                for day, line in batch:
                    yield seq, day, line
                    seq += 1
        finally:
            self._stop.set()  # the consumer left early: let the decoder thread end
            thread.join()
        # Neither the restatements nor the CaptureStats line are events.
        self.events = seq - self.restated - (1 if self.result is not None else 0)


def _decode(item: PcapInput, data: bytes | None, listener_specs, since, until, summaries):
    """Rows (source, seq, line) of one file; its summary goes to the `summaries` accumulator."""
    from capture.listeners import ListenerMap

    started = time.perf_counter()
    summary = {"file": item.uri, "source": item.source, "bytes": item.size, "packets": 0, "events": 0,
               "restated": 0, "days": 0, "connections": 0, "truncated": None, "error": None, "encode_errors": 0,
               "gzip": None}
    tmp = None
    try:
        path = item.local_path
        if data is not None or item.uri.lower().endswith(GZ):
            tmp = tempfile.NamedTemporaryFile(prefix="kafka-census-", suffix=".pcap", dir=_scratch_dir(),
                                              delete=False)
            with tmp:
                if item.uri.lower().endswith(GZ):
                    import io

                    summary["gzip"] = _gunzip(io.BytesIO(data) if data is not None else item.local_path, tmp)
                else:
                    tmp.write(data)
            path = tmp.name
        decoded = _Decoded(path, ListenerMap.parse(listener_specs), since, until, item.source)
        for seq, day, line in decoded.lines():
            yield item.source, day, seq, line
        result = decoded.result

        def named(msg):  # the operator knows the file by its URI, not by our temporary copy
            return msg.replace(path, item.uri) if msg else msg

        summary["events"] = decoded.events
        summary["restated"] = decoded.restated
        summary["days"] = len(decoded.days)
        summary["encode_errors"] = decoded.encode_errors
        summary["error"] = named(decoded.error)
        if result is not None:
            summary["packets"] = result.packets
            summary["connections"] = result.stats.flows_opened
            summary["truncated"] = named(result.truncated)
    finally:
        if tmp is not None:
            os.unlink(tmp.name)
        summary["seconds"] = round(time.perf_counter() - started, 3)
        summaries.add({item.uri: summary})


def _decode_in_place(items, listener_specs, since, until, summaries):
    for item in items:
        yield from _decode(item, None, listener_specs, since, until, summaries)


def _decode_bytes(records, by_uri, listener_specs, since, until, summaries):
    for uri, data in records:
        item = by_uri.get(uri)
        if item is None:  # matched only because a comma in a name became `?`
            continue
        yield from _decode(item, data, listener_specs, since, until, summaries)


# ---------------------------------------------------------------------------------------------
# Driver: the job


def quarantine_rows(summary: dict) -> list[tuple[str, str]]:
    """What was wrong with one file, one row per problem (none for a clean file)."""
    f = summary["file"]
    rows = []
    if summary.get("error"):
        rows.append((f, summary["error"]))
    if summary.get("truncated"):
        rows.append((f, f"truncated: {summary['truncated']}; the {summary['events']} events before the damage "
                        "are in events/"))
    if summary.get("gzip"):
        rows.append((f, summary["gzip"]))
    if summary.get("encode_errors"):
        rows.append((f, f"{summary['encode_errors']} events could not be encoded as JSON (NaN or infinity) "
                        "and are not in events/"))
    return rows


def decode_pcaps(spark, pcaps: list[PcapInput], events_dir: str, listener_specs, since, until, *,
                 in_place: bool = True, max_bytes: int | None = None) -> list[dict]:
    """Decode `pcaps` into `events_dir` (overwritten); returns one summary per file, in order.

    `in_place=False` sends `file:` inputs through binaryFiles too (what other URIs take)."""
    limit = max_pcap_bytes() if max_bytes is None else max_bytes
    local = [p for p in pcaps if in_place and p.local_path is not None]
    rest = [p for p in pcaps if not (in_place and p.local_path is not None)]
    remote = [p for p in rest if p.size <= limit]
    sc = spark.sparkContext
    summaries = sc.accumulator({}, _Merge())
    parts = []
    if local:
        parts.append(sc.parallelize(local, len(local)).mapPartitions(
            lambda items: _decode_in_place(items, listener_specs, since, until, summaries)))
    if remote:
        by_uri = {p.uri: p for p in remote}
        records = sc.binaryFiles(",".join(_hadoop_pattern(p.uri) for p in remote), minPartitions=len(remote))
        parts.append(records.mapPartitions(
            lambda recs: _decode_bytes(recs, by_uri, listener_specs, since, until, summaries)))
    rows = (parts[0] if len(parts) == 1 else sc.union(parts)) if parts else sc.emptyRDD()
    # Sorted by (source, day, seq) within each task: the writer's own sort by (source, day) is then
    # already satisfied, so each part's lines keep their capture order even when a sort spills.
    (spark.createDataFrame(rows, EVENT_ROW).sortWithinPartitions("source", "day", "seq")
     .select("source", "day", "value")
     .write.mode("overwrite").partitionBy("source", "day").text(events_dir))
    _stable_names(spark, events_dir)

    done = summaries.value
    per_file = []
    for p in pcaps:
        s = done.get(p.uri)
        if s is None:
            reason = (f"{p.size} bytes, above the {limit} byte limit for files read through binaryFiles "
                      "(KAFKA_CENSUS_MAX_PCAP_BYTES); split it, e.g. editcap -c 1000000"
                      if p in rest and p.size > limit else "no result from its decode task (a bug: please report it)")
            s = {"file": p.uri, "source": p.source, "bytes": p.size, "packets": 0, "events": 0, "restated": 0,
                 "days": 0, "connections": 0,
                 "truncated": None, "error": reason, "encode_errors": 0, "gzip": None, "seconds": 0.0}
        per_file.append(s)
    return per_file


def _stable_names(spark, events_dir: str) -> None:
    """Spark names each part after its write (`part-00000-<uuid>.c000.txt`); renamed
    `part-00000.txt`, `part-00001.txt`... in that order within its source=/day= directory, a
    part of a re-decoded archive keeps its name, so an incremental `pipeline ingest` re-reads it
    in place of the old one (by name and size) instead of adding its rows a second time."""
    jvm = spark._jvm
    root = jvm.org.apache.hadoop.fs.Path(events_dir)
    fs = root.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(root):
        return
    by_dir: dict[str, list] = {}
    found = fs.listFiles(root, True)
    while found.hasNext():
        path = found.next().getPath()
        if path.getName().startswith("part-") and path.getName().endswith(".txt"):
            by_dir.setdefault(path.getParent().toString(), []).append(path)
    for paths in by_dir.values():
        for i, path in enumerate(sorted(paths, key=lambda p: p.getName())):
            target = jvm.org.apache.hadoop.fs.Path(path.getParent(), f"part-{i:05d}.txt")
            if path.getName() != target.getName() and not fs.rename(path, target):
                raise OSError(f"cannot rename {path} to {target}")


def run_pcap_decode(spark, args, progress) -> dict:
    from capture.listeners import ListenerMap

    started = time.perf_counter()
    out = args.output.rstrip("/")
    try:
        ListenerMap.parse(args.listener)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    listener_specs = list(args.listener) if args.listener else None

    pcaps, skipped, missing = list_pcaps(spark, args.input)
    if missing:
        raise InputError(f"input not found: {', '.join(missing)}")
    if not pcaps:
        raise InputError(f"no pcap files ({', '.join('*' + s for s in PCAP_SUFFIXES)}, optionally .gz) under "
                         f"{', '.join(args.input)}")
    n_local = sum(p.local_path is not None for p in pcaps)
    progress(f"pcap-decode: {len(pcaps)} pcap files, {sum(p.size for p in pcaps) / 2**20:.1f} MiB"
             + (f" ({skipped} other files in the input directories skipped for their names)" if skipped else "")
             + f" ({time.perf_counter() - started:.1f} s)")
    progress(f"decoding {len(pcaps)} files ({n_local} read in place, {len(pcaps) - n_local} through binaryFiles) ...")
    per_file = decode_pcaps(spark, pcaps, f"{out}/events", listener_specs, args.since, args.until)

    quarantine = [row for s in per_file for row in quarantine_rows(s)]
    spark.createDataFrame(quarantine, QUARANTINE_ROW).coalesce(1).write.mode("overwrite").json(f"{out}/quarantine")
    write_file(spark, f"{out}/pcap_decode_summary.json", json.dumps({"files": per_file}, indent=1) + "\n")

    n_events = sum(s["events"] for s in per_file)
    bad_files = sorted({f for f, _ in quarantine})
    unreadable = [s for s in per_file if s["error"] and not s["events"]]
    truncated = [s for s in per_file if s["truncated"]]
    progress(f"decoded {len(per_file)} files: {sum(s['packets'] for s in per_file)} packets, "
             f"{sum(s['connections'] for s in per_file)} connections, {n_events} events -> {out}/events/ "
             f"({time.perf_counter() - started:.1f} s)")
    if bad_files:
        progress(f"{len(bad_files)} files quarantined ({len(unreadable)} unreadable, {len(truncated)} truncated): "
                 f"reasons in {out}/quarantine/")
    progress(f"per-file counts: {out}/pcap_decode_summary.json")
    if len(unreadable) == len(per_file):
        raise InputError(f"none of the {len(per_file)} pcap files could be read; reasons in {out}/quarantine/")
    return {"job": "pcap-decode", "files": len(per_file), "events": n_events, "quarantined_files": len(bad_files),
            "truncated_files": len(truncated), "unreadable_files": len(unreadable), "output": out}
