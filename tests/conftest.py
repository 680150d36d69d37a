"""Fixtures shared by test modules. Only what more than one module needs lives here."""

import pytest


@pytest.fixture(scope="module")
def spark():
    """One local Spark session per test module, with the CLI's settings (UTC, no UI) and few
    shuffle partitions for small data."""
    from pipeline.cli import spark_session

    session = spark_session("local[2]", "tests")
    session.sparkContext.setLogLevel("ERROR")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def real_clients_capture(tmp_path_factory):
    """A real capture, recorded once per run: the six clients (tests/peers.py), one after the
    other, against Tansu on loopback, by tcpdump. Returns (pcap path, broker port)."""
    from tests import oracles, peers

    path = tmp_path_factory.mktemp("real-clients") / "clients.pcap"
    port = peers.free_port()
    with peers.start_tansu(port, port) as broker:
        with oracles.tcpdump_capture("lo", f"tcp port {port}", path):
            for name in peers.CLIENTS:
                peers.run_client(name, broker.bootstrap, timeout=90)
    return path, port
