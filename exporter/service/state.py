"""The state file behind `capture --state-file`: who the open connections are, kept across
restarts.

Why: after a restart the capture joins every long-lived connection mid-stream, after its
ApiVersions exchange, so without this file each of them would count as "unknown" software until
it reconnects (which a healthy client may not do for days). With it, a connection first seen
mid-stream whose 4-tuple matches a saved one gets the saved identity back (identity_source
"restored"), and its gauge label is the saved software; a later ApiVersions on it wins as usual.

Owns the file format (`FORMAT`, `VERSION`, `encode_state`, `decode_state`), the atomic write
(`write_atomic`: a temporary file in the same directory, fsync, rename, fsync of the
directory, so a crash leaves the old file or the new one, never half of one) and `StateKeeper`,
which the service calls: `restore()` at start, `tick()` every second from the capture thread
(every `interval` seconds it wakes the keeper's writer thread, never waiting for it) and
`close()` at shutdown, after the capture thread has stopped (stops the writer, saves once more).
The writer thread takes the snapshot through `registry.saved_identities()` (the registry holds
its lock only to copy) and encodes, writes and fsyncs outside any lock: at 100k connections
that is about 0.8 s of copying plus 0.8 s of encoding, and the capture thread must not wait for
it. Imports the registry's `SavedIdentity`, the event log's `fsync_dir` and the standard
library; nothing of capture, HTTP or Prometheus.

Format (UTF-8 JSON, one object; times in seconds since the epoch):

    {"format": "kafka-census-state", "version": 1, "written_at": 1763762580.25,
     "connections": [{"client_address": "10.0.0.7", "client_port": 51234,
                      "broker_address": "10.0.0.5", "broker_port": 9092, "listener": "PLAINTEXT",
                      "client_id": "orders", "client_software_name": "apache-kafka-java",
                      "client_software_version": "3.9.0", "identity_version": 4,
                      "principal": "orders-svc", "sasl_mechanism": "SCRAM-SHA-512",
                      "first_seen": 1763700000.5, "last_seen": 1763762579.9, "inferred": null}]}

`inferred` (issue 15): the identity inferred for a connection that announced no software, or
null: {"source": "sibling"|"fingerprint", "name", "version_range", "confidence", "evidence":
[<= 8 strings], "min_compatible", "sibling_connection_id"} (the REST `inferred_software`). It
comes back as identity_source "restored_sibling" / "restored_fingerprint", never in the
software fields: a restart does not turn an inference into an announced identity. A file of an
older writer, without the field, reads as null.

Version policy as in the event log: adding a field keeps the version (readers ignore what
they do not know), renaming, removing or retyping one bumps it. Only open connections with an
identity to restore are written (an accepted ApiVersions, a restoration, a principal, or an
inferred identity), plus
restored identities still waiting for their connection, at most --max-connections; no
secret is ever in it (the registry holds none). The file is created 0600: it names hosts and
principals.

Reading is bounded and never fatal: a missing file is a first start (silent); a file over
`MAX_STATE_BYTES`, with more entries than the live table holds (`--max-connections`), or that is
unreadable, not UTF-8 JSON, too deeply nested, of another format or version, or has one entry
of the wrong shape is reported in ONE warning line and ignored. Entries silent for longer than
the idle timeout are stale (the broker has closed those connections) and dropped. A state file
that cannot be created at all (its directory missing and not creatable, not writable, or the
path is a directory) is a start-up error (`StateError`); a later failed write is a warning, a
count (`state_write_errors`) and the old file kept. A save never writes more than the reader
takes (`MAX_STATE_BYTES`): past it the inferred identities are left out first, then the last
entries, counted (`state_entries_dropped`) with a warning.
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import tempfile
import threading
import time
from dataclasses import fields
from typing import Any

from exporter.census.fingerprint import MAX_EVIDENCE  # evidence strings of an inferred identity
from exporter.census.saved import SavedIdentity
from exporter.eventlog.files import fsync_dir

FORMAT = "kafka-census-state"
VERSION = 1
# 100,000 connections (the default --max-connections) take about 40 MB; a bigger file is
# refused rather than parsed (JSON parsing takes several times the file size in memory).
MAX_STATE_BYTES = 64 << 20
MAX_STRING = 32767  # Kafka strings carry an int16 length
DEFAULT_INTERVAL = 60.0

log = logging.getLogger("kafka-census")


class StateError(Exception):
    """The state file cannot be used: the message says why, for one warning or start-up error."""


def _string(value) -> bool:
    return isinstance(value, str) and len(value) <= MAX_STRING


def _optional_string(value) -> bool:
    return value is None or _string(value)


def _port(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 65535


def _time(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _version(value) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 32767)


_INFERRED_SOURCES = frozenset(("sibling", "fingerprint"))


def _inferred(value) -> bool:
    """None, or an inferred identity as `exporter.census.saved.saved_inferred` writes it: exactly its
    keys, each of its type, a source the registry restores, at most MAX_EVIDENCE strings."""
    if value is None:
        return True
    if not isinstance(value, dict) or set(value) != _INFERRED_KEYS:
        return False
    confidence = value["confidence"]
    evidence = value["evidence"]
    return (value["source"] in _INFERRED_SOURCES and _string(value["name"]) and _string(value["version_range"])
            and isinstance(confidence, (int, float)) and not isinstance(confidence, bool)
            and math.isfinite(confidence) and 0 <= confidence <= 1
            and isinstance(evidence, list) and len(evidence) <= MAX_EVIDENCE and all(map(_string, evidence))
            and _optional_string(value["min_compatible"]) and _optional_string(value["sibling_connection_id"]))


_INFERRED_KEYS = frozenset(("source", "name", "version_range", "confidence", "evidence", "min_compatible",
                            "sibling_connection_id"))

#: Every field of an entry and its check; an entry missing one, or failing one, spoils the file.
_FIELD_CHECKS = {
    "client_address": _string, "client_port": _port, "broker_address": _string, "broker_port": _port,
    "listener": _string, "client_id": _optional_string, "client_software_name": _optional_string,
    "client_software_version": _optional_string, "identity_version": _version, "principal": _optional_string,
    "sasl_mechanism": _optional_string, "first_seen": _time, "last_seen": _time, "inferred": _inferred,
}
#: Fields added within version 1, and their value when a file of an older writer lacks them.
_ADDED = {"inferred": None}
assert set(_FIELD_CHECKS) == {f.name for f in fields(SavedIdentity)}, "state format and SavedIdentity differ"
_FIELDS = tuple(f.name for f in fields(SavedIdentity))


def encode_state(saved: list[SavedIdentity], written_at: float) -> bytes:
    # getattr, not dataclasses.asdict: asdict deep-copies every value (100k entries: 3.6 s vs 0.8 s).
    doc = {"format": FORMAT, "version": VERSION, "written_at": written_at,
           "connections": [{name: getattr(s, name) for name in _FIELDS} for s in saved]}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def decode_state(data: bytes, *, max_entries: int) -> list[SavedIdentity]:
    """The entries of a state file's bytes, or StateError saying (in a few words) what is wrong."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise StateError("not UTF-8") from None
    except RecursionError:  # hostile nesting: json gives up at the recursion limit
        raise StateError("nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4300 digits
        raise StateError(f"not JSON ({str(exc).split(':')[0]})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise StateError(f"not a {FORMAT} file")
    version = doc.get("version")
    if version != VERSION or isinstance(version, bool):
        raise StateError(f"version {version!r}, this kafka-census reads version {VERSION}")
    conns = doc.get("connections")
    if not isinstance(conns, list):
        raise StateError("no connections list")
    if len(conns) > max_entries:
        raise StateError(f"{len(conns)} connections, more than the {max_entries} --max-connections")
    out = []
    for i, entry in enumerate(conns):
        if not isinstance(entry, dict):
            raise StateError(f"connection {i} is not an object")
        for name, check in _FIELD_CHECKS.items():
            if name not in entry:
                if name in _ADDED:
                    continue
                raise StateError(f"connection {i} has no {name}")
            if not check(entry[name]):
                raise StateError(f"connection {i} has a bad {name}")
        fields: dict[str, Any] = {name: entry.get(name, _ADDED.get(name)) for name in _FIELD_CHECKS}  # checked above
        out.append(SavedIdentity(**fields))
    return out


def read_state(path: str, *, max_entries: int, max_bytes: int = MAX_STATE_BYTES) -> list[SavedIdentity] | None:
    """The entries of the state file at `path`; None if there is none (a first start).
    Raises StateError for anything else that keeps it from being used."""
    try:
        # O_NONBLOCK: a FIFO put at the path must not hang the start-up (it is refused below).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StateError("not a regular file")
            if st.st_size > max_bytes:
                raise StateError(f"{st.st_size} bytes, more than the limit of {max_bytes}")
            data = f.read(max_bytes + 1)  # a file growing under us is still bounded
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"cannot read it: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise StateError(f"more than the limit of {max_bytes} bytes")
    return decode_state(data, max_entries=max_entries)


def write_atomic(path: str, data: bytes) -> None:
    """Replace `path` with `data`: write a temporary file in the same directory, fsync it,
    rename it over `path`, fsync the directory. On any failure the temporary file is removed,
    `path` keeps its old content, and the OSError propagates."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)


def check_writable(path: str) -> None:
    """Start-up check: the state file can be created (its directory is made if missing).
    StateError if not. An existing file that cannot be read is only a warning, later."""
    if os.path.isdir(path):
        raise StateError(f"--state-file {path} is a directory")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError:
        raise StateError(f"cannot create --state-file {path}: {directory} is not a directory") from None
    except OSError as exc:
        raise StateError(f"cannot create --state-file {path}: {exc.strerror or exc}") from None
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise StateError(f"cannot create --state-file {path}: {exc.strerror or exc}") from None


class StateKeeper:
    """The state file of one serving exporter. Counters for the health series:
    `writes`, `write_errors`, and the registry's `restored_connections`.

    Threads: `tick` runs on the capture thread and only sets an event; the periodic save runs
    on the keeper's own writer thread (started at the first due save). A save requested while
    one is running is coalesced into one more save after it. `save` itself writes on the
    calling thread, serialised with the writer's saves, so that the file is never replaced by
    an older snapshot."""

    def __init__(self, path: str, registry, *, interval: float = DEFAULT_INTERVAL, idle_timeout: float,
                 max_entries: int, clock=time.time, monotonic=time.monotonic, max_bytes: int = MAX_STATE_BYTES) -> None:
        if interval <= 0 or idle_timeout <= 0 or max_entries < 1:
            raise ValueError("interval, idle_timeout and max_entries must be positive")
        check_writable(path)
        self.path = path
        self.registry = registry
        self.interval = interval
        self.idle_timeout = idle_timeout
        self.max_entries = max_entries
        self.clock = clock
        self.monotonic = monotonic
        self.max_bytes = max_bytes
        self.writes = 0
        self.write_errors = 0
        self.entries_dropped = 0  # entries left out of a save to keep the file within max_bytes
        self._last_save = monotonic()
        self._failing = False
        self._save_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def restore(self) -> int:
        """Load the file and hand its fresh entries to the registry. Returns how many wait for
        their connection; a file that cannot be used is one warning and 0."""
        try:
            saved = read_state(self.path, max_entries=self.max_entries)
        except StateError as exc:
            log.warning("state file %s ignored: %s; connections joined mid-stream will show no identity "
                        "until they send ApiVersions again", self.path, exc)
            return 0
        if not saved:
            return 0
        waiting = self.registry.restore_identities(saved, self.idle_timeout)
        log.info("state file %s: %d connection identities to restore (%d stale, silent over %g s, dropped)",
                 self.path, waiting, len(saved) - waiting, self.idle_timeout)
        return waiting

    def tick(self) -> None:
        """Called about once a second from the capture thread: when `interval` has passed since
        the last save, asks the writer thread for one. Never waits for the disk."""
        if self._stopping or self.monotonic() - self._last_save < self.interval:
            return
        self._last_save = self.monotonic()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="state-writer", daemon=True)
            self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            self.save()

    def close(self, timeout: float | None = 60.0) -> bool:
        """At shutdown, after the capture has stopped: stop the writer thread (letting a save in
        progress finish) and save once more on this thread. Returns what `save` returns."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():  # a stalled disk: do not hang the shutdown on it too
                log.error("state file %s: a save is still waiting for the disk after %g s; not saving again",
                          self.path, timeout)
                return False
        return self.save()

    def save(self) -> bool:
        """Write the open connections' identities now, on the calling thread. A failure is a
        warning (once until a write succeeds again), a count, and the old file kept; never an
        exception."""
        with self._save_lock:
            self._last_save = self.monotonic()
            try:
                data = self._bounded(self.registry.saved_identities(), self.clock())
                write_atomic(self.path, data)
            except (OSError, ValueError) as exc:  # ValueError: a NaN time would not be JSON
                self.write_errors += 1
                if not self._failing:
                    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                    log.warning("cannot write state file %s: %s (keeping the previous one)", self.path, reason)
                self._failing = True
                return False
            self.writes += 1
            self._failing = False
            return True

    def _bounded(self, saved: list[SavedIdentity], now: float) -> bytes:
        """The file's bytes, within `max_bytes` (which the reader refuses beyond): if the entries do
        not fit, the inferred identities go first (an inference can be made again; an announced
        identity cannot be seen again mid-stream), then the last entries, counted in
        `entries_dropped` and warned about."""
        data = encode_state(saved, now)
        if len(data) <= self.max_bytes:
            return data
        ranked = sorted(saved, key=lambda e: e.inferred is not None)  # stable: the announced ones first
        keep = len(ranked)
        while keep and len(data) > self.max_bytes:
            keep = min(keep - 1, int(keep * self.max_bytes / len(data) * 0.98))  # the mean entry's share
            data = encode_state(ranked[:keep], now)
        dropped = len(saved) - keep
        self.entries_dropped += dropped
        log.warning("state file %s: %d of %d connection identities left out to stay within %d bytes",
                    self.path, dropped, len(saved), self.max_bytes)
        return data

    def health(self) -> dict:
        return {"state_restored_connections": self.registry.restored_connections,
                "state_write_errors": self.write_errors, "state_entries_dropped": self.entries_dropped}
