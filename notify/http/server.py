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
dashboard included; the dashboard passes on the ``token`` of its own URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import html
import json
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Final

from aiohttp import web

from notify.broker.service import MPUT_MAX_BYTES
from notify.http.views import History

if TYPE_CHECKING:
    from notify.broker.app import Broker
    from notify.broker.service import BrokerService
    from notify.http.metrics import BrokerMetrics

log = logging.getLogger("notify.http")

SAMPLE_EVERY_S: Final = 1.0
SHUTDOWN_TIMEOUT_S: Final = 2.0
#: Largest request body accepted (a JSON batch of base64 payloads); bigger gets 413.
MAX_REQUEST_BYTES: Final = 2 * MPUT_MAX_BYTES
_ASSETS: Final = {
    "/": ("index.html", "text/html"),
    "/dashboard.js": ("dashboard.js", "application/javascript"),
    "/dashboard.css": ("dashboard.css", "text/css"),
    "/favicon.svg": ("favicon.svg", "image/svg+xml"),
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HttpServer:
    """The running HTTP face of one broker. ``port`` is the port actually bound."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.history = History()
        self.host = broker.config.system.host_name
        self.port = 0
        self.round_robin: dict[str, int] = {}
        self.metrics: BrokerMetrics | None = None
        self.app = build_app(self)
        self._runner: web.AppRunner | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._assets: dict[str, bytes] = {}

    @property
    def service(self) -> BrokerService:
        """The broker's :class:`BrokerService` (set once the broker started)."""
        service = self.broker.service
        if service is None:  # pragma: no cover - the server starts after the service
            raise web.HTTPServiceUnavailable(text="broker is starting")
        return service

    async def start(self, port: int) -> None:
        pkg = resources.files("notify.http") / "dashboard"
        for path, (name, _ctype) in _ASSETS.items():
            self._assets[path] = (pkg / name).read_bytes()
        runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S
        )
        await runner.setup()
        site = web.TCPSite(
            runner,
            self.host,
            port,
            reuse_address=True,
            backlog=512,
            ssl_context=self.broker.tls,  # the wire port's TLS settings (tlsCertFile...)
        )
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            if self.metrics is not None:
                self.metrics.close()
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
        if self.metrics is not None:
            self.metrics.close()

    def asset(self, path: str, token: str | None = None) -> web.Response:
        """A dashboard file. With auth on, the page's own links to its script, style and
        icon carry the ``token`` it was opened with (a browser sends no bearer header for
        them), so every request stays authenticated."""
        _name, ctype = _ASSETS[path]
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


async def start_http(broker: Broker, port: int | None = None) -> HttpServer:
    """Start serving HTTP for ``broker`` on ``port`` (default ``dashboardHttpPort``)."""
    server = HttpServer(broker)
    await server.start(broker.config.system.dashboard_http_port if port is None else port)
    return server


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


def _token_of(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value:
        return value.strip()
    return request.query.get("token")


@web.middleware
async def _errors_and_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    server = request.app[SERVER]
    secret = server.broker.config.system.auth_secret
    if secret:
        token = _token_of(request)
        if token is None or not hmac.compare_digest(token.encode(), secret.encode()):
            msg = "authentication required: Authorization: Bearer <authSecret> or ?token="
            if token is not None:
                msg = "authentication failed"
                log.warning("http: failed authentication from %s", request.remote)
            headers = {"WWW-Authenticate": 'Bearer realm="notify"'}
            if _wants_json(request):
                resp = json_response({"error": msg}, 401)
                resp.headers.update(headers)
                return resp
            return web.Response(status=401, text=msg, headers=headers)
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400 or not _wants_json(request) or e.content_type == "application/json":
            raise
        text = e.text or e.reason
        if e.status == 413 and text.startswith("Maximum request body size"):
            text = f"request body too large (limit {MAX_REQUEST_BYTES} bytes)"
        return json_response({"error": text}, e.status)
    except TimeoutError:
        msg = "broker did not answer in time"
        if _wants_json(request):
            return json_response({"error": msg}, 504)
        return web.Response(status=504, text=msg)


def build_app(server: HttpServer) -> web.Application:
    from notify.http import api, metaq, metrics

    app = web.Application(middlewares=[_errors_and_auth], client_max_size=MAX_REQUEST_BYTES)
    app[SERVER] = server

    async def asset(request: web.Request) -> web.Response:
        server = request.app[SERVER]
        token = request.query.get("token") if server.broker.config.system.auth_secret else None
        return server.asset(request.path, token)

    for path in _ASSETS:
        app.router.add_get(path, asset)
    metaq.add_routes(app)
    api.add_routes(app)
    metrics.add_routes(app, server)
    return app
