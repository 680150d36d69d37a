"""Where the ingested table lives and how a task writes one file's share of it.

Owns the file systems (`_fs`: a URI or a local path -> a pyarrow file system and its path;
`_join`), the writing of one input file's Parquet parts (`_Parts`, one per UTC day, `_split_days`)
and of its quarantine (`_Bad`: its bad lines counted per reason, the text of the first few kept;
`_write_quarantine`), and `_write_whole` (a small file, there whole or not at all: the
quarantine, `pipeline.ingest`'s run manifest). Split from `pipeline.table`, which owns the
table's schema and the parsing of the lines into its rows. Imports pyarrow, `pipeline.table`
(the schema, the partition values) and, lazily, `pipeline.events` (the quarantined line's
length); `pipeline.ingest` imports it; never `pipeline.ingest`, `pipeline.cli` or
`pipeline.files`.

Layout under TABLE (the parts and the quarantine; the run manifest `_ingested/` is
`pipeline.ingest`'s):
- `day=YYYY-MM-DD/source=<source>/part-<file-id>.parquet`: the rows of one input file on one UTC
  day (of the row's ts); `source` is `pipeline.events.source_of` (escaped as Spark escapes a
  partition value: `pipeline.table.partition_value`); file-id the first 16 hex digits of the sha1
  of the file's URI, so re-ingesting a file overwrites its own parts. A part is written beside
  its place under a hidden name and renamed when whole (local and HDFS; an object store's upload
  is whole on close).
- `_quarantine/<file-id>.json`: JSON lines {"file", "reason", "line", "lines"}: a kept bad line
  (`lines` 1), or per reason the count of the lines whose text was not kept (`line` null).

File systems (`_fs`): `file:` paths are opened in place; other URIs through `pyarrow.fs`:
`hdfs://` (libhdfs and the Hadoop CLASSPATH on the executors), `s3://` and `s3a://`
(credentials from the executors' environment or AWS configuration, not Spark's `fs.s3a.*`
settings), `gs://`. The input is read and the table written the same way. Supported: any URI
pyarrow.fs opens.
"""

from __future__ import annotations

import json
import uuid
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.table import _I64, TABLE_SCHEMA, day_of, partition_value

# --- file systems ------------------------------------------------------------------------------

def _fs(uri: str):
    """(pyarrow file system, its path) of a URI or a local path."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return pafs.LocalFileSystem(), unquote(parsed.path) if parsed.scheme else uri
    if parsed.scheme in ("s3a", "s3n"):
        uri = "s3" + uri[len(parsed.scheme):]
    return pafs.FileSystem.from_uri(uri)


def _join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])


# --- one file's parts and quarantine, written in a task ----------------------------------------

class _Bad:
    """A file's bad lines: counted per reason, the text of the first `quota` kept."""

    def __init__(self, uri: str, quota: int) -> None:
        self.uri, self.quota = uri, quota
        self.counts: dict[str, int] = {}
        self.kept: list[dict] = []

    def add(self, reason: str, line: bytes) -> None:
        from pipeline.events import MAX_QUARANTINED_LINE

        self.counts[reason] = self.counts.get(reason, 0) + 1
        if len(self.kept) < self.quota:
            text = line.rstrip(b"\n")[:4 * MAX_QUARANTINED_LINE].decode("utf-8", "replace")
            self.kept.append({"file": self.uri, "reason": reason, "line": text[:MAX_QUARANTINED_LINE], "lines": 1})

    def records(self) -> list[dict]:
        kept: dict[str, int] = {}
        for r in self.kept:
            kept[r["reason"]] = kept.get(r["reason"], 0) + 1
        rest = [{"file": self.uri, "reason": reason, "line": None, "lines": n - kept.get(reason, 0)}
                for reason, n in sorted(self.counts.items()) if n > kept.get(reason, 0)]
        return self.kept + rest


class _Parts:
    """The Parquet parts of one input file, one per day: each block's rows of a day are written
    as a row group at once (measured: buffering them into larger groups held three times the
    memory and gave no smaller files)."""

    def __init__(self, table_uri: str, source: str, fid: str, compression: str) -> None:
        self.fs, self.root = _fs(table_uri)
        self.atomic = isinstance(self.fs, (pafs.LocalFileSystem, pafs.HadoopFileSystem))
        self.source, self.fid, self.compression = partition_value(source), fid, compression
        self.writers: dict[str, tuple[pq.ParquetWriter, pa.NativeFile, str, str]] = {}
        self.rows: dict[str, int] = {}

    def add(self, day: str, rows: pa.Table) -> None:
        if day not in self.writers:
            directory = _join(self.root, f"day={day}", f"source={self.source}")
            self.fs.create_dir(directory, recursive=True)
            final = _join(directory, f"part-{self.fid}.parquet")
            path = _join(directory, f".part-{self.fid}.parquet.{uuid.uuid4().hex[:8]}") if self.atomic else final
            sink = self.fs.open_output_stream(path)
            self.writers[day] = (pq.ParquetWriter(sink, TABLE_SCHEMA, compression=self.compression), sink, path, final)
        self.writers[day][0].write_table(rows, row_group_size=len(rows) + 1)
        self.rows[day] = self.rows.get(day, 0) + len(rows)

    def close(self) -> list[str]:
        for writer, sink, path, final in self.writers.values():
            writer.close()
            sink.close()
            if path != final:
                self.fs.move(path, final)
        return sorted(self.writers)

    def abort(self) -> None:
        for writer, sink, path, _final in self.writers.values():
            try:
                writer.close()
                sink.close()
                # the hidden name, or on an object store (no rename) the final one: closing
                # completed an upload that must not stand as a part
                self.fs.delete_file(path)
            except OSError:
                pass


def _split_days(rows: pa.Table, parts: _Parts) -> None:
    day = pc.cast(pc.floor(pc.divide(rows["ts"], 86400.0)), _I64)
    days = pc.unique(day).to_pylist()
    for d in sorted(days):  # the days present, however far apart
        chunk = rows if len(days) == 1 else rows.filter(pc.equal(day, d))
        parts.add(day_of(d * 86400.0), chunk)


def _write_quarantine(table_uri: str, fid: str, records: list[dict]) -> None:
    fs, root = _fs(table_uri)
    path = _join(root, "_quarantine", f"{fid}.json")
    if not records:
        if fs.get_file_info(path).type == pafs.FileType.File:
            fs.delete_file(path)  # a previous read of this file had bad lines
        return
    _write_whole(fs, path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8"))


def _write_whole(fs, path: str, data: bytes) -> None:
    """A small file, there whole or not at all (a hidden name renamed; an object store's upload
    is whole on close)."""
    directory, name = path.rsplit("/", 1)
    fs.create_dir(directory, recursive=True)
    atomic = isinstance(fs, (pafs.LocalFileSystem, pafs.HadoopFileSystem))
    tmp = f"{directory}/.{name}.{uuid.uuid4().hex[:8]}" if atomic else path
    with fs.open_output_stream(tmp) as out:
        out.write(data)
    if tmp != path:
        fs.move(tmp, path)
