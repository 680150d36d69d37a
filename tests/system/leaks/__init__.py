"""No secret seen on the wire reaches an output: one real SASL run against Apache Kafka, shared
by the package's modules through its conftest.py (package-scoped fixtures, kept out of the other
system tests' way).
"""
