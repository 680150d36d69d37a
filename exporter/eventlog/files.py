"""The event log's files: their names, creating and finishing one, recovery and retention.

Owns the file name (`LOG_NAME`, `SUFFIX`, `ACTIVE_SUFFIX`), `EventLogError`, `open_directory`,
`LogFiles` (one writer's files in one directory: creating the next `.active` file, finishing it,
finishing what a crashed run left, deleting the oldest past the total), `fsync_dir` and
`cut_partial_tail`. Disk operations only: what goes into a file and when a file is rotated is
the writer's (exporter/eventlog/writer.py), which counts and reports the errors these hand it.
Imports the standard library only; must not import the record format, the reader or the writer.

Names: `events-<UTC start>-<host>-<seq>.ndjson`, e.g. `events-20261121T220300Z-node-7-0003.ndjson`.
The file being written is named `.ndjson.active`, so a reader that lists `*.ndjson` (as
`exporter.eventlog.reader.list_logs` does) only ever sees finished files. `<host>` (the pod
name in Kubernetes) keeps the files of a fleet apart once gathered in one place; `<seq>`
numbers one writer's files and is bumped past any name already taken, so nothing is ever
overwritten. A file is finished by fsync, rename to `.ndjson`, fsync of the directory. The
`.active` file a crashed run left behind under the same host name is finished when the next
writer starts (its partial last line cut off): one writer per (directory, host).

Retention (`max_total_bytes`, `--event-log-max-total-mb`): after each rotation (and at start)
the oldest finished files of this log are deleted until they, plus `max_bytes` of room for the
file being written, fit in `max_total_bytes`. Only regular files named
`events-*-<this host>-<seq>.ndjson` are candidates: never the active file, another host's
files, a symlink, or anything else in the directory. A file can exceed `max_bytes` by at most
one record (a record is never split), so the cap holds to within one record.

Files are created 0600 (they name hosts, client ids and principals), never through a
symlink; recovery opens `.active` files with O_NOFOLLOW and skips (reports) a symlink or
anything that is not a regular file, leaving it and its target untouched.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable
from datetime import UTC, datetime

SUFFIX = ".ndjson"
ACTIVE_SUFFIX = SUFFIX + ".active"
# groups: 1 the UTC start, 2 the host, 3 the sequence number, 4 ".active" (a file being written)
LOG_NAME = re.compile(r"events-(\d{8}T\d{6}Z)-(.+)-(\d+)\.ndjson(\.active)?\Z")

# (what failed, the error): the writer counts it (`write_errors`) and keeps it (`last_error`)
ErrorSink = Callable[[str, OSError], None]


class EventLogError(Exception):
    """The event log cannot start, or a log file cannot be read as one."""


def open_directory(directory: str) -> None:
    """Create the log directory if need be; EventLogError if it cannot be used."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise EventLogError(f"cannot create event log directory {directory}: {e.strerror or e}") from None
    if not os.path.isdir(directory):
        raise EventLogError(f"cannot use event log directory {directory}: not a directory")


def host_part(host: str) -> str:
    """`host` as the `<host>` of a file name: anything but letters, digits, `.` and `-` is `_`."""
    return re.sub(r"[^A-Za-z0-9.-]", "_", host) or "host"


