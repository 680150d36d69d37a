"""What a Spark executor needs of kafka-census, shipped with the job.

Owns `code_archive()`: a zip of the pure-Python sources of `pipeline`, `capture` and `exporter`
(no compiled extensions: on an executor the hot path runs as Python, capture/_native's
fallback), built once per driver process and handed to `SparkContext.addPyFile`. So a worker
with nothing of kafka-census installed (a standalone, YARN or Kubernetes executor with Python
and Spark only) runs every job. Imports only the standard library; nothing but `pipeline.cli`
imports it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

PACKAGES = ("pipeline", "capture", "exporter")
ROOT = Path(__file__).resolve().parent.parent
_archive: Path | None = None


def _sources(root: Path):
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


def code_archive(root: Path = ROOT) -> Path:
    """The zip (cached for this process, removed at exit); its entries are dated 1980 so the same
    sources give the same bytes."""
    global _archive
    if _archive is not None and _archive.exists():
        return _archive
    directory = Path(tempfile.mkdtemp(prefix="kafka-census-ship-"))
    atexit.register(shutil.rmtree, directory, True)
    target = directory / "kafka_census_code.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in _sources(root):
            info = zipfile.ZipInfo(str(path.relative_to(root)), date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
    os.chmod(target, 0o644)
    _archive = target
    return target
