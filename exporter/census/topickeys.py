"""Topic keys and roles (issue 31): the pure rules the topic state, the connection object and the reads share.

Owns the topic bounds' defaults, the key under which a connection's usage of a topic is kept
(`topic_key`: the topic's name, or `ID_PREFIX` + its id when a frame named it only by id, or
`OTHER_TOPIC` past --max-topics), its validity (`valid_name`, `valid_id`: Kafka's own rules),
turning a key back into (topic, topic_id) with the id map as it is when read (`split_key`:
an id named by a later Metadata answer gets its name then, so earlier usage is named too), and
the roles: of a connection (`connection_roles`: from the API keys it sent and the topic uses)
and of a client towards one topic (`topic_roles`: the Topic object's lists).

Imports only `capture.events` (the uses) and the generated API table (API names to keys);
nothing of the census: exporter/census/record.py, topics.py and topic_reads.py import it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from capture.events import TOPIC_USES
from capture.kafka.api_table import API_TABLE

# Distinct (use, topic) entries a connection keeps; past it counted in its topics_dropped.
DEFAULT_MAX_TOPICS_PER_CONNECTION = 256
# Distinct topics the open and recently closed connections may name; a new one past it is "<other>".
DEFAULT_MAX_TOPICS = 10_000
# Topic ids mapped to names (from Metadata answers); the least recently named go first.
DEFAULT_MAX_TOPIC_IDS = 10_000
# (use, topic) entries all the connections (open and recently closed) hold together: ~200 MB at about
# 200 bytes an entry, where --max-connections x --max-topics-per-connection alone would allow gigabytes.
DEFAULT_MAX_TOPIC_ENTRIES = 1_000_000

# The overflow topic: never a valid Kafka topic name ('<' and '>' are not allowed), so never a real one.
OTHER_TOPIC = "<other>"
# A key of a topic known only by its id: a character no topic name has, then the id.
ID_PREFIX = "#"

# Kafka's topic name rule (org.apache.kafka.common.internals.Topic.validate): 1-249 characters
# of ASCII letters, digits, '.', '_', '-', and not "." or "..".
_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
# Uuid.toString: 16 bytes in URL-safe base64 without padding, 22 characters.
_ID = re.compile(r"[A-Za-z0-9_-]{22}")

USES: dict[str, str] = {use: use for use in TOPIC_USES}  # a wire string -> the canonical (interned) one

ROLES = ("producer", "consumer", "admin", "broker")
# The Topic object's lists: a client's role towards one topic.
TOPIC_ROLES = ("producer", "consumer", "admin", "other")
# What a use says about the connection (connection_roles) and about the client towards the topic.
ROLE_OF_USE = {"produce": "producer", "txn": "producer", "fetch": "consumer", "offset_commit": "consumer",
               "offset_fetch": "consumer", "subscribe": "consumer", "list_offsets": "consumer", "create": "admin",
               "delete": "admin", "replicate": "broker", "metadata": None}
# The roles a connection's API keys say it has, whatever topics it named (so with --no-topics too).
_ROLE_APIS = {
    "producer": ("Produce", "InitProducerId", "AddPartitionsToTxn", "AddOffsetsToTxn", "EndTxn"),
    "consumer": ("JoinGroup", "SyncGroup", "Heartbeat", "LeaveGroup", "ConsumerGroupHeartbeat", "OffsetCommit",
                 "ShareGroupHeartbeat", "ShareFetch", "ShareAcknowledge", "StreamsGroupHeartbeat"),
    "admin": ("CreateTopics", "DeleteTopics", "CreatePartitions", "DeleteRecords", "AlterConfigs",
              "IncrementalAlterConfigs", "DescribeConfigs", "DescribeGroups", "ListGroups", "DeleteGroups",
              "OffsetDelete", "DescribeCluster", "CreateAcls", "DeleteAcls", "DescribeAcls", "ElectLeaders",
              "AlterPartitionReassignments", "ListPartitionReassignments", "AlterReplicaLogDirs", "DescribeLogDirs",
              "DescribeClientQuotas", "AlterClientQuotas", "DescribeUserScramCredentials",
              "AlterUserScramCredentials", "UpdateFeatures", "DescribeProducers", "DescribeTransactions",
              "ListTransactions", "CreateDelegationToken", "RenewDelegationToken", "ExpireDelegationToken",
              "DescribeDelegationToken", "ConsumerGroupDescribe", "ShareGroupDescribe", "StreamsGroupDescribe",
              "DescribeQuorum", "DescribeTopicPartitions", "ListConfigResources", "DescribeShareGroupOffsets",
              "AlterShareGroupOffsets", "DeleteShareGroupOffsets", "AddRaftVoter", "RemoveRaftVoter",
              "UnregisterBroker"),
    # what only brokers and controllers send each other
    "broker": ("LeaderAndIsr", "StopReplica", "UpdateMetadata", "ControlledShutdown", "WriteTxnMarkers", "Vote",
               "BeginQuorumEpoch", "EndQuorumEpoch", "AlterPartition", "Envelope", "FetchSnapshot",
               "BrokerRegistration", "BrokerHeartbeat", "AllocateProducerIds", "ControllerRegistration",
               "AssignReplicasToDirs", "UpdateRaftVoter", "InitializeShareGroupState", "ReadShareGroupState",
               "WriteShareGroupState", "DeleteShareGroupState", "ReadShareGroupStateSummary"),
}
_KEY_OF = {spec.name: key for key, spec in API_TABLE.items()}
ROLE_OF_API: dict[int, str] = {_KEY_OF[name]: role for role, names in _ROLE_APIS.items()
                               for name in names if name in _KEY_OF}


def valid_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None and name not in (".", "..")


def valid_id(topic_id: str) -> bool:
    return _ID.fullmatch(topic_id) is not None


def topic_key(topic: str | None, topic_id: str | None) -> str | None:
    """The key of a usage entry's topic: its name when the frame gave one, else its id behind
    ID_PREFIX; None when it gave neither or an invalid one."""
    if topic is not None:
        return topic if valid_name(topic) else None
    if topic_id is not None and valid_id(topic_id):
        return ID_PREFIX + topic_id
    return None


def split_key(key: str, names: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(topic, topic_id) of a key: an id is named when `names` (topic id -> name) maps it now."""
    if key.startswith(ID_PREFIX):
        topic_id = key[1:]
        return names.get(topic_id), topic_id
    return key, None


