"""Tests of the command line: the console script, settings, the packet commands' output, the
incident CLI, escaping.
"""
