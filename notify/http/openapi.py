"""The OpenAPI 3.0 document of the REST face, served at ``/api/openapi.json``.

Kept next to the handlers' route table (:func:`notify.http.api.routes`); a test checks that
every route is described and every described path is routed.
"""

from __future__ import annotations

from typing import Any

from notify.version import __version__

JSON = dict[str, Any]


def _ref(name: str) -> JSON:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: JSON, description: str) -> JSON:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> JSON:
    return _json(_ref("Error"), description)


_TOPIC = {
    "name": "topic",
    "in": "path",
    "required": True,
    "description": "Topic name: [A-Za-z0-9._-]{1,249}",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,249}$"},
}
_KEY = {
    "name": "key",
    "in": "path",
    "required": True,
    "description": "Transaction key: TX:<session>:<seq> or XID:<fmt>:<gtrid>:<bqual>:<uq>",
    "schema": {"type": "string"},
}
_QGROUP = {
    "name": "group",
    "in": "path",
    "required": True,
    "description": "Queue group name: [A-Za-z0-9._-]{1,249}",
    "schema": {"type": "string"},
}
_COMMON_ERRORS = {
    "400": _error("Malformed request (names the bad parameter)"),
    "401": _error("authSecret is set and no valid bearer token was given"),
    "403": _error(
        "A foreign Origin, an internal topic, or an admin route called without adminSecret"
    ),
    "415": _error("A state-changing request without Content-Type: application/json"),
    "421": _error("The Host header does not name this broker (httpAllowedHosts)"),
}


_INT64 = {"type": "integer", "format": "int64"}


def _queue_schemas() -> JSON:
    """Schemas of the queue groups' dead letters and their replay."""
    integer = _INT64
    position = {
        "type": "object",
        "required": ["partition", "offset"],
        "properties": {"partition": {"type": "integer"}, "offset": integer},
    }
    return {
        "DeadLetters": {
            "type": "object",
            "properties": {
                "topic": {"type": "string"},
                "group": {"type": "string"},
                "total": {"type": "integer"},
                "dropped": {"type": "integer", "description": "older entries dropped at "
                            "queueMaxDeadLetters"},
                "dead_letters": {"type": "array", "items": {"type": "object", "properties": {
                    "partition": {"type": "integer"},
                    "offset": integer,
                    "length": {"type": "integer"},
                    "deliveries": {"type": "integer"},
                    "reason": {"type": "string", "enum": ["rejected", "max_deliveries"]},
                    "at_ms": {**integer, "description": "when it became a dead letter: "
                              "wall-clock ms since the Unix epoch"},
                    "at": {"type": "string", "format": "date-time", "nullable": True,
                           "description": "at_ms in ISO 8601 (UTC); null for an entry "
                           "recorded before dead letters kept a wall-clock time"},
                    "message": {"type": "object", "nullable": True},
                }}},
            },
        },
        "Replay": {
            "type": "object",
            "description": '{"all": true} or {"messages": [...]}, not both',
            "properties": {
                "all": {"type": "boolean", "enum": [True]},
                "messages": {"type": "array", "items": position, "minItems": 1},
            },
        },
    }


def _topic_schemas() -> JSON:
    """Schemas of errors, topics and their partitions."""
    integer = _INT64
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": {"type": "string"}},
        },
        "Partition": {
            "type": "object",
            "properties": {
                "partition": {"type": "integer"},
                "min_offset": integer,
                "max_offset": {**integer, "description": "visible end (consumers see up to)"},
                "end_offset": {**integer, "description": "bytes written"},
                "flushed_offset": {**integer, "description": "bytes known fsynced"},
                "size_bytes": integer,
                "unflushed_bytes": integer,
                "segments": {"type": "integer"},
                "failed": {"type": "string", "nullable": True},
            },
        },
        "Topic": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "num_partitions": {"type": "integer"},
                "size_bytes": integer,
                "accept_publish": {"type": "boolean"},
                "accept_subscribe": {"type": "boolean"},
                "put_messages": integer,
                "put_bytes": integer,
                "put_failed": integer,
                "get_requests": integer,
                "get_misses": integer,
                "get_bytes": integer,
                "groups": {"type": "array", "items": {"type": "string"}},
                "partitions": {"type": "array", "items": _ref("Partition")},
                "config": {"type": "object", "additionalProperties": True},
            },
        },
        "NewTopic": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,249}$"},
                "numPartitions": {"type": "integer", "minimum": 1, "maximum": 65536},
                "config": {
                    "type": "object",
                    "description": "Other [topic=NAME] keys of server.ini (unflushThreshold, "
                    "deletePolicy, deleteWhen, acceptPublish, ...)",
                    "additionalProperties": {
                        "oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}]
                    },
                },
            },
        },
    }


