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
