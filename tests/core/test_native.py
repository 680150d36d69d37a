"""The compiled hot path's loader (capture/_native.py): which module runs compiled, and why not.

The equality of the two implementations is tests/core/test_differential.py's; here: the module
lists agree, the test environment runs what it says, a stale or missing extension falls back
to the source, and KAFKA_CENSUS_PURE_PYTHON=1 forces the source.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import capture
from capture import _native

ROOT = Path(__file__).resolve().parents[2]
FORCED_PURE = os.environ.get(_native.PURE_ENV, "") not in ("", "0")


def test_setup_compiles_exactly_the_modules_the_loader_knows():
    tree = ast.parse((ROOT / "setup.py").read_text())
    listed = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "NATIVE_MODULES")
    assert tuple(listed) == _native.NATIVE_MODULES


def test_this_run_uses_the_implementation_it_reports():
    import capture.kafka.connection as connection

    status = capture.native_modules()
    assert set(status) == set(_native.NATIVE_MODULES)
    if FORCED_PURE:
        assert set(status.values()) == {_native.PURE_FORCED} and capture.hot_path() == "pure"
    else:
        assert set(status.values()) == {_native.COMPILED}, (
            f"{status}: the hot path is not compiled here; run `make native` (needs gcc and python3-dev)")
        assert capture.hot_path() == "compiled"
    assert connection.__file__.endswith(".py") == FORCED_PURE, connection.__file__


def test_the_pure_switch_in_a_fresh_process():
    code = ("import capture, capture.kafka.connection as c, capture.flows as f; "
            "print(capture.hot_path(), c.__file__, f.__file__)")
    env = {**os.environ, _native.PURE_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    word, *files = out.stdout.split()
    assert word == "pure" and all(f.endswith(".py") for f in files), out.stdout


@pytest.fixture
def fake_tree(tmp_path, monkeypatch):
    """A tree with one module's source, extension and build record, seen by the loader."""
    monkeypatch.setattr(_native, "_ROOT", str(tmp_path))
    monkeypatch.setattr(_native, "NATIVE_MODULES", ("capture.packets",))
    monkeypatch.delenv(_native.PURE_ENV, raising=False)
    (tmp_path / "capture").mkdir()
    source = tmp_path / "capture" / "packets.py"
    source.write_text("X = 1\n")
    extension = tmp_path / "capture" / ("packets" + importlib.machinery.EXTENSION_SUFFIXES[0])
    extension.write_bytes(b"\x7fELF")
    record = {"modules": {"capture.packets": hashlib.sha256(source.read_bytes()).hexdigest()}}
    (tmp_path / "capture" / _native.BUILD_RECORD).write_text(json.dumps(record))
    return source, extension


def test_a_current_extension_is_used(fake_tree):
    assert _native._decide() == {"capture.packets": _native.COMPILED}


def test_an_edited_source_runs_as_python_not_as_its_stale_extension(fake_tree):
    source, _ = fake_tree
    source.write_text("X = 2\n")
    assert _native._decide() == {"capture.packets": _native.PURE_STALE}


def test_no_extension_or_no_record_means_python(fake_tree, tmp_path):
    _, extension = fake_tree
    (tmp_path / "capture" / _native.BUILD_RECORD).write_text("{not json")
    assert _native._decide() == {"capture.packets": _native.PURE_STALE}
    extension.unlink()
    assert _native._decide() == {"capture.packets": _native.PURE_NOT_BUILT}


@pytest.mark.parametrize("value, forced", [("1", True), ("yes", True), ("0", False), ("", False)])
def test_the_switch_forces_python_even_over_a_current_extension(fake_tree, monkeypatch, value, forced):
    monkeypatch.setenv(_native.PURE_ENV, value)
    assert _native._decide() == {"capture.packets": _native.PURE_FORCED if forced else _native.COMPILED}


def test_a_module_compiled_against_a_stale_one_runs_as_python_too(fake_tree, tmp_path, monkeypatch):
    source, _ = fake_tree
    monkeypatch.setattr(_native, "NATIVE_MODULES", ("capture.packets", "capture.flows"))
    flows = tmp_path / "capture" / "flows.py"
    flows.write_text("Y = 1\n")
    (tmp_path / "capture" / "flows.pxd").write_text("cimport capture.packets as packets\n")
    (tmp_path / "capture" / ("flows" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"\x7fELF")
    record = {"modules": {m: hashlib.sha256(p.read_bytes()).hexdigest()
                          for m, p in (("capture.packets", source), ("capture.flows", flows))}}
    (tmp_path / "capture" / _native.BUILD_RECORD).write_text(json.dumps(record))
    assert set(_native._decide().values()) == {_native.COMPILED}
    source.write_text("X = 2\n")
    assert _native._decide() == {"capture.packets": _native.PURE_STALE, "capture.flows": _native.PURE_DEPENDENCY}


def test_editing_the_core_leaves_the_capture_importable(tmp_path):
    """The real build: with connection.py edited, flows (compiled against its C layout) must not
    load as its extension ("size changed"), but run as Python beside the Python core. The child
    runs without KAFKA_CENSUS_PURE_PYTHON, so this holds in the pure pass of the suite too."""
    import shutil

    shutil.copytree(ROOT / "capture", tmp_path / "capture", ignore=shutil.ignore_patterns("__pycache__", "*.c"))
    with open(tmp_path / "capture" / "kafka" / "connection.py", "a") as f:
        f.write("\n# edited after the build\n")
    code = ("import capture, capture.flows as f; s = capture.native_modules(); "
            "print(capture.hot_path(), s['capture.flows'])")
    env = {k: v for k, v in os.environ.items() if k != _native.PURE_ENV}
    env["PYTHONPATH"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(None, 1) == ["mixed", _native.PURE_DEPENDENCY + "\n"], out.stdout
