"""Tests of the event log: format, files, rotation, disk bounds, rollups and schema versions."""
