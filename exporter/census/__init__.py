"""The census: the registry of live connections and clients, and everything it decides.

Owns the connection record and its fields (record.py, fields.py), the registry (registry.py:
events in, under one lock), the series budget (series.py), the reads (reads.py: copy, filter,
order, census rows; readiness.py: upgrade readiness), the brokers' answers (brokers.py), client
identity (basis.py: the identity basis; identity.py: siblings, clients; fingerprint.py), the
state file's identities (saved.py), churn (churn.py) and topics, groups and transactional ids
(topics.py: their state and bounds; topic_reads.py: who writes and reads each topic;
topickeys.py: their rules); the registry's parts never import it.
May import `capture.events` and capture's public reference tables, and the standard library;
never the HTTP, event-log, aggregator, service or CLI packages (tests/layout/test_layers.py).
"""
