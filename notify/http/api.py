"""The JSON REST face (``/api/...``); its OpenAPI 3 document is :mod:`notify.http.openapi`.

Errors are ``{"error": "<text>"}`` with a 4xx/5xx status. Produce goes through
:mod:`notify.http.bridge` (the wire put path: batching, group commit, acknowledgement after
the fsync where the topic asks for it); fetch reads the partition directly and decodes the
records. Topic creation appends a ``[topic=NAME]`` section to the broker's ``server.ini``
(validated first, replaced atomically, off the event loop) and applies just that topic; it
is refused (4xx naming the limit) beyond ``maxPartitionsPerTopic`` or the file descriptors
the process can spare (``RLIMIT_NOFILE`` minus those open minus ``fdReserve``), and a failure
while opening the partitions puts the old ``server.ini`` back. Names starting with ``__``
are the broker's (refused), and ``dataPath`` cannot be set over HTTP.

Internal topics (``__delay``: messages not yet due) cannot be fetched or produced to, and a
topic with ``acceptSubscribe=false`` cannot be fetched (403), as on the wire.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from notify.broker.queues import QueueManager
from notify.config import RESERVED_PREFIX, TOPIC_KEYS, ServerConfig, check_user_topic, parse_config
from notify.core.states import TxState
from notify.errors import (
    ConfigError,
    InvalidTopicError,
    NotifyError,
    OffsetOutOfRangeError,
    ProtocolError,
    TransactionError,
    TxLogError,
)
from notify.fdbudget import spare_fds
from notify.http import openapi
from notify.http.bridge import call, call_one
from notify.http.params import INT32, bad_request, int_param, parse_int, topic_name
from notify.http.server import (
    ADMIN_ROUTE,
    SERVER,
    HttpServer,
    json_response,
    read_body,
)
from notify.http.views import (
    config_view,
    groups_view,
    overview,
    topic_view,
    topics_view,
    transactions_view,
)
from notify.protocol import records
from notify.protocol.frames import Put, Response, Transaction
from notify.protocol.keys import validate_key
from notify.protocol.replies import PutAck, XAFailure
from notify.version import __version__

log = logging.getLogger("notify.http")

DEFAULT_FETCH_BYTES: Final = 256 * 1024
DEFAULT_FETCH_LIMIT: Final = 100
ADMIN_SESSION: Final = "http-admin"
# XAException codes worth their own HTTP status
_XA_STATUS: Final = {-4: 404, -5: 400, -6: 409}


def _server(request: web.Request) -> HttpServer:
    return request.app[SERVER]


async def _json_body(request: web.Request) -> Any:
    limit = _server(request).broker.config.system.http.max_body_size
    raw = await read_body(request, limit, "JSON body (httpMaxBodySize)")
    if not raw.strip():
        raise bad_request("expected a JSON body")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"body is not valid JSON: {e}") from None
    except RecursionError:
        raise bad_request("body is not valid JSON: nested too deeply") from None


def _not_found(message: str) -> web.HTTPNotFound:
    return web.HTTPNotFound(text=message)


def _known_topic(request: web.Request) -> str:
    topic = topic_name(request.match_info["topic"])
    if topic not in _server(request).service.store.topics:
        raise _not_found(f"topic {topic!r} does not exist on this broker")
    return topic


def _user_topic(request: web.Request) -> str:
    """A known topic that clients may read and write: not one of the broker's own."""
    topic = _known_topic(request)
    if topic.startswith(RESERVED_PREFIX):
        raise web.HTTPForbidden(text=f"topic {topic!r} is internal to the broker")
    return topic


# ---------------------------------------------------------------------- read-only views


async def get_overview(request: web.Request) -> web.Response:
    server = _server(request)
    return json_response(overview(server.broker, server.history))


async def list_topics(request: web.Request) -> web.Response:
    return json_response({"topics": topics_view(_server(request).service)})


async def describe_topic(request: web.Request) -> web.Response:
    topic = _known_topic(request)
    return json_response(topic_view(_server(request).service, topic))


