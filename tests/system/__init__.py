"""Tests of the whole sidecar end to end with real brokers and clients: every output, and secrets
never in one.
"""
