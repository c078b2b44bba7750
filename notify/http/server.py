"""The HTTP server of a broker: an aiohttp application on the broker's own event loop.

Started by :meth:`Broker.start` when ``[system] dashboardHttpPort`` is non-zero (0 turns it
off), on the same ``hostName`` as the wire port, and closed first by :meth:`Broker.stop`.

Endpoints (see :mod:`notify.http.openapi` for the REST face)::

    /                       dashboard (static page polling /api/overview)
    /put/<brokerId>         MetaQ HTTP put      /get/<brokerId>     MetaQ HTTP get
    /offset/<brokerId>      MetaQ HTTP offset   /stats[/<item>]     the wire's stats
    /metrics                Prometheus          /api/...            JSON REST face

Auth: when ``[system] authSecret`` is set every request needs ``Authorization: Bearer
<secret>`` or ``?token=<secret>`` (compared in constant time), ``/metrics`` and the
dashboard included; the dashboard passes on the ``token`` of its own URL. With
``adminSecret`` set, the admin routes (topic creation, retention, reload, transaction
resolution, ``stats reset``) need it; every other route takes either secret.

Cross-site and DNS-rebinding defences (a browser on any web page can reach a loopback port):
the ``Host`` header must name this broker (``hostName``, ``localhost``, an IP literal, or one
of ``httpAllowedHosts``); a request with an ``Origin`` other than the one it is addressed to
is refused; state-changing requests need ``Content-Type: application/json`` (a browser sends
that cross-site only after a CORS preflight, which this server never approves), except
MetaQ's raw-body ``/put``. Limits: ``httpMaxConnections`` open connections (beyond: 503 and
close), ``httpKeepaliveTimeout`` for an idle connection or one still sending its headers,
``httpBodyTimeout`` to send a body, bodies read with their cap checked as they arrive, and a
connection whose request body was not read to its end is closed after the error reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import html
import ipaddress
import json
import logging
import socket
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Final, cast

from aiohttp import web

from notify.broker.authlog import record_auth_failure
from notify.broker.tlsaccept import TlsAccept
from notify.http.views import History

if TYPE_CHECKING:
    from notify.broker.service import BrokerService
    from notify.http.host import BrokerHost

log = logging.getLogger("notify.http")

SAMPLE_EVERY_S: Final = 1.0
SHUTDOWN_TIMEOUT_S: Final = 2.0
#: Largest request body accepted (a JSON batch of base64 payloads); bigger gets 413.
ASSETS: Final = {
    "/": ("index.html", "text/html"),
    "/dashboard.js": ("dashboard.js", "application/javascript"),
    "/dashboard.css": ("dashboard.css", "text/css"),
    "/favicon.svg": ("favicon.svg", "image/svg+xml"),
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Route names starting with this need ``adminSecret`` (when set).
ADMIN_ROUTE: Final = "admin-"
_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
#: Routes that take a raw (non-JSON) body from non-browser clients: MetaQ's HTTP put.
_RAW_BODY_PREFIX: Final = "/put"
_BUSY_REPLY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: 58\r\n\r\n"
    b'{"error":"too many HTTP connections (httpMaxConnections)"}'
)
assert len(_BUSY_REPLY.split(b"\r\n\r\n", 1)[1]) == 58


class _Busy(asyncio.Protocol):
    """Answers a connection over ``httpMaxConnections`` with 503 and closes it at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tr = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        tr.write(_BUSY_REPLY)
        tr.close()


class _CappedSite(web.BaseSite):
    """A TCP site that accepts at most ``cap`` HTTP connections at once."""

    def __init__(
        self,
        runner: web.AppRunner,
        server: HttpServer,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        sock: socket.socket | None = None,
    ):
        super().__init__(runner, backlog=512)
        self._ssl = ssl_context  # the wire port's TLS settings (tlsCertFile...)
        self._sock = sock  # bound and listening already (the broker took it at start)
        self._host = host
        self._port = port
        self._http = server
        self._runner_ref = runner
        #: TLS handshakes in progress (they count toward httpMaxConnections)
        self.handshaking = 0

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    def _protocol(self) -> asyncio.BaseProtocol:
        handlers = self._runner_ref.server
        assert handlers is not None
        if len(handlers.connections) >= self._http.max_connections:
            self._http.connections_refused += 1
            return _Busy()
        return handlers()

    def tls_handshake_started(self) -> bool:
        """Admit one more TLS handshake unless connections + handshakes fill the cap."""
        handlers = self._runner_ref.server
        open_now = len(handlers.connections) if handlers is not None else 0
        if open_now + self.handshaking >= self._http.max_connections:
            self._http.connections_refused += 1
            return False
        self.handshaking += 1
        return True

    def tls_handshake_ended(self) -> None:
        self.handshaking -= 1

    def _tls_protocol(self) -> asyncio.BaseProtocol:
        assert self._ssl is not None
        return TlsAccept(
            self, self._ssl, self._protocol, self._http.handshake_timeout_s, self._http.max_hello
        )

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        factory = self._protocol if self._ssl is None else self._tls_protocol
        if self._sock is not None:
            sock, self._sock = self._sock, None
            self._server = await loop.create_server(factory, sock=sock)
            return
        self._server = await loop.create_server(
            factory, self._host, self._port, reuse_address=True, backlog=self._backlog
        )


