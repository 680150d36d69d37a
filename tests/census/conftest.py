"""Fixtures shared by the census tests."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture()
def census_log(caplog):
    """caplog on the "kafka-census" logger itself, at INFO: the CLI's logging setup (when a test
    runs main() in this process) stops that logger propagating to the root, where caplog sits."""
    logger = logging.getLogger("kafka-census")
    old_level, old_propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(caplog.handler)
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.setLevel(old_level)
    logger.propagate = old_propagate
