"""kio's messages at any version, for the tests that feed kio's bytes to the core
(tests/core/test_kio_oracle.py, tests/core/test_topics.py): the versions kio ships for an API, its
module for one version, and an entity built with the fields a test gives, every other required
field a neutral, schema-valid value. Imports kio only, nothing of the project."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib
import pkgutil
import types
import typing
import uuid

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32Timedelta, i64Timedelta


@functools.cache
def kio_versions(api: str) -> tuple[int, ...]:
    """Every version kio ships for an API (its `v<N>` subpackages)."""
    pkg = importlib.import_module(f"kio.schema.{api}")
    return tuple(sorted(int(m.name[1:]) for m in pkgutil.iter_modules(pkg.__path__)
                        if m.name.startswith("v") and m.name[1:].isdigit()))


def kio_module(api: str, version: int):
    return importlib.import_module(f"kio.schema.{api}.v{version}")


def _neutral(tp):
    """A schema-valid value for a field the test does not care about."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return None
    if origin is tuple:
        return ()
    if isinstance(tp, type):
        if issubclass(tp, ErrorCode):
            return ErrorCode.none
        if issubclass(tp, bool):
            return False
        if issubclass(tp, i32Timedelta):
            return i32Timedelta.parse(datetime.timedelta(0))
        if issubclass(tp, i64Timedelta):
            return i64Timedelta.parse(datetime.timedelta(0))
        if issubclass(tp, int):
            return tp(0)
        if issubclass(tp, bytes):
            return b""
        if issubclass(tp, str):
            return ""
        if issubclass(tp, uuid.UUID):
            return uuid.UUID(int=0)
    raise TypeError(f"no neutral value for {tp!r}")


def field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def build(cls, **values):
    """A kio entity with the given fields; every other required field gets a neutral value.
    Lets one test build the same message across versions whose field sets differ."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            values[f.name] = _neutral(hints[f.name])
    return cls(**values)


def ms(n: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=n))

