"""The installed kafka-census version, for `--version`, the build-info metric and the REST API.

Owns `package_version`. Imports only the standard library; anything in `exporter` may import it.
"""

from __future__ import annotations

from importlib import metadata

NOT_INSTALLED = "0+unknown"  # a PEP 440 local version: running from a checkout, not installed


def package_version() -> str:
    try:
        return metadata.version("kafka-census")
    except metadata.PackageNotFoundError:
        return NOT_INSTALLED
