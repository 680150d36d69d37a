"""Fixtures shared by test modules, and the rule that sorts tests into tiers.

Tiers (markers registered in pyproject.toml; `make test` runs them all, `make test-fast` only
the unmarked ones):

* ``e2e``: starts a real peer — a broker, a kafka-census process, Prometheus, tshark, tcpdump,
  a real (Python or Node) client.
* ``spark``: starts Spark (any test that uses the ``spark`` fixture gets it automatically).
* ``slow``: neither, but too slow for the edit loop.

A module says its tier with ``pytestmark``. So that a module cannot land in the fast tier by
forgetting to, every test that is neither ``e2e`` nor ``spark`` runs under a guard: starting one
of the peers above as a child process fails it with the marker to add (``PeerGuard``). The
guard sees the direct children of the test process only (a Python child that starts a peer
itself is not seen).
"""

from __future__ import annotations

import os
import re
import sys

import pytest

#: Markers that put a test outside the fast tier.
TIERS = ("e2e", "spark", "slow")
#: Markers under which a test may start peers.
PEER_TIERS = ("e2e", "spark")
#: Fixtures that start peers: a test using one (directly or through another fixture) is put in
#: the tier by this rule, whatever its module says.
FIXTURE_TIERS = {"spark": "spark", "real_clients_capture": "e2e"}

#: Modules whose pytestmark line is requested but not yet applied (their owners are editing
#: them). A module here that gets its own pytestmark fails tests/layout/test_tiers.py, so this table
#: only ever shrinks.
PENDING_TIERS: dict[str, str] = {}
#: Single tests of those modules (node id suffix -> marker), same rule.
PENDING_TEST_TIERS: dict[str, str] = {}


_MODULE_MARK = re.compile(r"^pytestmark = pytest\.mark\.(\w+)\b", re.M)


def module_tier(path) -> str | None:
    """The tier a test module puts all its tests in: its top-level `pytestmark = pytest.mark.X`
    line, or PENDING_TIERS."""
    if path.name in PENDING_TIERS:
        return PENDING_TIERS[path.name]
    try:
        found = _MODULE_MARK.search(path.read_text())
    except (OSError, UnicodeDecodeError):
        return None
    return found.group(1) if found and found.group(1) in TIERS else None


def pytest_ignore_collect(collection_path, config):
    """With -m deselecting a module's whole tier, do not even import it (assertion rewriting and
    the imports of the e2e modules: about a second of the fast tier's collection). Only skips
    what -m would deselect anyway; on any doubt it collects (returns None)."""
    markexpr = config.getoption("markexpr", "")
    if not markexpr or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    tier = module_tier(collection_path)
    if tier is None:
        return None
    try:
        from _pytest.mark.expression import Expression  # what -m itself evaluates with
        selected = Expression.compile(markexpr).evaluate(lambda name, **_: name == tier)
    except Exception:  # a pytest without this private API: collect and let -m deselect
        return None
    return True if not selected else None


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, marker in FIXTURE_TIERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
        name = item.path.name
        pending = PENDING_TIERS.get(name) or next(
            (m for key, m in PENDING_TEST_TIERS.items() if f"{name}::{item.name.split('[')[0]}" == key), None)
        if pending:
            item.add_marker(pending)


# --- the guard --------------------------------------------------------------------------------

#: Executables (by basename, or basename prefix for versioned names like tansu-v0.6.0-...) that
#: are peers. promtool is not among them: an offline parser, no server, done in milliseconds.
PEER_EXECUTABLES = ("kafka-census", "tansu", "prometheus", "tshark", "dumpcap", "tcpdump", "node", "npm", "npx",
                    "java", "spark-submit", "chromium", "chrome", "google-chrome", "chromedriver")
#: Python children that are peers: the CLI run as a module, the demo, a real client.
PEER_PYTHON = ("exporter.cli.main", "demo.py", "python_client.py")


def peer_in(argv) -> str | None:
    """The peer `argv` starts (see PEER_EXECUTABLES, PEER_PYTHON), or None. Every token is
    looked at, so that wrappers (`ip netns exec NS tansu ...`, `setpriv ... kafka-census`) count."""
    if isinstance(argv, (str, bytes, os.PathLike)):
        argv = [argv]
    for token in argv or ():
        base = os.path.basename(os.fsdecode(token))
        if base == "promtool":
            continue
        if base in PEER_PYTHON or any(base == p or base.startswith(p + "-") for p in PEER_EXECUTABLES):
            return base
    return None


class PeerInFastTier(RuntimeError):
    pass


class PeerGuard:
    """An audit hook (sys.addaudithook: it also sees `from subprocess import Popen` and asyncio's
    children) that refuses to start a peer while a test outside PEER_TIERS runs."""

    def __init__(self) -> None:
        self.item = None  # the test running now, when it may not start peers
        self.seen: dict[str, list[str]] = {}
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args) -> None:
        if event != "subprocess.Popen" or self.item is None:
            return
        peer = peer_in(args[1]) or peer_in([args[0]] if args[0] else [])
        if peer:
            message = (f"{self.item.nodeid} starts {peer} but is in the fast tier: give its module "
                       f"`pytestmark = pytest.mark.e2e` (or spark), see tests/conftest.py")
            self.seen.setdefault(self.item.nodeid, []).append(message)
            raise PeerInFastTier(message)


_guard: PeerGuard | None = None


def pytest_configure(config):
    global _guard
    if _guard is None:  # an audit hook cannot be removed: one per process
        _guard = PeerGuard()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not any(item.get_closest_marker(m) for m in PEER_TIERS):
        _guard.item = item
    try:
        yield
    finally:
        _guard.item = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Fail the test even if it caught the PeerInFastTier its Popen raised."""
    outcome = yield
    report = outcome.get_result()
    seen = _guard.seen.pop(item.nodeid, None) if call.when != "teardown" else None
    if seen and report.passed:
        report.outcome = "failed"
        report.longrepr = "\n".join(seen)


# --- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spark():
    """One local Spark session per test module, with the CLI's settings (UTC, no UI) and few
    shuffle partitions for small data. The JVM outlives the sessions (pyspark starts it once
    per process, with the first session's settings): 2 GiB of heap, since the modules' plans
    and caches pile up in it (at Spark's 1 GiB the last modules failed to broadcast a join)."""
    from pipeline.cli import spark_session

    session = spark_session("local[2]", "tests", [("spark.driver.memory", "2g")])
    session.sparkContext.setLogLevel("ERROR")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.catalog.clearCache()
    session.stop()


@pytest.fixture(scope="session")
def real_clients_capture(tmp_path_factory):
    """A real capture, recorded once per run: the six clients (harness/peers.py), one after the
    other, against Tansu on loopback, by tcpdump. Returns (pcap path, broker port). Its users
    (the differential, event-log-version and packet-loss tests) judge the decoder on bytes, which
    any broker's answers give; Tansu starts in a second."""
    from harness import oracles, peers

    path = tmp_path_factory.mktemp("real-clients") / "clients.pcap"
    port = peers.free_port()
    with peers.start_tansu(port, port) as broker:
        with oracles.tcpdump_capture("lo", f"tcp port {port}", path):
            for name in peers.CLIENTS:
                peers.run_client(name, broker.bootstrap, timeout=90)
    return path, port
