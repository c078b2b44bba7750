"""MetaQ 1.4's HTTP protocol (its Jetty ``MetamorphosisOnJettyProcessor``) and ``/stats``.

The HTTP status is the wire reply's code and the body the wire reply's body, so a MetaQ HTTP
client (``SimpleHttpProducer`` / ``SimpleHttpConsumer``) works unchanged::

    POST /put/<brokerId>?topic=T&partition=P&flag=F[&checksum=C][&length=N]   body = payload
         200 "<msgId> <partition> <offset>"; 400/403/404/500 with the error text
    GET  /get/<brokerId>?topic=T&group=G&partition=P&offset=O&maxsize=M
         200 raw records (the wire's ``value`` body, possibly ending mid-record);
         404 no message at that offset yet; 301 body = the offset to use instead
    GET  /offset/<brokerId>?topic=T&group=G&partition=P&offset=O
         200 body = the nearest valid offset (start of the segment holding O)
    GET  /stats[/<item>][?format=json]
         200 "STATS\\r\\n<key> <value>\\r\\n...END\\r\\n", as the wire ``stats``

``<brokerId>`` only routes through an HTTP load balancer (MetaQ ignores it; so do we, and
it may be left out). ``maxSize`` is accepted for ``maxsize``; ``maxWait=<ms>`` (notify
extension, as the 8-token wire get) holds a get until a message arrives. Where MetaQ answers
a malformed number with a 500 stack trace, notify answers 400 naming the parameter; a body
longer than ``maxMessageSize`` gets 413 as soon as that many bytes arrived (chunked too),
and the connection is closed. Internal topics (``__delay``) are refused (403), and ``get``
honours ``acceptSubscribe`` like the wire. ``stats reset`` changes state, so it is
``POST /stats/reset`` (an admin route).
"""

from __future__ import annotations

from aiohttp import web

from notify.config import RESERVED_PREFIX
from notify.http.bridge import call_one
from notify.http.params import INT32, group_name, int_param, topic_name
from notify.http.server import ADMIN_ROUTE, SERVER, json_response, read_body
from notify.protocol.frames import Get, Offset, Put, Response, Stats
from notify.protocol.replies import parse_stats_dict

#: The group ``/offset`` reports when the caller names none.
DEFAULT_GROUP = "http"


def _reply(r: Response, binary: bool = False) -> web.Response:
    if binary and r.kind == "value":
        return web.Response(status=200, body=r.body, content_type="application/octet-stream")
    return web.Response(status=r.code, body=r.body, content_type="text/plain", charset="utf-8")


def _client_topic(value: str | None) -> str:
    topic = topic_name(value)
    if topic.startswith(RESERVED_PREFIX):
        raise web.HTTPForbidden(text=f"topic {topic!r} is internal to the broker")
    return topic


async def put(request: web.Request) -> web.Response:
    server = request.app[SERVER]
    service = server.service
    q = request.query
    topic = _client_topic(q.get("topic"))
    partition = int_param(q, "partition", lo=0, hi=INT32[1])
    flag = int_param(q, "flag", 0, *INT32)
    checksum = int_param(q, "checksum", -1, *INT32)
    declared = q.get("length")
    body = await read_body(request, service.max_message, "message (maxMessageSize)")
    if declared not in (None, "") and int_param(q, "length", lo=0) != len(body):
        raise web.HTTPBadRequest(text=f"length={declared} but the body has {len(body)} bytes")
    reply = await call_one(service, Put(topic, partition, flag, checksum, None, 1, body))
    return _reply(reply)


async def get(request: web.Request) -> web.Response:
    service = request.app[SERVER].service
    q = request.query
    req = Get(
        _client_topic(q.get("topic")),
        group_name(q.get("group")),
        int_param(q, "partition", lo=0, hi=INT32[1]),
        int_param(q, "offset"),
        int_param(q, "maxsize", aliases=("maxSize",), lo=INT32[0], hi=INT32[1]),
        1,
        int_param(q, "maxWait", 0, 0, service.config.system.max_long_poll_wait_ms),
    )
    timeout = req.max_wait_ms / 1000.0 + 30.0
    return _reply(await call_one(service, req, timeout), binary=True)


async def offset(request: web.Request) -> web.Response:
    service = request.app[SERVER].service
    q = request.query
    req = Offset(
        _client_topic(q.get("topic")),
        group_name(q.get("group"), DEFAULT_GROUP),
        int_param(q, "partition", lo=0, hi=INT32[1]),
        int_param(q, "offset"),
        1,
    )
    return _reply(await call_one(service, req))


async def stats(request: web.Request) -> web.Response:
    service = request.app[SERVER].service
    item = request.match_info.get("item", "reset" if request.method == "POST" else "")
    if item == "reset" and request.method != "POST":
        raise web.HTTPMethodNotAllowed(
            request.method, ["POST"], text="stats reset changes state: POST /stats/reset"
        )
    reply = await call_one(service, Stats(item or None, 1))
    if request.query.get("format") == "json":
        if reply.code != 200:
            return json_response({"error": reply.body.decode("utf-8", "replace")}, reply.code)
        return json_response(parse_stats_dict(reply.body))
    return _reply(reply)


def add_routes(app: web.Application) -> None:
    r = app.router
    for name, handler, methods in (
        ("put", put, ("POST", "PUT")),
        ("get", get, ("GET",)),
        ("offset", offset, ("GET",)),
    ):
        for path in (f"/{name}", f"/{name}/{{broker_id}}"):
            for method in methods:
                r.add_route(method, path, handler)
    r.add_get("/stats", stats)
    r.add_post("/stats/reset", stats, name=ADMIN_ROUTE + "stats-reset")
    r.add_get("/stats/{item}", stats)