async def list_groups(request: web.Request) -> web.Response:
    return json_response({"groups": groups_view(_server(request).service)})


async def list_transactions(request: web.Request) -> web.Response:
    txs = transactions_view(_server(request).service)
    if request.query.get("in_doubt") in ("1", "true", "yes"):
        txs = [t for t in txs if t["in_doubt"]]
    return json_response({"transactions": txs})


async def get_config(request: web.Request) -> web.Response:
    return json_response(config_view(_server(request).broker))


async def get_openapi(request: web.Request) -> web.Response:
    return json_response(openapi.document())


async def api_index(request: web.Request) -> web.Response:
    """``GET /api``: what the REST face offers (each route with its summary) and where the
    full OpenAPI document is."""
    paths = openapi.document()["paths"]
    endpoints = [
        {
            "method": method,
            "path": path,
            "summary": paths.get(path, {}).get(method.lower(), {}).get("summary", ""),
            "admin": handler in ADMIN_HANDLERS,
        }
        for method, path, handler in routes()
    ]
    return json_response(
        {"service": "notify", "version": __version__, "openapi": "/api/openapi.json",
         "endpoints": endpoints}
    )


# ---------------------------------------------------------------------- produce / fetch


def _message(m: object, i: int, limit: int) -> tuple[bytes, int, object]:
    """``(payload, flag, partition or None)`` of one message of a produce request."""
    if not isinstance(m, dict):
        raise bad_request(f"message {i}: expected an object")
    unknown = set(m) - {"text", "base64", "attribute", "partition"}
    if unknown:
        raise bad_request(f"message {i}: unknown field(s) {', '.join(sorted(unknown))}")
    if ("text" in m) == ("base64" in m):
        raise bad_request(f"message {i}: give exactly one of 'text' or 'base64'")
    if "text" in m:
        if not isinstance(m["text"], str):
            raise bad_request(f"message {i}: 'text' must be a string")
        body = m["text"].encode("utf-8")
    else:
        if not isinstance(m["base64"], str):
            raise bad_request(f"message {i}: 'base64' must be a string")
        try:
            body = base64.b64decode(m["base64"], validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(f"message {i}: 'base64' is not valid base64") from None
    attribute = m.get("attribute")
    if attribute is not None and not isinstance(attribute, str):
        raise bad_request(f"message {i}: 'attribute' must be a string")
    payload, flag = records.make_payload(body, attribute)
    if len(payload) > limit:
        raise web.HTTPRequestEntityTooLarge(
            max_size=limit,
            actual_size=len(payload),
            text=f"message {i}: {len(payload)} bytes exceeds maxMessageSize {limit}",
        )
    return payload, flag, m.get("partition")


async def produce(request: web.Request) -> web.Response:
    server = _server(request)
    service = server.service
    topic = _user_topic(request)
    data = await _json_body(request)
    default_partition: object = None
    if isinstance(data, list):
        msgs = data
    elif isinstance(data, dict) and "messages" in data:
        msgs = data["messages"]
        default_partition = data.get("partition")
        if not isinstance(msgs, list):
            raise bad_request("'messages' must be a list")
    elif isinstance(data, dict):
        msgs = [data]
    else:
        raise bad_request("expected a message object, a list of them or {'messages': [...]}")
    most = service.config.system.http.max_produce_messages
    if not 1 <= len(msgs) <= most:
        raise bad_request(f"between 1 and {most} messages per request (httpMaxProduceMessages)")
    nparts = len(service.store.topic_partitions(topic))
    reqs: list[Put] = []
    for i, m in enumerate(msgs):
        payload, flag, part = _message(m, i, service.max_message)
        if part is None:
            part = default_partition
        if part is None:
            rr = server.round_robin.get(topic, 0)
            server.round_robin[topic] = rr + 1
            pidx = rr % nparts
        else:
            pidx = parse_int(part, f"message {i}: partition", 0, INT32[1])
        reqs.append(Put(topic, pidx, flag, -1, None, i + 1, payload))
    replies = await call(service, list(reqs))
    results: list[dict[str, Any]] = []
    failed: Response | None = None
    for req in reqs:
        r = replies[req.opaque]
        if r.code == 200:
            ack = PutAck.parse(r.body)
            results.append(
                {"id": str(ack.msg_id), "partition": ack.partition, "offset": ack.offset}
            )
        else:
            failed = failed or r
            text = r.body.decode("utf-8", "replace")
            results.append({"partition": req.partition, "code": r.code, "error": text})
    if failed is None:
        return json_response({"topic": topic, "results": results})
    return json_response(
        {"topic": topic, "error": failed.body.decode("utf-8", "replace"), "results": results},
        failed.code,
    )


def _message_json(rec: records.Record) -> dict[str, Any]:
    try:
        attribute, body = records.split_payload(rec.payload, rec.flag)
    except (ValueError, UnicodeDecodeError):
        attribute, body = None, rec.payload
    out: dict[str, Any] = {
        "offset": rec.offset,
        "id": str(rec.msg_id),
        "flag": rec.flag,
        "attribute": attribute,
        "size": rec.size,
        "base64": base64.b64encode(body).decode(),
    }
    try:
        out["text"] = body.decode("utf-8")
    except UnicodeDecodeError:
        out["text"] = None
    return out


async def fetch(request: web.Request) -> web.Response:
    service = _server(request).service
    topic = _user_topic(request)
    if not service.store.topics[topic].accept_subscribe:
        raise web.HTTPForbidden(text=f"topic {topic!r} does not accept subscribe")
    index = parse_int(request.match_info["partition"], "partition", 0, INT32[1])
    part = service.store.get(topic, index)
    if part is None:
        raise _not_found(f"partition {index} of topic {topic!r} does not exist")
    q = request.query
    offset = int_param(q, "offset", part.min_offset)
    sysc = service.config.system
    cap = sysc.http.max_fetch_size
    max_bytes = int_param(q, "maxSize", min(DEFAULT_FETCH_BYTES, cap), 1, cap)
    most = sysc.http.max_fetch_messages
    limit = int_param(q, "limit", min(DEFAULT_FETCH_LIMIT, most), 1, most)
    try:
        sl = part.slice(offset, max_bytes, max(max_bytes, service.max_message + 20))
    except OffsetOutOfRangeError as e:
        return json_response({"error": str(e), "nearest_offset": e.nearest}, 416)
    data = b"" if sl is None else sl.segment.read(sl.file_pos, sl.length)
    try:
        recs, _used = records.decode_all(data, offset)
    except records.CorruptRecordError:
        raise bad_request(f"offset {offset} is not the start of a record") from None
    if data and not recs:  # the window was widened to hold any whole record
        raise bad_request(f"offset {offset} is not the start of a record")
    recs = recs[:limit]
    next_offset = recs[-1].offset + recs[-1].size if recs else offset
    return json_response(
        {
            "topic": topic,
            "partition": index,
            "offset": offset,
            "next_offset": next_offset,
            "min_offset": part.min_offset,
            "max_offset": part.visible_end,
            "messages": [_message_json(r) for r in recs],
        }
    )


# ---------------------------------------------------------------------- admin actions


def _ini_value(key: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str) and not any(c in value for c in "\r\n\x00[]"):
        return value.strip()
    raise bad_request(f"invalid value for {key}: {str(value)[:40]!r}")


def _write_atomic(path: os.PathLike[str], text: str) -> None:
    target = os.fspath(path)
    tmp = target + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.chmod(tmp, os.stat(target).st_mode & 0o7777)
    os.replace(tmp, target)
    dfd = os.open(os.path.dirname(target) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _prepare_ini(src: Path, section: list[str]) -> tuple[str, ServerConfig]:
    """Off the event loop: append ``section`` to ``server.ini``, check it, write it."""
    old = src.read_text(encoding="utf-8")
    new = old.rstrip("\n") + "\n\n" + "\n".join(section) + "\n"
    cfg = parse_config(new, src)
    _write_atomic(src, new)
    return old, cfg


async def create_topic(request: web.Request) -> web.Response:
    server = _server(request)
    broker = server.broker
    sysc = broker.config.system
    data = await _json_body(request)
    if not isinstance(data, dict):
        raise bad_request("expected {'name': ..., 'numPartitions': ..., 'config': {...}}")
    unknown = set(data) - {"name", "numPartitions", "config"}
    if unknown:
        raise bad_request(f"unknown field(s) {', '.join(sorted(unknown))}")
    name = topic_name(data.get("name") if isinstance(data.get("name"), str) else None)
    try:
        check_user_topic(name)
    except InvalidTopicError as e:
        raise bad_request(str(e)) from None
    settings = data.get("config") or {}
    if not isinstance(settings, dict):
        raise bad_request("'config' must be an object of [topic=NAME] keys")
    if "numPartitions" in data:
        settings = {**settings, "numPartitions": data["numPartitions"]}
    for key in settings:
        if key not in TOPIC_KEYS:
            raise bad_request(f"unknown topic key {key!r} (known: {', '.join(TOPIC_KEYS)})")
    if "dataPath" in settings:
        raise bad_request("dataPath cannot be set over HTTP (edit server.ini on the broker)")
    nparts = sysc.num_partitions
    if "numPartitions" in settings:
        nparts = parse_int(settings["numPartitions"], "numPartitions", 1)
        if nparts > sysc.max_partitions_per_topic:
            raise bad_request(
                f"numPartitions {nparts} exceeds maxPartitionsPerTopic "
                f"{sysc.max_partitions_per_topic}"
            )
    if settings.get("store", "disk") != "memory":
        spare, how = spare_fds(sysc.fd_reserve)
        if nparts > spare:
            return json_response(
                {
                    "error": f"numPartitions {nparts} needs {nparts} file descriptors and "
                    f"this broker can spare {max(spare, 0)} ({how})",
                },
                422,
            )
    section = [f"[topic={name}]"] + [f"{k}={_ini_value(k, v)}" for k, v in settings.items()]
    loop = asyncio.get_running_loop()
    async with server.admin_lock:
        if name in broker.config.topics or name in broker.store.topics:
            return json_response({"error": f"topic {name!r} already exists"}, 409)
        src = broker.config.source
        if src is None:
            return json_response({"error": "this broker was not started from a config file"}, 409)
        try:
            old, cfg = await loop.run_in_executor(None, _prepare_ini, src, section)
        except ConfigError as e:
            raise bad_request(str(e)) from None
        except OSError as e:
            return json_response({"error": f"cannot update {src}: {e.strerror or e}"}, 500)
        try:
            summary = broker.reload(cfg)
        except (NotifyError, OSError) as e:
            if name not in broker.config.topics:  # opened half-way: forget it again
                broker.store.discard_topic(name)
                server.service.refresh_topics()
            await loop.run_in_executor(None, _write_atomic, src, old)
            log.error("http: creating topic %s failed, %s restored: %s", name, src, e)
            status = 422 if isinstance(e, NotifyError) else 503
            return json_response(
                {"error": f"topic {name!r} not created ({e}); {src.name} left unchanged"},
                status,
            )
    log.info("http: created topic %s (%s)", name, summary)
    return json_response({"topic": topic_view(server.service, name), "reload": summary}, 201)


async def reload_config(request: web.Request) -> web.Response:
    try:
        summary = _server(request).broker.reload()
    except NotifyError as e:  # a rejected file (ConfigError) is the client's to fix: 422
        status = 422 if isinstance(e, ConfigError) else 500
        return json_response({"error": f"reload failed, config unchanged: {e}"}, status)
    return json_response({"summary": summary})


async def run_retention(request: web.Request) -> web.Response:
    server = _server(request)
    topic = _user_topic(request)
    results = await server.broker.run_retention(topic)
    return json_response(
        {
            "topic": topic,
            "results": [
                {
                    "partition": r.partition,
                    "action": r.action,
                    "removed": list(r.removed),
                    "kept_for_consumers": r.kept_for_consumers,
                }
                for r in results
            ],
        }
    )


async def _resolve(request: web.Request, commit: bool) -> web.Response:
    service = _server(request).service
    try:
        key = validate_key(request.match_info["key"])
    except TransactionError as e:
        raise bad_request(str(e)) from None
    tm = service.transactions
    tx = tm.txs.get(key) if tm is not None else None
    if tx is None:
        raise _not_found(f"unknown transaction {key}")
    if tx.state is not TxState.PREPARED:
        return json_response(
            {
                "error": f"transaction {key} is {tx.state.value}: only in-doubt (PREPARED) "
                "transactions are resolved by an admin",
            },
            409,
        )
    ttype = "COMMIT_TWO_PHASE" if commit else "ROLLBACK"
    r = await call_one(service, Transaction(key, ADMIN_SESSION, ttype, None, None, 1))
    text = r.body.decode("utf-8", "replace")
    if r.code != 200:
        status = r.code
        with contextlib.suppress(ProtocolError):
            failure = XAFailure.parse(r.body)
            if failure is not None:
                status = _XA_STATUS.get(failure.code, status)
        return json_response({"key": key, "error": text}, status)
    log.warning(
        "http: admin %s in-doubt transaction %s", "committed" if commit else "rolled back", key
    )
    return json_response(
        {"key": key, "outcome": "committed" if commit else "rolled_back", "detail": text}
    )


async def commit_transaction(request: web.Request) -> web.Response:
    return await _resolve(request, True)


async def rollback_transaction(request: web.Request) -> web.Response:
    return await _resolve(request, False)


# ---------------------------------------------------------------------- queue groups


def _queues(request: web.Request) -> QueueManager:
    q = _server(request).service.queues
    if q is None:
        raise web.HTTPServiceUnavailable(text="queues are not enabled on this broker")
    return q


def _queue_group(request: web.Request) -> tuple[QueueManager, str, str]:
    topic = _known_topic(request)
    group = request.match_info["group"]
    q = _queues(request)
    if (topic, group) not in q.groups:
        raise _not_found(f"no queue group {group!r} on topic {topic!r}")
    return q, topic, group


async def list_queue_groups(request: web.Request) -> web.Response:
    q = _queues(request)
    out = []
    for (topic, group), g in sorted(q.groups.items()):
        low = {str(p): ps.low_water for p, ps in sorted(g.core.parts.items())}
        out.append({"topic": topic, "group": group, **g.core.counts(), "low_water": low})
    return json_response({"queues": out})


def _stored_message(service: Any, topic: str, partition: int, offset: int, length: int) -> Any:
    part = service.store.get(topic, partition)
    if part is None or offset < part.min_offset:
        return None  # deleted by retention
    try:
        recs, _ = records.decode_all(part.read_raw(offset, length), offset)
    except (records.CorruptRecordError, NotifyError):
        return None
    return _message_json(recs[0]) if recs else None


async def list_queue_dead_letters(request: web.Request) -> web.Response:
    q, topic, group = _queue_group(request)
    start = int_param(request.query, "from", 0, 0, INT32[1])
    limit = int_param(request.query, "limit", DEFAULT_FETCH_LIMIT, 1, q.limits.max_dead_letters)
    total, dropped, page = q.dead_letters(topic, group, start, limit)
    service = _server(request).service
    return json_response(
        {
            "topic": topic,
            "group": group,
            "total": total,
            "dropped": dropped,
            "dead_letters": [
                {
                    "partition": d.partition,
                    "offset": d.offset,
                    "length": d.length,
                    "deliveries": d.deliveries,
                    "reason": d.reason,
                    "at_ms": d.at_ms,
                    "at": d.at_iso,
                    "message": _stored_message(service, topic, d.partition, d.offset, d.length),
                }
                for d in page
            ],
        }
    )


async def replay_queue_dead_letters(request: web.Request) -> web.Response:
    q, topic, group = _queue_group(request)
    body = await _json_body(request)
    if not isinstance(body, dict) or ("all" in body) == ("messages" in body):
        raise bad_request('expected {"all": true} or {"messages": [{"partition": P, "offset": O}]}')
    keys: list[tuple[int, int]] | None = None
    if "all" in body:
        if body["all"] is not True:
            raise bad_request('"all" must be true')
    else:
        msgs = body["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise bad_request('"messages" must be a non-empty list')
        if len(msgs) > q.limits.max_dead_letters:
            raise bad_request(f"at most {q.limits.max_dead_letters} messages per replay")
        keys = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or set(m) != {"partition", "offset"}:
                raise bad_request(f"messages[{i}]: expected {{\"partition\": P, \"offset\": O}}")
            keys.append(
                (
                    parse_int(m["partition"], f"messages[{i}].partition", 0, INT32[1]),
                    parse_int(m["offset"], f"messages[{i}].offset", 0),
                )
            )
    try:
        done, unknown = await q.replay_durable(topic, group, keys)
    except TxLogError as e:
        return json_response({"error": f"replay not durable: {e}"}, 500)
    log.warning("http: admin replayed %d dead letter(s) of queue group %s/%s", done, topic, group)
    return json_response({"topic": topic, "group": group, "replayed": done, "unknown": unknown})


async def delete_queue_group(request: web.Request) -> web.Response:
    q, topic, group = _queue_group(request)
    raw = request.query.get("force", "false")
    if raw not in ("true", "false"):
        raise bad_request("force: true or false")
    try:
        code, text = await q.delete_durable(topic, group, raw == "true")
    except TxLogError as e:
        return json_response({"error": f"deletion not durable: {e}"}, 500)
    if code != 200:
        return json_response({"error": text}, code)
    log.warning("http: admin deleted queue group %s/%s", topic, group)
    return json_response({"topic": topic, "group": group, "deleted": True})


def routes() -> list[tuple[str, str, Any]]:
    """``(method, path, handler)`` of the REST face (the OpenAPI test checks them)."""
    return [
        ("GET", "/api", api_index),
        ("GET", "/api/overview", get_overview),
        ("GET", "/api/topics", list_topics),
        ("POST", "/api/topics", create_topic),
        ("GET", "/api/topics/{topic}", describe_topic),
        ("POST", "/api/topics/{topic}/messages", produce),
        ("GET", "/api/topics/{topic}/partitions/{partition}/messages", fetch),
        ("POST", "/api/topics/{topic}/retention", run_retention),
        ("GET", "/api/groups", list_groups),
        ("GET", "/api/transactions", list_transactions),
        ("POST", "/api/transactions/{key}/commit", commit_transaction),
        ("POST", "/api/transactions/{key}/rollback", rollback_transaction),
        ("GET", "/api/queues", list_queue_groups),
        ("DELETE", "/api/queues/{topic}/{group}", delete_queue_group),
        ("GET", "/api/queues/{topic}/{group}/dead-letters", list_queue_dead_letters),
        ("POST", "/api/queues/{topic}/{group}/dead-letters/replay", replay_queue_dead_letters),
        ("GET", "/api/config", get_config),
        ("POST", "/api/config/reload", reload_config),
        ("GET", "/api/openapi.json", get_openapi),
    ]


#: Handlers that need ``adminSecret`` when it is set.
ADMIN_HANDLERS: Final = frozenset(
    {
        create_topic,
        reload_config,
        run_retention,
        commit_transaction,
        rollback_transaction,
        list_queue_dead_letters,
        replay_queue_dead_letters,
        delete_queue_group,
    }
)


def add_routes(app: web.Application) -> None:
    for method, path, handler in routes():
        name = None
        if handler in ADMIN_HANDLERS:
            name = ADMIN_ROUTE + handler.__name__.replace("_", "-")
        app.router.add_route(method, path, handler, name=name)
