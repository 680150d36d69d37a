"""The old name of harness/kafka_frames.py (moved there so that bench/ can share it without importing
tests/): the same module object, so test modules may import either name."""

import sys

from harness import kafka_frames

sys.modules[__name__] = kafka_frames