def fsync_dir(directory: str) -> None:
    """Make a rename or a new file in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def cut_partial_tail(fd: int) -> int:
    """Truncate the open file after its last newline (a crash can leave half a record); its
    new size."""
    end = pos = os.fstat(fd).st_size
    keep = 0
    while pos > 0:
        step = min(65536, pos)
        chunk = os.pread(fd, step, pos - step)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            keep = pos - step + nl + 1
            break
        pos -= step
    if keep != end:
        os.ftruncate(fd, keep)
    os.fsync(fd)
    return keep


class LogFiles:
    """The files of one writer: `directory`, under `host` (already `host_part`). Not
    thread-safe: the writer serialises the calls. Every failed OS call goes to `error`; an
    `.active` file recovery will not touch goes to `skip(path, why)`."""

    def __init__(self, directory: str, host: str, *, error: ErrorSink, skip: Callable[[str, str], None]) -> None:
        self.directory = directory
        self.host = host
        self._error = error
        self._skip = skip
        self._seq = 0

    def create(self, now: float) -> tuple[int, str] | None:
        """A new `.active` file named for `now` and the next free sequence number: (its fd,
        opened for appending, and its path), or None if it cannot be created (reported)."""
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")
        while True:
            base = os.path.join(self.directory, f"events-{stamp}-{self.host}-{self._seq:04d}")
            self._seq += 1
            if os.path.lexists(base + SUFFIX):  # lexists: a dangling symlink is taken too
                continue
            try:
                # O_APPEND: after a failed write is cut back, the next one lands at the new end.
                # 0600 as the state file: the records name hosts, client ids and principals.
                fd = os.open(base + ACTIVE_SUFFIX, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL
                             | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                continue
            except OSError as e:
                self._error(f"cannot create {base + ACTIVE_SUFFIX}", e)
                return None
            return fd, base + ACTIVE_SUFFIX

    def finish(self, fd: int, path: str, *, empty: bool) -> bool:
        """Fsync and close the active file, then rename it to `.ndjson` and fsync the directory;
        an `empty` one (every write failed) is deleted instead. True if the file was finished;
        on failure it stays `.active` (finished by the next run's recovery)."""
        try:
            os.fsync(fd)
        except OSError as e:
            self._error(f"cannot fsync {path}", e)
        try:
            os.close(fd)
        except OSError as e:
            self._error(f"cannot close {path}", e)
        if empty:  # nothing worth keeping
            try:
                os.unlink(path)
            except OSError as e:
                self._error(f"cannot remove empty {path}", e)
            return False
        try:
            os.rename(path, path[: -len(".active")])
            fsync_dir(self.directory)
        except OSError as e:
            self._error(f"cannot finish {path}", e)
            return False
        return True

    def recover(self) -> int:
        """Finish `.active` files a crashed run of this host left behind; how many."""
        try:
            names = os.listdir(self.directory)
        except OSError as e:
            self._error(f"cannot list {self.directory}", e)
            return 0
        recovered = 0
        for name in sorted(names):
            m = LOG_NAME.match(name)
            if not (m and m.group(4) and m.group(2) == self.host):
                continue
            path = os.path.join(self.directory, name)
            try:
                # O_NOFOLLOW: a symlink planted under our name must not make us truncate its
                # target; O_NONBLOCK: a FIFO must not hang the start.
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as e:
                self._skip(path, "a symlink" if e.errno == errno.ELOOP else (e.strerror or str(e)))
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    self._skip(path, "not a regular file")
                    continue
                size = cut_partial_tail(fd)
                if size == 0:
                    os.unlink(path)
                    continue
                os.rename(path, path[: -len(".active")])
                fsync_dir(self.directory)
            except OSError as e:
                self._error(f"cannot recover {path}", e)
                continue
            finally:
                os.close(fd)
            recovered += 1
        return recovered

    def finished_files(self) -> list[tuple[tuple[str, int], str, int]]:
        """(start order key, path, size) of this log's finished regular files, oldest first."""
        out = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                m = LOG_NAME.match(entry.name)
                if not m or m.group(4) or m.group(2) != self.host:
                    continue
                try:
                    if not entry.is_file(follow_symlinks=False):  # never a symlink, dir, FIFO...
                        continue
                    size = entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
                out.append(((m.group(1), int(m.group(3))), entry.path, size))
        out.sort()
        return out

    def enforce_total(self, max_total_bytes: int, room: int) -> tuple[int, int]:
        """Delete this log's oldest finished files until they and `room` bytes (a full active
        file) fit in `max_total_bytes`: (files, bytes) deleted."""
        try:
            files = self.finished_files()
        except OSError as e:
            self._error(f"cannot list {self.directory}", e)
            return 0, 0
        deleted_files = deleted_bytes = 0
        total = sum(size for _, _, size in files) + room
        for _, path, size in files:
            if total <= max_total_bytes:
                break
            try:
                os.unlink(path)
            except FileNotFoundError:  # someone else (a collector) took it: no longer ours to count
                total -= size
                continue
            except OSError as e:
                self._error(f"cannot delete {path}", e)
                continue
            total -= size
            deleted_files += 1
            deleted_bytes += size
        return deleted_files, deleted_bytes
