"""The old name of harness/census.py (moved there so that bench/ can share it without importing
tests/): the same module object, so test modules may import either name."""

import sys

from harness import census

sys.modules[__name__] = census