class HttpServer:
    """The running HTTP face of one broker. ``port`` is the port actually bound."""

    def __init__(self, broker: BrokerHost):
        self.broker = broker
        self.history = History()
        self.host = broker.config.system.host_name
        self.port = 0
        self.round_robin: dict[str, int] = {}
        #: closed with the server (the ``/metrics`` routes register their collector here)
        self.on_close: list[Callable[[], None]] = []
        self._runner: web.AppRunner | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._assets: dict[str, bytes] = {}
        sysc = broker.config.system
        self.max_connections = sysc.http.max_connections
        self.body_timeout_s = sysc.http.body_timeout_ms / 1000.0
        self.handshake_timeout_s = sysc.tls.handshake_timeout_ms / 1000.0
        self.max_hello = sysc.tls.max_hello_size
        self.allowed_hosts = frozenset(
            {"localhost", sysc.host_name.lower(), *sysc.http.allowed_hosts}
        )
        self.connections_refused = 0
        #: serialises topic creation (each rewrites server.ini)
        self.admin_lock = asyncio.Lock()

    @property
    def service(self) -> BrokerService:
        """The broker's :class:`BrokerService` (set once the broker started)."""
        service = self.broker.service
        if service is None:  # pragma: no cover - the server starts after the service
            raise web.HTTPServiceUnavailable(text="broker is starting")
        return service

    async def start(
        self, app: web.Application, port: int, sock: socket.socket | None = None
    ) -> None:
        """Serve ``app`` (built by :func:`notify.http.application.build_app`) on ``port``, or
        on ``sock`` (bound and listening already)."""
        pkg = resources.files("notify.http") / "dashboard"
        for path, (name, _ctype) in ASSETS.items():
            self._assets[path] = (pkg / name).read_bytes()
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
            # closes a connection idle (or still sending its headers) for this long
            keepalive_timeout=self.broker.config.system.http.keepalive_timeout_ms / 1000.0,
            lingering_time=0,
        )
        await runner.setup()
        site = _CappedSite(runner, self, self.host, port, self.broker.tls, sock)
        try:
            await site.start()
        except BaseException:
            if sock is not None:
                sock.close()
            await runner.cleanup()
            self._closed()
            raise
        self._runner = runner
        addr = runner.addresses[0]
        self.port = int(addr[1])
        self.history.sample(self.service)
        self._sampler = asyncio.get_running_loop().create_task(
            self._sample_forever(), name="notify-http-sampler"
        )
        log.info("http: dashboard, REST and metrics on http://%s:%d/", self.host, self.port)

    async def _sample_forever(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_EVERY_S)
            self.history.sample(self.service)

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        self._closed()

    def _closed(self) -> None:
        hooks, self.on_close = self.on_close, []
        for hook in hooks:
            hook()

    def asset(self, path: str, token: str | None = None) -> web.Response:
        """A dashboard file. With auth on, the page's own links to its script, style and
        icon carry the ``token`` it was opened with (a browser sends no bearer header for
        them), so every request stays authenticated."""
        _name, ctype = ASSETS[path]
        body = self._assets[path]
        if path == "/" and token:
            q = html.escape(urllib.parse.quote(token, safe=""), quote=True)
            for name in ("dashboard.js", "dashboard.css", "favicon.svg"):
                body = body.replace(
                    b'"%s"' % name.encode(), b'"%s?token=%s"' % (name.encode(), q.encode())
                )
        return web.Response(
            body=body,
            content_type=ctype,
            headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
        )


# ---------------------------------------------------------------------- application

SERVER: Final = web.AppKey("notify_http_server", HttpServer)


def json_response(data: object, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(data, separators=(",", ":")),
        status=status,
        content_type="application/json",
    )


def _wants_json(request: web.Request) -> bool:
    return request.path.startswith("/api") or request.query.get("format") == "json"


def error_response(request: web.Request, status: int, message: str) -> web.Response:
    """An error in the form the caller expects (JSON for ``/api``, text otherwise)."""
    if _wants_json(request):
        return json_response({"error": message}, status)
    return web.Response(status=status, text=message)


def _token_of(request: web.Request) -> bytes | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    token = value.strip() if scheme.lower() == "bearer" and value.strip() else None
    if token is None:
        token = request.query.get("token")
    # header bytes that are not UTF-8 arrive surrogate-escaped: compare them as bytes
    return None if token is None else token.encode("utf-8", "surrogateescape")


def _matches(token: bytes, secret: str) -> bool:
    return bool(secret) and hmac.compare_digest(token, secret.encode())