def _message_schemas() -> JSON:
    """Schemas of produced and fetched messages."""
    integer = _INT64
    return {
        "OutMessage": {
            "type": "object",
            "description": "Exactly one of text (UTF-8) or base64.",
            "properties": {
                "text": {"type": "string"},
                "base64": {"type": "string", "format": "byte"},
                "attribute": {"type": "string"},
                "partition": {
                    "type": "integer",
                    "description": "Omit for round robin over the topic's partitions",
                },
            },
        },
        "ProduceRequest": {
            "oneOf": [
                _ref("OutMessage"),
                {"type": "array", "items": _ref("OutMessage"), "maxItems": 1000},
                {
                    "type": "object",
                    "required": ["messages"],
                    "properties": {
                        "partition": {"type": "integer"},
                        "messages": {
                            "type": "array",
                            "items": _ref("OutMessage"),
                            "minItems": 1,
                            "maxItems": 1000,
                        },
                    },
                },
            ]
        },
        "PutResult": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "description": "64-bit message id, decimal"},
                "partition": {"type": "integer"},
                "offset": integer,
                "code": {"type": "integer", "description": "wire reply code, on failure"},
                "error": {"type": "string"},
            },
        },
        "ProduceResult": {
            "type": "object",
            "properties": {
                "topic": {"type": "string"},
                "error": {"type": "string", "description": "first failure, if any"},
                "results": {"type": "array", "items": _ref("PutResult")},
            },
        },
        "Message": {
            "type": "object",
            "properties": {
                "offset": integer,
                "id": {"type": "string"},
                "flag": {"type": "integer"},
                "attribute": {"type": "string", "nullable": True},
                "size": {"type": "integer", "description": "record bytes, header included"},
                "base64": {"type": "string", "format": "byte"},
                "text": {"type": "string", "nullable": True, "description": "when UTF-8"},
            },
        },
        "FetchResult": {
            "type": "object",
            "properties": {
                "topic": {"type": "string"},
                "partition": {"type": "integer"},
                "offset": integer,
                "next_offset": integer,
                "min_offset": integer,
                "max_offset": integer,
                "messages": {"type": "array", "items": _ref("Message")},
            },
        },
    }


def _group_tx_schemas() -> JSON:
    """Schemas of consumer groups and transactions."""
    integer = _INT64
    return {
        "Group": {
            "type": "object",
            "properties": {
                "group": {"type": "string"},
                "topic": {"type": "string"},
                "partition": {"type": "integer"},
                "offset": {**integer, "description": "offset of the group's last fetch"},
                "max_offset": integer,
                "lag_bytes": integer,
                "lag_messages": {
                    **integer,
                    "nullable": True,
                    "description": "messages behind (counted from 1 MiB of records, then "
                    "extrapolated: see lag_messages_exact)",
                },
                "lag_messages_exact": {"type": "boolean"},
                "idle_seconds": {"type": "number"},
                "live": {
                    "type": "boolean",
                    "description": "fetched within consumerSessionTimeout",
                },
            },
        },
        "Transaction": {
            "type": "object",
            "properties": {
                "key": {"type": "string"},
                "xa": {"type": "boolean"},
                "state": {
                    "type": "string",
                    "enum": [
                        "ACTIVE",
                        "ENDED",
                        "PREPARED",
                        "COMMITTING",
                        "COMMITTED",
                        "ROLLED_BACK",
                        "HEURISTIC_COMMITTED",
                        "HEURISTIC_ROLLED_BACK",
                        "FORGOTTEN",
                    ],
                },
                "in_doubt": {"type": "boolean", "description": "PREPARED: awaiting a decision"},
                "messages": {"type": "integer"},
                "bytes": integer,
                "created_ms": integer,
                "age_seconds": {"type": "number"},
                "timeout_seconds": {"type": "integer"},
                "producer_group": {"type": "string"},
                "prepared_at_ms": {**integer, "nullable": True},
                "check_backs": {"type": "integer"},
                "apply_error": {"type": "string", "nullable": True},
                "connection": {"type": "string", "nullable": True},
            },
        },
        "Resolution": {
            "type": "object",
            "properties": {
                "key": {"type": "string"},
                "outcome": {"type": "string", "enum": ["committed", "rolled_back"]},
                "detail": {"type": "string"},
            },
        },
    }


