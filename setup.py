"""The compiled hot path: Cython builds these pure-Python modules as they are (pyproject.toml
holds the metadata). The .py files stay the only source of protocol truth. Without a C compiler
or Python's headers the install still succeeds, in pure Python, with a warning
(`capture.native_modules()` says which path runs; KAFKA_CENSUS_PURE_PYTHON=1 forces the pure
one even when the extensions are built).

Beside the extensions it writes capture/native-build.json, the SHA-256 of each source compiled:
capture/_native.py loads an extension only while its source is unchanged.
"""

import hashlib
import json
import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

# Kept in step with capture._native.NATIVE_MODULES (tests/core/test_native.py checks it).
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

WARNING = """
warning: kafka-census's compiled hot path was not built ({why}); installing the pure-Python
modules, which decode the same but several times slower. To build it, install a C compiler and
Python's headers (Debian: apt-get install gcc python3-dev) and reinstall.
"""


class OptionalBuildExt(build_ext):
    """A failed compile leaves the pure-Python install in place rather than failing it."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 - distutils raises several unrelated types
            self._warn(e)
            return
        self._record()

    def _record(self):
        """native-build.json beside the extensions (in place, or in the wheel's tree). Nothing
        compiled this time (cythonize failed): the record of the last build still holds."""
        if not self.extensions:
            return
        built = {}
        for ext in self.extensions:
            if os.path.exists(self.get_ext_fullpath(ext.name)):
                with open(ext.name.replace(".", "/") + ".py", "rb") as f:
                    built[ext.name] = hashlib.sha256(f.read()).hexdigest()
        target = os.path.join(os.path.dirname(self.get_ext_fullpath("capture.packets")), "native-build.json")
        with open(target, "w") as f:
            json.dump({"modules": built}, f, indent=1, sort_keys=True)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            self._warn(e)

    def _warn(self, e):
        sys.stderr.write(WARNING.format(why=f"{type(e).__name__}: {e}"))


def extensions():
    try:
        from Cython.Build import cythonize
    except ImportError as e:  # built without the build requirements (--no-build-isolation)
        sys.stderr.write(WARNING.format(why=f"Cython not importable: {e}"))
        return []
    from setuptools import Extension

    exts = [Extension(name, [name.replace(".", "/") + ".py"]) for name in NATIVE_MODULES]
    try:
        return cythonize(
            exts,
            compiler_directives={
                "language_level": 3,
                # Annotations stay documentation: typing `bytes` would add exact type checks that
                # refuse a bytearray or memoryview the pure modules accept.
                "annotation_typing": False,
                # Functions that introspect like Python ones (signatures, __module__, pickling).
                "binding": True,
            },
            quiet=True,
        )
    except Exception as e:  # noqa: BLE001 - a Cython error must not fail the install
        sys.stderr.write(WARNING.format(why=f"cythonize failed: {e}"))
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