def _host_of(value: str) -> str | None:
    try:
        name = urllib.parse.urlsplit("//" + value).hostname
    except ValueError:
        return None
    return name.rstrip(".") if name else None


def host_allowed(server: HttpServer, host_header: str | None) -> bool:
    """Whether a ``Host`` header names this broker. IP literals always do (a DNS-rebinding
    page can only send its own DNS name); names must be ``hostName``, ``localhost`` or in
    ``httpAllowedHosts`` (``*`` there turns the check off)."""
    if host_header is None:
        return True  # HTTP/1.0 without Host: not a browser
    if "*" in server.allowed_hosts:
        return True
    name = _host_of(host_header)
    if name is None:
        return False
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return name in server.allowed_hosts


def _origin_ok(request: web.Request) -> bool:
    """No ``Origin``, or the very origin the request is addressed to (scheme and Host)."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    parts = urllib.parse.urlsplit(origin)
    host = request.headers.get("Host", "")
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


def _refuse_browser(request: web.Request, server: HttpServer) -> web.Response | None:
    if not host_allowed(server, request.headers.get("Host")):
        return error_response(
            request,
            421,
            "Host header does not name this broker (add the name to httpAllowedHosts)",
        )
    if not _origin_ok(request):
        return error_response(request, 403, "cross-origin request refused")
    if (
        request.method not in _SAFE_METHODS
        and not request.path.startswith(_RAW_BODY_PREFIX)
        and request.content_type != "application/json"
    ):
        return error_response(
            request,
            415,
            f"{request.method} needs Content-Type: application/json "
            "(refused: a web page could send this cross-site)",
        )
    return None


def _unauthorized(request: web.Request, token: bytes | None, admin: bool) -> web.Response:
    which = "adminSecret" if admin else "authSecret"
    msg = f"authentication required: Authorization: Bearer <{which}> or ?token="
    status = 401
    if token is not None:
        msg = "authentication failed"
        if admin and _matches(token, request.app[SERVER].broker.config.system.auth_secret):
            msg, status = "this action needs the adminSecret", 403
        else:
            record_auth_failure(f"http {request.remote}")
    resp = error_response(request, status, msg)
    resp.headers["WWW-Authenticate"] = 'Bearer realm="notify"'
    return resp


def _check_auth(request: web.Request, server: HttpServer) -> web.Response | None:
    sysc = server.broker.config.system
    route = request.match_info.route.name or ""
    admin = route.startswith(ADMIN_ROUTE)
    token = _token_of(request)
    if admin and sysc.admin_secret:
        ok = token is not None and _matches(token, sysc.admin_secret)
    elif sysc.auth_secret:
        ok = token is not None and (
            _matches(token, sysc.auth_secret) or _matches(token, sysc.admin_secret)
        )
    else:
        ok = True
    return None if ok else _unauthorized(request, token, admin and bool(sysc.admin_secret))


def _body_unread(request: web.Request) -> bool:
    return request.body_exists and not request.content.is_eof()


@web.middleware
async def errors_and_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The application's middleware: cross-site and Host checks, auth, and errors as
    clear replies (a traceback only ever reaches the log)."""
    server = request.app[SERVER]
    resp = _refuse_browser(request, server) or _check_auth(request, server)
    if resp is None:
        try:
            return await _handled(request, handler)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            text = e.text or e.reason
            if e.status == 413 and text.startswith("Maximum request body size"):
                limit = server.broker.config.system.http.max_body_size
                text = f"request body too large (limit {limit} bytes, httpMaxBodySize)"
            resp = error_response(request, e.status, text)
    if _body_unread(request):
        resp.force_close()  # never read (or parse) what follows an unread body
    return resp


async def _handled(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        resp = await handler(request)
    except TimeoutError:
        return error_response(request, 504, "broker did not answer in time")
    except web.HTTPException:
        raise
    except Exception:
        log.exception("http: %s %s failed", request.method, request.path)
        return error_response(request, 500, "internal error (see the broker's log)")
    if resp.status >= 400 and _body_unread(request):
        resp.force_close()
    return resp


async def read_body(request: web.Request, limit: int, what: str = "request body") -> bytes:
    """The request's body, refused with 413 as soon as it exceeds ``limit`` (a chunked body
    is never buffered past it) and with 408 after ``httpBodyTimeout``."""

    def too_large(size: int) -> web.HTTPRequestEntityTooLarge:
        return web.HTTPRequestEntityTooLarge(
            max_size=limit, actual_size=size, text=f"{what} exceeds {limit} bytes"
        )

    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large(declared)
    buf = bytearray()
    try:
        async with asyncio.timeout(request.app[SERVER].body_timeout_s):
            while chunk := await request.content.readany():
                if len(buf) + len(chunk) > limit:
                    raise too_large(len(buf) + len(chunk))
                buf += chunk
    except TimeoutError:
        raise web.HTTPRequestTimeout(text=f"{what} not received in time") from None
    return bytes(buf)