def key_label(key: str, names: Mapping[str, str]) -> str:
    """The topic a key stands for, as one string: its name, else its id (metric labels, client rows)."""
    if key.startswith(ID_PREFIX):
        return names.get(key[1:]) or key[1:]
    return key


def wanted_keys(value: str, names: Mapping[str, str]) -> frozenset[str]:
    """The keys a `topic=` filter matches: the name itself and the ids mapped to it; a value that
    is an id, the id and (when the map names it) its topic's name and ids: an id no answer named
    yet is accepted as the topic's name."""
    named = names.get(value, value)
    keys = {value, ID_PREFIX + value, named}
    keys.update(ID_PREFIX + topic_id for topic_id, name in names.items() if name == named)
    return frozenset(keys)


def connection_roles(api_keys: Iterable[int], uses: Iterable[str]) -> list[str]:
    """The roles of a connection, sorted: what its API keys (`request_key` pairs' keys) and its
    topic uses say. A connection that sent only ApiVersions and Metadata has none."""
    roles = {ROLE_OF_API.get(key) for key in api_keys}
    roles.update(ROLE_OF_USE.get(use) for use in uses)
    return sorted(role for role in roles if role is not None)


def topic_roles(uses: Iterable[str]) -> set[str]:
    """A client's roles towards one topic, from its uses of it: "producer" (produce, txn),
    "consumer" (fetch, offset_commit, offset_fetch, subscribe, list_offsets), "admin" (create,
    delete), "other" (replicate, or only metadata)."""
    out = set()
    asked = False
    for use in uses:
        role = ROLE_OF_USE.get(use)
        if role is None:
            asked = True
        elif role == "broker":
            out.add("other")
        else:
            out.add(role)
    if asked and not out:
        out.add("other")
    return out


# The uses each list of a Topic counts (a client in "other" for metadata only counts its metadata).
ROLE_USES = {"producer": frozenset(("produce", "txn")),
             "consumer": frozenset(("fetch", "offset_commit", "offset_fetch", "subscribe", "list_offsets")),
             "admin": frozenset(("create", "delete")), "other": frozenset(("replicate", "metadata"))}
