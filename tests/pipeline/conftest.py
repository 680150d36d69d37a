"""Fixtures of the fleet pipeline's tests (test_pipeline_jobs.py, test_pipeline_quarantine.py): a
directory per module, and the generated fleet's event logs in it (tests/pipeline/fleet.py; a
third of a second to write). Module-scoped: each module writes its own; a module defining its
own `fleet` (test_spark_cluster.py) uses that."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pipeline.fleet import write_fleet


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pipeline")


@pytest.fixture(scope="module")
def fleet(tmp) -> Path:
    root = tmp / "fleet"
    write_fleet(root)
    return root
