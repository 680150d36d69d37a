"""Tests of the repository's own rules: imports and layers, test tiers, the docs against the code.
"""