def _admin_schemas() -> JSON:
    """Schemas of retention, configuration and the overview."""
    return {
        "RetentionResult": {
            "type": "object",
            "properties": {
                "topic": {"type": "string"},
                "results": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "partition": {"type": "integer"},
                            "action": {"type": "string", "enum": ["delete", "archive"]},
                            "removed": {"type": "array", "items": {"type": "string"}},
                            "kept_for_consumers": {"type": "integer"},
                        },
                    },
                },
            },
        },
        "Config": {
            "type": "object",
            "properties": {
                "source": {"type": "string", "nullable": True},
                "system": {"type": "object", "additionalProperties": True},
                "zookeeper": {"type": "object", "additionalProperties": True},
                "topics": {"type": "object", "additionalProperties": {"type": "object"}},
            },
        },
        "Overview": {
            "type": "object",
            "description": "Everything the dashboard shows",
            "properties": {
                "system": {"type": "object", "additionalProperties": True},
                "rates": {
                    "type": "array",
                    "description": "per-second rates, oldest first",
                    "items": {
                        "type": "object",
                        "properties": {
                            "t": {"type": "number"},
                            "put_tps": {"type": "number"},
                            "get_tps": {"type": "number"},
                            "put_bps": {"type": "number"},
                            "get_bps": {"type": "number"},
                            "fsync_ps": {"type": "number"},
                        },
                    },
                },
                "topics": {"type": "array", "items": _ref("Topic")},
                "groups": {"type": "array", "items": _ref("Group")},
                "transactions": {"type": "array", "items": _ref("Transaction")},
                "in_doubt": {"type": "integer"},
                "config": _ref("Config"),
            },
        },
    }


def _schemas() -> JSON:
    return {
        **_queue_schemas(),
        **_topic_schemas(),
        **_message_schemas(),
        **_group_tx_schemas(),
        **_admin_schemas(),
    }


def _list_of(key: str, items: str) -> JSON:
    return {"type": "object", "properties": {key: {"type": "array", "items": _ref(items)}}}


def _index_paths() -> JSON:
    """The index and the overview."""
    return {
        "/api": {
            "get": {
                "summary": "This index: every route with its summary, and this document's path",
                "operationId": "index",
                "responses": {"200": {"description": "Index of the REST API"}},
            }
        },
        "/api/overview": {
            "get": {
                "summary": "Everything the dashboard shows (system, rates, topics, groups, "
                "transactions, config)",
                "operationId": "overview",
                "responses": {"200": _json(_ref("Overview"), "Broker overview")},
            }
        },
    }


