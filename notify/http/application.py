"""Assembles the broker's aiohttp application from its route modules and starts it.

Kept apart from :mod:`notify.http.server` (lifecycle, auth, errors, helpers) because every
route module imports that one; this module sits above all of them.
"""

from __future__ import annotations

import socket

from aiohttp import web

from notify.http import api, metaq, metrics
from notify.http.host import BrokerHost
from notify.http.server import ASSETS, SERVER, HttpServer, errors_and_auth

__all__ = ["build_app", "start_http"]


def build_app(server: HttpServer) -> web.Application:
    """The application serving ``server``'s broker: dashboard assets, MetaQ's HTTP protocol,
    the REST face and ``/metrics``."""
    app = web.Application(
        middlewares=[errors_and_auth],
        client_max_size=server.broker.config.system.http.max_body_size,
    )
    app[SERVER] = server

    async def asset(request: web.Request) -> web.Response:
        server = request.app[SERVER]
        token = request.query.get("token") if server.broker.config.system.auth_secret else None
        return server.asset(request.path, token)

    for path in ASSETS:
        app.router.add_get(path, asset)
    metaq.add_routes(app)
    api.add_routes(app)
    registry = metrics.add_routes(app, server.broker, lambda: server.connections_refused)
    server.on_close.append(registry.close)
    return app


async def start_http(
    broker: BrokerHost, port: int | None = None, sock: socket.socket | None = None
) -> HttpServer:
    """Start serving HTTP for ``broker`` on ``port`` (default ``dashboardHttpPort``), or on
    ``sock``, already bound and listening (the broker takes its ports before anything)."""
    server = HttpServer(broker)
    await server.start(
        build_app(server),
        broker.config.system.dashboard_http_port if port is None else port,
        sock,
    )
    return server
