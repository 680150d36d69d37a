"""Which modules of the hot path run compiled: the loader of the Cython extensions.

Owns `NATIVE_MODULES` (the modules setup.py compiles), the choice between a module's extension
and its `.py` source, and `native_modules()`, which reports that choice. Imports only the
standard library: `capture/__init__.py` installs it before any module of the hot path loads.

setup.py compiles each module's `.py` as it is (the `.py` stays the one source of protocol
truth) and records the SHA-256 of every source it compiled in `native-build.json` beside the
extensions. An extension is used only while that record matches the `.py` on disk, so an edited
source never runs as its stale extension: it runs as Python, and `native_modules()` says why
(`make test` rebuilds, and tests/core/test_native.py fails on a stale build). A module compiled
against another's C declarations (a `cimport` in its `.pxd`) runs as Python too whenever that
other does: its extension would refuse the other's Python class ("size changed") at import.
`KAFKA_CENSUS_PURE_PYTHON=1` forces every module to its `.py` (the reference implementation).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import sys

# Kept in step with setup.py's list (tests/core/test_native.py checks it).
NATIVE_MODULES = (
    "capture.packets",
    "capture.flows",
    "capture.kafka.readers",
    "capture.kafka.headers",
    "capture.kafka.bodies",
    "capture.kafka.sasl",
    "capture.kafka.states",
    "capture.kafka.resync",
    "capture.kafka.tally",
    "capture.kafka.topic_walk",
    "capture.kafka.topics",
    "capture.kafka.connection",
)
PURE_ENV = "KAFKA_CENSUS_PURE_PYTHON"
BUILD_RECORD = "native-build.json"  # in capture/: {"modules": {name: sha256 of the .py compiled}}

COMPILED = "compiled"
PURE_FORCED = f"pure ({PURE_ENV}=1)"
PURE_NOT_BUILT = "pure (no extension built)"
PURE_STALE = "pure (the .py changed since the extension was built: reinstall or `make native`)"
PURE_DEPENDENCY = "pure (a module it is compiled against runs as Python)"
_CIMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+cimport|cimport\s+([\w.]+))", re.M)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the directory holding capture/
_status: dict[str, str] = {}
_redirect: set[str] = set()  # modules that run as Python although an extension sits beside them


def _path(name: str, suffix: str) -> str:
    return os.path.join(_ROOT, *name.split(".")) + suffix


def _extension(name: str) -> str | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if os.path.isfile(_path(name, suffix)):
            return _path(name, suffix)
    return None


def _digest(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def _built() -> dict:
    try:
        with open(os.path.join(_ROOT, "capture", BUILD_RECORD), "rb") as f:
            modules = json.load(f).get("modules")
    except (OSError, ValueError, AttributeError):
        return {}
    return modules if isinstance(modules, dict) else {}


def _decide() -> dict[str, str]:
    forced = os.environ.get(PURE_ENV, "") not in ("", "0")
    built = {} if forced else _built()
    status = {}
    for name in NATIVE_MODULES:
        if forced:
            status[name] = PURE_FORCED
        elif _extension(name) is None:
            status[name] = PURE_NOT_BUILT
        elif built.get(name) != _digest(_path(name, ".py")):
            status[name] = PURE_STALE
        else:
            status[name] = COMPILED
    changed = True
    while changed:  # until no compiled module cimports one that runs as Python
        changed = False
        for name in NATIVE_MODULES:
            if status[name] == COMPILED and any(status[dep] != COMPILED for dep in _cimports(name)):
                status[name], changed = PURE_DEPENDENCY, True
    return status


def _cimports(name: str) -> set[str]:
    """The hot-path modules `name`'s .pxd cimports (its compiled code depends on their C layout)."""
    try:
        with open(_path(name, ".pxd"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return set()
    return {m for pair in _CIMPORT.findall(text) for m in pair if m in NATIVE_MODULES} - {name}


class _SourceFinder:
    """Finds the `.py` of the modules that must not load as their extension (the default finder
    would prefer the extension beside it). Where no extension exists (a source tree, or the zip a
    Spark job ships to its executors) the default finder is left to do its work."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in _redirect:
            return None
        return importlib.util.spec_from_file_location(name, _path(name, ".py"))


def install() -> None:
    """Decide once per process, before any hot-path module is imported."""
    if _status:
        return
    _status.update(_decide())
    _redirect.update(n for n, s in _status.items() if s != COMPILED and _extension(n) is not None)
    if _redirect:
        sys.meta_path.insert(0, _SourceFinder)


def native_modules() -> dict[str, str]:
    """Each hot-path module and how it runs: `COMPILED`, or `pure (...)` with the reason."""
    return dict(_status)


def hot_path() -> str:
    """One word for build_info and --version: compiled, pure or mixed."""
    kinds = {s == COMPILED for s in _status.values()}
    return "compiled" if kinds == {True} else "pure" if kinds == {False} else "mixed"
