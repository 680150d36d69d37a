"""Tests of the registry and what it decides: records, series, reads, identity (siblings, clients,
fingerprints), churn, brokers, readiness, the state file.
"""