def _topic_paths() -> JSON:
    """Topics, their messages and retention."""
    return {
        "/api/topics": {
            "get": {
                "summary": "Topics with their partitions, sizes and offsets",
                "operationId": "listTopics",
                "responses": {"200": _json(_list_of("topics", "Topic"), "Topics")},
            },
            "post": {
                "summary": "Create a topic: appends [topic=NAME] to server.ini and reloads",
                "operationId": "createTopic",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("NewTopic")}},
                },
                "responses": {
                    "201": _json(
                        {
                            "type": "object",
                            "properties": {"topic": _ref("Topic"), "reload": {"type": "string"}},
                        },
                        "Created",
                    ),
                    **_COMMON_ERRORS,
                    "409": _error("Topic exists, or the broker has no config file"),
                },
            },
        },
        "/api/topics/{topic}": {
            "parameters": [_TOPIC],
            "get": {
                "summary": "One topic",
                "operationId": "describeTopic",
                "responses": {
                    "200": _json(_ref("Topic"), "Topic"),
                    **_COMMON_ERRORS,
                    "404": _error("No such topic"),
                },
            },
        },
        "/api/topics/{topic}/messages": {
            "parameters": [_TOPIC],
            "post": {
                "summary": "Produce one or many messages (the wire put path: batched, "
                "acknowledged after fsync under group commit)",
                "operationId": "produce",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("ProduceRequest")}},
                },
                "responses": {
                    "200": _json(_ref("ProduceResult"), "All stored"),
                    **_COMMON_ERRORS,
                    "403": _json(_ref("ProduceResult"), "Topic does not accept publish"),
                    "404": _json(_ref("ProduceResult"), "No such topic or partition"),
                    "413": _error("Body or a message too large (maxMessageSize)"),
                    "500": _json(_ref("ProduceResult"), "Some messages failed (see results)"),
                },
            },
        },
        "/api/topics/{topic}/partitions/{partition}/messages": {
            "parameters": [
                _TOPIC,
                {
                    "name": "partition",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 0},
                },
            ],
            "get": {
                "summary": "Fetch decoded messages (does not register a consumer group)",
                "operationId": "fetch",
                "parameters": [
                    {
                        "name": "offset",
                        "in": "query",
                        "description": "Byte offset of a record (default: first offset)",
                        "schema": {"type": "integer", "format": "int64"},
                    },
                    {
                        "name": "maxSize",
                        "in": "query",
                        "description": "Bytes to read (default 262144)",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 16777216},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "description": "Most messages to return (default 100)",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 10000},
                    },
                ],
                "responses": {
                    "200": _json(_ref("FetchResult"), "Messages (empty at the end)"),
                    **_COMMON_ERRORS,
                    "404": _error("No such topic or partition"),
                    "416": _json(
                        {
                            "type": "object",
                            "properties": {
                                "error": {"type": "string"},
                                "nearest_offset": {"type": "integer"},
                            },
                        },
                        "Offset out of range; nearest_offset is the one to use",
                    ),
                },
            },
        },
        "/api/topics/{topic}/retention": {
            "parameters": [_TOPIC],
            "post": {
                "summary": "Apply the topic's deletePolicy now",
                "operationId": "runRetention",
                "responses": {
                    "200": _json(_ref("RetentionResult"), "Segments removed or archived"),
                    **_COMMON_ERRORS,
                    "404": _error("No such topic"),
                },
            },
        },
    }


def _group_tx_paths() -> JSON:
    """Consumer groups and transactions."""
    return {
        "/api/groups": {
            "get": {
                "summary": "Consumer groups seen fetching, with lag per partition",
                "operationId": "listGroups",
                "responses": {"200": _json(_list_of("groups", "Group"), "Groups")},
            }
        },
        "/api/transactions": {
            "get": {
                "summary": "Transactions in flight and in doubt (PREPARED)",
                "operationId": "listTransactions",
                "parameters": [
                    {
                        "name": "in_doubt",
                        "in": "query",
                        "description": "Only PREPARED transactions",
                        "schema": {"type": "boolean"},
                    }
                ],
                "responses": {
                    "200": _json(_list_of("transactions", "Transaction"), "Transactions")
                },
            }
        },
        "/api/transactions/{key}/commit": {
            "parameters": [_KEY],
            "post": {
                "summary": "Commit an in-doubt (PREPARED) transaction",
                "operationId": "commitTransaction",
                "responses": {
                    "200": _json(_ref("Resolution"), "Committed"),
                    **_COMMON_ERRORS,
                    "404": _error("Unknown transaction"),
                    "409": _error("Not PREPARED"),
                },
            },
        },
        "/api/transactions/{key}/rollback": {
            "parameters": [_KEY],
            "post": {
                "summary": "Roll back an in-doubt (PREPARED) transaction",
                "operationId": "rollbackTransaction",
                "responses": {
                    "200": _json(_ref("Resolution"), "Rolled back"),
                    **_COMMON_ERRORS,
                    "404": _error("Unknown transaction"),
                    "409": _error("Not PREPARED"),
                },
            },
        },
    }


