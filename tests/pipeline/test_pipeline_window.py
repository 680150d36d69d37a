"""--since/--until read only the event-log files whose names can hold the window
(pipeline.events.in_window): pure Python over file names, no Spark session."""

from __future__ import annotations

from datetime import UTC, datetime

from pipeline.events import WINDOW_SLACK, in_window, started_at

HOUR = 3600.0


def at(day: int, hour: int) -> float:
    return datetime(2026, 11, day, hour, tzinfo=UTC).timestamp()


def name(host: str, day: int, hour: int, seq: int, directory: str = "s3a://logs/events") -> str:
    return f"{directory}/events-202611{day:02d}T{hour:02d}0000Z-{host}-{seq:04d}.ndjson"


# Two hosts rotating every 6 hours over three days, and one file whose name has no start time.
FILES = [name(h, d, hr, i) for h in ("broker-1", "broker-2") for i, (d, hr) in
         enumerate((d, hr) for d in (20, 21, 22) for hr in (0, 6, 12, 18))]
OTHER = "s3a://logs/decoded/source=a.pcap/part-00000.txt"


def test_a_name_carries_its_start_time():
    assert started_at(name("broker-1", 21, 6, 3)) == at(21, 6)
    assert started_at("events-20261121T060000Z-host-with-dashes-0003.ndjson") == at(21, 6)
    assert started_at(OTHER) is None
    assert started_at("events-20261121T060000Z-broker-1-0003.ndjson.active") is None


def test_no_window_reads_everything():
    assert in_window(FILES + [OTHER], None, None) == FILES + [OTHER]


def test_a_day_reads_that_day_and_the_file_running_into_it():
    got = in_window(FILES + [OTHER], at(21, 0), at(22, 0))
    for host in ("broker-1", "broker-2"):
        mine = sorted(f for f in got if host in f)
        # the day's four files, the one before (it runs until 21T00, within the slack), and the
        # next day's first (it starts at 22T00, within the slack of the end)
        assert mine == sorted(name(host, d, hr, i) for i, (d, hr) in enumerate(
            (d, hr) for d in (20, 21, 22) for hr in (0, 6, 12, 18)) if at(20, 18) <= at(d, hr) <= at(22, 0))
    assert OTHER in got  # a name without a start time is always read


def test_far_from_the_window_nothing_is_read_but_the_last_file_of_a_host_runs_on():
    before = in_window(FILES, at(10, 0), at(11, 0))
    assert before == []
    after = in_window(FILES, at(28, 0), None)  # the last file of each host has no end
    assert after == sorted(name(h, 22, 18, 11) for h in ("broker-1", "broker-2"))


def test_the_slack_covers_a_writer_behind_its_events():
    """A file named at 12:00 may hold events from up to WINDOW_SLACK before (queued across a
    rotation, or a rollup written at its interval): a window ending just after 10:00 reads it."""
    assert WINDOW_SLACK >= 3600
    got = in_window(FILES, at(21, 9), at(21, 12) - WINDOW_SLACK + 1)
    assert name("broker-1", 21, 12, 6) in got


def test_each_host_and_directory_has_its_own_rotation():
    a = [name("broker-1", 21, 0, 0, "/a"), name("broker-1", 21, 12, 1, "/a")]
    b = [name("broker-1", 20, 0, 0, "/b")]  # another sidecar's copy, in another directory: it runs on
    got = in_window(a + b, at(21, 18), at(21, 20))
    assert got == sorted([a[1], b[0]])