def _queue_paths() -> JSON:
    """Queue groups and their dead letters."""
    return {
        "/api/queues": {
            "get": {
                "summary": "Queue groups with their figures (consumers, acquired, available, "
                "dead letters, delivered, redelivered) and low-water offsets",
                "operationId": "listQueueGroups",
                "responses": {
                    "200": _json({"type": "object", "properties": {"queues": {
                        "type": "array", "items": {"type": "object"}}}}, "Queue groups"),
                    "503": _error("Queues are not enabled on this broker"),
                },
            }
        },
        "/api/queues/{topic}/{group}": {
            "parameters": [_TOPIC, _QGROUP],
            "delete": {
                "summary": "Delete a queue group and its state (positions, dead letters; "
                "logged before the answer); admin",
                "operationId": "deleteQueueGroup",
                "parameters": [
                    {"name": "force", "in": "query", "description": "true: also when it "
                     "has consumers (their connections are closed)",
                     "schema": {"type": "boolean"}},
                ],
                "responses": {
                    "200": _json({"type": "object", "properties": {
                        "topic": {"type": "string"}, "group": {"type": "string"},
                        "deleted": {"type": "boolean"}}}, "Deleted"),
                    **_COMMON_ERRORS,
                    "404": _error("No such topic or queue group"),
                    "409": _error("The group has consumers (force=true closes them)"),
                },
            },
        },
        "/api/queues/{topic}/{group}/dead-letters": {
            "parameters": [_TOPIC, _QGROUP],
            "get": {
                "summary": "A queue group's dead letters, oldest first, with the stored "
                "message (null once retention deleted it); admin",
                "operationId": "listQueueDeadLetters",
                "parameters": [
                    {"name": "from", "in": "query", "description": "Entries to skip",
                     "schema": {"type": "integer", "minimum": 0}},
                    {"name": "limit", "in": "query",
                     "description": "Most entries (default 100, at most queueMaxDeadLetters)",
                     "schema": {"type": "integer", "minimum": 1}},
                ],
                "responses": {
                    "200": _json(_ref("DeadLetters"), "Dead letters"),
                    **_COMMON_ERRORS,
                    "404": _error("No such topic or queue group"),
                },
            },
        },
        "/api/queues/{topic}/{group}/dead-letters/replay": {
            "parameters": [_TOPIC, _QGROUP],
            "post": {
                "summary": "Make dead letters available to the group again (delivery count "
                "from 0; logged before the answer); admin",
                "operationId": "replayQueueDeadLetters",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("Replay")}},
                },
                "responses": {
                    "200": _json({"type": "object", "properties": {
                        "replayed": {"type": "integer"},
                        "unknown": {"type": "integer", "description": "not dead letters of "
                                    "the group, or no longer in the store"}}}, "Replayed"),
                    **_COMMON_ERRORS,
                    "404": _error("No such topic or queue group"),
                },
            },
        },
    }


def _config_paths() -> JSON:
    """Configuration and this document."""
    return {
        "/api/config": {
            "get": {
                "summary": "The running configuration (authSecret masked)",
                "operationId": "getConfig",
                "responses": {"200": _json(_ref("Config"), "Config")},
            }
        },
        "/api/config/reload": {
            "post": {
                "summary": "Re-read server.ini (new topics, per-topic settings)",
                "operationId": "reloadConfig",
                "responses": {
                    "200": _json(
                        {"type": "object", "properties": {"summary": {"type": "string"}}},
                        "Reloaded",
                    ),
                    "422": _error(
                        "server.ini rejected (the error names the file, line and key); "
                        "the running config is unchanged"
                    ),
                    "500": _error("Reload failed; the running config is unchanged"),
                },
            }
        },
        "/api/openapi.json": {
            "get": {
                "summary": "This document",
                "operationId": "openapi",
                "responses": {"200": {"description": "OpenAPI 3.0 document"}},
            }
        },
    }


def _paths() -> JSON:
    return {
        **_index_paths(),
        **_topic_paths(),
        **_group_tx_paths(),
        **_queue_paths(),
        **_config_paths(),
    }


def document() -> JSON:
    """The OpenAPI 3.0.3 document."""
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "notify broker REST API",
            "version": __version__,
            "description": "JSON face of a notify broker (MetaQ-compatible). MetaQ's own "
            "HTTP protocol (/put, /get, /offset), /stats and /metrics are served alongside.",
        },
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "[system] authSecret, when set (or ?token=); admin "
                    "routes need adminSecret when that is set",
                }
            },
        },
        "security": [{}, {"bearer": []}],
        "paths": _paths(),
    }
